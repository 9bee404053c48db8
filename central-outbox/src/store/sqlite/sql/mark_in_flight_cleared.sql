-- The rows clear_condition.sql leaves to their delivery (claimed: ClaimedUntil in the future):
-- their clear by ?4 is recorded and applied when their attempt ends in anything but Delivered
-- (record_outcome.sql) or their claim expires (settle_pending_ends.sql).
UPDATE Notifications
SET PendingEnd = 'Cleared', PendingEndBy = ?4
WHERE Status IN ('Pending', 'Retrying', 'Held') AND ConditionKey IS NOT NULL
  AND SourceSiteId = ?2 AND ConditionKey = ?3
  AND ClaimedUntil > ?1
