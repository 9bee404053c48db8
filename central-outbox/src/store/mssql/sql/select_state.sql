SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT n.Id, n.NotificationId, n.Status, n.Type, n.ListName, n.Subject, n.SourceSiteId, n.RetryCount, n.LastError, n.SiteEnqueuedAt, n.CreatedAt, n.LastAttemptAt, n.NextAttemptAt, n.DeliveredAt, n.ResolvedAt, n.Priority, n.ConditionKey, n.DeliverAfter
FROM dbo.Notifications AS n
WHERE n.NotificationId = @P1;
