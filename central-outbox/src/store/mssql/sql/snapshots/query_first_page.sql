SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT TOP (@P1) n.Id, n.NotificationId, n.Status, n.Type, n.ListName, n.Subject, n.SourceSiteId, n.RetryCount, n.LastError, n.SiteEnqueuedAt, n.CreatedAt, n.LastAttemptAt, n.NextAttemptAt, n.DeliveredAt, n.ResolvedAt, n.Priority, n.ConditionKey, n.DeliverAfter
FROM dbo.Notifications AS n
WHERE 1 = 1
ORDER BY n.CreatedAt DESC, n.Id DESC;
