-- A site's changes still to confirm, oldest first, in the columns `admin::read_state` reads
-- (status, reason and time as the change recorded them) and then the change's seq and whom a
-- delivery went to.
SELECT n.Id, n.NotificationId, f.Status, n.Type, n.ListName, n.Subject, n.SourceSiteId,
       n.RetryCount, f.LastError, n.SiteEnqueuedAt, n.CreatedAt, n.LastAttemptAt, NULL,
       CASE WHEN f.Status = 'Delivered' THEN n.DeliveredAt END, f.DecidedAt, n.Priority,
       n.ConditionKey, n.DeliverAfter, f.Seq,
       CASE WHEN f.Status = 'Delivered' THEN n.ResolvedTargets END
FROM SiteStatusFeed AS f
JOIN Notifications AS n ON n.NotificationId = f.NotificationId
WHERE f.SiteId = ?1
ORDER BY f.Seq
LIMIT ?2
