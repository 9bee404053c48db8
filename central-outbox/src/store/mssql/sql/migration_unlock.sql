DECLARE @resource nvarchar(255) = N'central-outbox/schema-migrations/' + DB_NAME();
EXEC sp_releaseapplock @Resource = @resource, @LockOwner = N'Session';
