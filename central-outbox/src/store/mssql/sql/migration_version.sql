SET XACT_ABORT ON;
SET NOCOUNT ON;
IF OBJECT_ID(N'dbo.SchemaMigrations', N'U') IS NULL
BEGIN
CREATE TABLE dbo.SchemaMigrations (
    Version   int NOT NULL,
    Name      nvarchar(128) NOT NULL,
    AppliedAt datetime2(3) NOT NULL,
    CONSTRAINT PK_SchemaMigrations PRIMARY KEY CLUSTERED (Version)
);
END;
SELECT COALESCE(MAX(m.Version), 0) AS Version FROM dbo.SchemaMigrations AS m;
