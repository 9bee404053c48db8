SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @cutoff datetime2(3) = DATEADD(millisecond, -@P2, DATEADD(second, -@P1, SYSUTCDATETIME()));
DECLARE @changes int;
DELETE FROM dbo.SiteStatusFeed
WHERE Seq IN (SELECT TOP (@P3) f.Seq FROM dbo.SiteStatusFeed AS f WHERE f.DecidedAt < @cutoff ORDER BY f.Seq);
SET @changes = @@ROWCOUNT;
DELETE FROM dbo.SiteStatusWatchers
WHERE SiteId IN (SELECT TOP (@P3) w.SiteId FROM dbo.SiteStatusWatchers AS w WHERE w.WatchedAt < @cutoff);
SELECT @changes AS Changes, @@ROWCOUNT AS Watchers;
