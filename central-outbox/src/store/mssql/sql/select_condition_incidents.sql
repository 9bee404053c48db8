SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT i.Id
FROM dbo.Incidents AS i
WHERE i.ConditionKey IS NOT NULL AND i.SourceSiteId = @P1 AND i.ConditionKey = @P2
  AND i.Status IN (N'Open', N'Acknowledged', N'Exhausted')
ORDER BY i.Id;
