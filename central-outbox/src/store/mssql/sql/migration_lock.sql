DECLARE @result int;
EXEC @result = sp_getapplock @Resource = N'central-outbox/schema-migrations', @LockMode = N'Exclusive', @LockOwner = N'Session', @LockTimeout = @P1;
SELECT @result AS Result;
