SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT TOP (@P2) n.Id, n.NotificationId, f.Status AS Status, n.Type, n.ListName, n.Subject, n.SourceSiteId, n.RetryCount, f.LastError AS LastError, n.SiteEnqueuedAt, n.CreatedAt, n.LastAttemptAt, CAST(NULL AS datetime2(3)) AS NextAttemptAt, CASE WHEN f.Status = N'Delivered' THEN n.DeliveredAt END AS DeliveredAt, f.DecidedAt AS ResolvedAt, n.Priority, n.ConditionKey, n.DeliverAfter, f.Seq, CASE WHEN f.Status = N'Delivered' THEN n.ResolvedTargets END AS ResolvedTargets
FROM dbo.SiteStatusFeed AS f
JOIN dbo.Notifications AS n ON n.NotificationId = f.NotificationId
WHERE f.SiteId = @P1
ORDER BY f.Seq;
