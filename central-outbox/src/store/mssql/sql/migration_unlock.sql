EXEC sp_releaseapplock @Resource = N'central-outbox/schema-migrations', @LockOwner = N'Session';
