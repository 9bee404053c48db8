SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT COUNT_BIG(*) AS Matching FROM (
SELECT TOP (@P1) n.Id
FROM dbo.Notifications AS n
WHERE 1 = 1
  AND n.Status IN (@P2)
  AND n.SourceSiteId = @P3
) AS m;
