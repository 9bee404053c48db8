-- The rows supersede_older.sql leaves to their delivery (claimed: ClaimedUntil in the future):
-- their supersede by ?6 is recorded and applied when their attempt ends in anything but
-- Delivered (record_outcome.sql) or their claim expires (settle_pending_ends.sql).
UPDATE Notifications
SET PendingEnd = 'Superseded', PendingEndBy = ?6
WHERE Status IN ('Pending', 'Retrying', 'Held') AND ConditionKey IS NOT NULL
  AND SourceSiteId = ?2 AND ConditionKey = ?3 AND ListName = ?4
  AND SiteEnqueuedAt <= ?5 AND NotificationId <> ?6
  AND ClaimedUntil > ?1
