-- A claimed row (ClaimedUntil in the future) is left to its delivery. AttemptCount numbers the
-- history entry the caller then writes for each row returned.
UPDATE Notifications
SET Status = 'Cleared', ResolvedAt = ?1, NextAttemptAt = NULL,
    ClaimedUntil = NULL, ClaimEpoch = NULL, AttemptCount = AttemptCount + 1
WHERE Status IN ('Pending', 'Retrying', 'Held', 'Parked') AND ConditionKey IS NOT NULL
  AND SourceSiteId = ?2 AND ConditionKey = ?3
  AND (ClaimedUntil IS NULL OR ClaimedUntil <= ?1)
RETURNING NotificationId, AttemptCount
