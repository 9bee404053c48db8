-- The fence: the row is still claimed by this attempt (epoch ?9, attempt ?11) and lease ?10 is
-- still at that epoch (even if it has lapsed: then nobody can have claimed the row again). A
-- Held row whose digest failed for now stays Held, due again at the retry time, so that it goes
-- out in the next digest of its list rather than on its own.
UPDATE Notifications
SET Status = CASE WHEN Status = 'Held' AND ?1 = 'Retrying' THEN 'Held' ELSE ?1 END,
    RetryCount = ?2, LastError = COALESCE(?3, LastError),
    NextAttemptAt = ?4, DeliveredAt = COALESCE(?5, DeliveredAt), ResolvedAt = ?6,
    ResolvedTargets = COALESCE(?7, ResolvedTargets),
    ClaimedUntil = NULL, ClaimEpoch = NULL
WHERE Id = ?8 AND ClaimEpoch = ?9 AND AttemptCount = ?11
  AND EXISTS (SELECT 1 FROM Leases WHERE Name = ?10 AND Epoch = ?9)
