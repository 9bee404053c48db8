INSERT INTO dbo.SchemaMigrations (Version, Name, AppliedAt) VALUES (@P1, @P2, SYSUTCDATETIME());
COMMIT TRANSACTION;
