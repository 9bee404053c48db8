-- The changes due by ?1 whose notification has no earlier change waiting (its endpoint hears
-- them in order), oldest due first: the columns `admin::read_state` reads (status, reason and
-- time as the change recorded them), then the change's seq, whom a delivery went to, the
-- list's endpoint now, when it was queued and the calls made.
SELECT n.Id, n.NotificationId, c.Status, n.Type, n.ListName, n.Subject, n.SourceSiteId,
       n.RetryCount, c.LastError, n.SiteEnqueuedAt, n.CreatedAt, n.LastAttemptAt, NULL,
       CASE WHEN c.Status = 'Delivered' THEN n.DeliveredAt END, c.DecidedAt, n.Priority,
       n.ConditionKey, n.DeliverAfter, c.Seq,
       CASE WHEN c.Status = 'Delivered' THEN n.ResolvedTargets END,
       l.StatusCallbackUrl, c.QueuedAt, c.Calls
FROM StatusCallbacks AS c
JOIN Notifications AS n ON n.NotificationId = c.NotificationId
LEFT JOIN NotificationLists AS l ON l.Name = c.ListName
WHERE c.NextCallAt <= ?1
  AND NOT EXISTS (SELECT 1 FROM StatusCallbacks AS e
                  WHERE e.NotificationId = c.NotificationId AND e.Seq < c.Seq)
ORDER BY c.NextCallAt, c.Seq
LIMIT ?2
