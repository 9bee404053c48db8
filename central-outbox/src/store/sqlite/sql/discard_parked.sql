-- AttemptCount numbers every history entry, so an operator's action takes the next number too.
UPDATE Notifications
SET Status = 'Discarded', ResolvedAt = ?2, ClaimedUntil = NULL, ClaimEpoch = NULL,
    AttemptCount = AttemptCount + 1
WHERE NotificationId = ?1 AND Status = 'Parked'
RETURNING AttemptCount
