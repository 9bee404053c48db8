-- The page messages of incident ?1 being delivered when it ended: the ending (?3, by ?4) is
-- applied when their attempt ends in anything but Delivered (record_outcome.sql) or their claim
-- expires (settle_pending_ends.sql).
UPDATE Notifications
SET PendingEnd = ?3, PendingEndBy = ?4
WHERE IncidentId = ?1 AND IncidentPage > 1
  AND Status IN ('Pending', 'Retrying', 'Held')
  AND ClaimedUntil > ?2
