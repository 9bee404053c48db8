SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT f.SiteId, MAX(f.Seq) AS Head
FROM dbo.SiteStatusFeed AS f
WHERE f.Seq > @P1
GROUP BY f.SiteId;
