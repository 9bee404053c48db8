DECLARE @result int;
DECLARE @resource nvarchar(255) = N'central-outbox/schema-migrations/' + DB_NAME();
EXEC @result = sp_getapplock @Resource = @resource, @LockMode = N'Exclusive', @LockOwner = N'Session', @LockTimeout = @P1;
SELECT @result AS Result;
