DELETE FROM dbo.SchemaProcedures WHERE Name = @P1;
INSERT INTO dbo.SchemaProcedures (Name, Revision, Sha256, AppliedAt) VALUES (@P1, @P2, @P3, SYSUTCDATETIME());
COMMIT TRANSACTION;
