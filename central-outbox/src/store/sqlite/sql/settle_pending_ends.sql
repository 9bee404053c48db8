-- Rows superseded or cleared while claimed whose claim expired without an outcome (the node
-- delivering them died): they end as recorded, now (?1), before a claim could deliver them
-- again. AttemptCount numbers the history entry the caller writes.
--
-- Every claim runs this first, so it must cost nothing when no such row exists: the partial
-- index IX_Notifications_PendingEnd holds only rows with a pending ending, almost always none.
-- It is named because SQLite's planner, without statistics, prefers the equality on Status of
-- IX_Notifications_Status_Resolved, which visits every waiting row: with 100,000 rows waiting
-- that was a quarter of central's CPU during a dispatch, and the claims slowed with the backlog.
UPDATE Notifications INDEXED BY IX_Notifications_PendingEnd
SET Status = PendingEnd, ResolvedAt = ?1, NextAttemptAt = NULL,
    ClaimedUntil = NULL, ClaimEpoch = NULL, AttemptCount = AttemptCount + 1
WHERE PendingEnd IS NOT NULL AND Status IN ('Pending', 'Retrying', 'Held')
  AND ClaimedUntil <= ?1
RETURNING NotificationId, AttemptCount, PendingEnd, PendingEndBy
