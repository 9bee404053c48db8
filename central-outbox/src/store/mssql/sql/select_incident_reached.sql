SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
SELECT DISTINCT n.ListName
FROM dbo.Notifications AS n
WHERE n.IncidentId = @P1 AND (n.Status = N'Delivered' OR n.ClaimedUntil > @now)
ORDER BY n.ListName;
SELECT n.NotificationId, n.Type, n.Subject, n.Body, n.TypeData, n.SourceSiteId,
    n.SourceInstanceId, n.SourceScript, n.OriginExecutionId, n.OriginParentExecutionId,
    n.SiteEnqueuedAt
FROM dbo.Notifications AS n
JOIN dbo.Incidents AS i ON i.LatestId = n.NotificationId
WHERE i.Id = @P1;
SELECT l.Name, l.Type
FROM dbo.NotificationLists AS l
WHERE l.Name IN (
    SELECT n.ListName FROM dbo.Notifications AS n
    WHERE n.IncidentId = @P1 AND (n.Status = N'Delivered' OR n.ClaimedUntil > @now));
