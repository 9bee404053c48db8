SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT p.Name, p.Revision, p.Sha256, CASE WHEN OBJECT_ID(N'dbo.' + p.Name) IS NULL THEN 0 ELSE 1 END AS Present
FROM dbo.SchemaProcedures AS p;
