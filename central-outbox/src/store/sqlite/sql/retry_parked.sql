-- AttemptCount numbers every history entry, so an operator's action takes the next number too.
UPDATE Notifications
SET Status = 'Pending', RetryCount = 0, NextAttemptAt = ?2, LastError = NULL,
    ResolvedAt = NULL, ClaimedUntil = NULL, ClaimEpoch = NULL,
    AttemptCount = AttemptCount + 1
WHERE NotificationId = ?1 AND Status = 'Parked'
RETURNING AttemptCount
