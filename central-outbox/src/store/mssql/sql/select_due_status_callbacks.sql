SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
SELECT TOP (@P1) n.Id, n.NotificationId, c.Status AS Status, n.Type, n.ListName, n.Subject, n.SourceSiteId, n.RetryCount, c.LastError AS LastError, n.SiteEnqueuedAt, n.CreatedAt, n.LastAttemptAt, CAST(NULL AS datetime2(3)) AS NextAttemptAt, CASE WHEN c.Status = N'Delivered' THEN n.DeliveredAt END AS DeliveredAt, c.DecidedAt AS ResolvedAt, n.Priority, n.ConditionKey, n.DeliverAfter, c.Seq, CASE WHEN c.Status = N'Delivered' THEN n.ResolvedTargets END AS ResolvedTargets, l.StatusCallbackUrl, c.QueuedAt, c.Calls
FROM dbo.StatusCallbacks AS c
JOIN dbo.Notifications AS n ON n.NotificationId = c.NotificationId
LEFT JOIN dbo.NotificationLists AS l ON l.Name = c.ListName
WHERE c.NextCallAt <= @now
  AND NOT EXISTS (SELECT 1 FROM dbo.StatusCallbacks AS e WHERE e.NotificationId = c.NotificationId AND e.Seq < c.Seq)
ORDER BY c.NextCallAt, c.Seq;
SELECT (SELECT MIN(w.NextCallAt) FROM dbo.StatusCallbacks AS w) AS NextDue, @now AS Now;
