UPDATE Notifications
SET Status = 'Parked', LastError = ?2, ResolvedAt = ?3, ClaimedUntil = NULL,
    ClaimEpoch = NULL
WHERE Id = ?1
