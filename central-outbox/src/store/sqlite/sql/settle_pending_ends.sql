-- Rows superseded or cleared while claimed whose claim expired without an outcome (the node
-- delivering them died): they end as recorded, now (?1), before a claim could deliver them
-- again (IX_Notifications_PendingEnd). AttemptCount numbers the history entry the caller writes.
UPDATE Notifications
SET Status = PendingEnd, ResolvedAt = ?1, NextAttemptAt = NULL,
    ClaimedUntil = NULL, ClaimEpoch = NULL, AttemptCount = AttemptCount + 1
WHERE PendingEnd IS NOT NULL AND Status IN ('Pending', 'Retrying', 'Held')
  AND ClaimedUntil <= ?1
RETURNING NotificationId, AttemptCount, PendingEnd, PendingEndBy
