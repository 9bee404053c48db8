-- The ledger of the living procedures: one row per stored procedure (or function) defined by a
-- file under procedures/, with the revision that file declares and the SHA-256 of the file the
-- migrator created it from. After the numbered migrations, under the same application lock, the
-- migrator creates again each procedure whose file differs from its row (README.md here). Empty
-- at first: on a database migrated before this file, every procedure is created again from its
-- file, the same definitions the earlier migrations left.
IF OBJECT_ID(N'dbo.SchemaProcedures', N'U') IS NULL
BEGIN
CREATE TABLE dbo.SchemaProcedures (
    Name      nvarchar(128) COLLATE Latin1_General_BIN2 NOT NULL,
    Revision  int NOT NULL,
    Sha256    binary(32) NOT NULL,
    AppliedAt datetime2(3) NOT NULL,
    CONSTRAINT PK_SchemaProcedures PRIMARY KEY CLUSTERED (Name)
);
END;
GO
