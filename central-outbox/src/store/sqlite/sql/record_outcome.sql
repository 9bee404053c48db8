-- The fence: the row is still claimed by this attempt (epoch ?9, attempt ?11) and lease ?10 is
-- still at that epoch (even if it has lapsed: then nobody can have claimed the row again). A
-- Held row whose digest failed for now stays Held, due again at the retry time, so that it goes
-- out in the next digest of its list rather than on its own.
--
-- A row superseded or cleared while this attempt was under way (PendingEnd) ends so, now (?12),
-- unless the attempt delivered it: it is not retried or parked after the newer state or the
-- clear. Its ending is then history entry AttemptCount, which the caller writes when the
-- returned status is not the one it asked for.
UPDATE Notifications
SET Status = CASE
        WHEN PendingEnd IS NOT NULL AND ?1 <> 'Delivered' THEN PendingEnd
        WHEN Status = 'Held' AND ?1 = 'Retrying' THEN 'Held'
        ELSE ?1 END,
    RetryCount = ?2, LastError = COALESCE(?3, LastError),
    NextAttemptAt = CASE WHEN PendingEnd IS NOT NULL AND ?1 <> 'Delivered' THEN NULL ELSE ?4 END,
    DeliveredAt = COALESCE(?5, DeliveredAt),
    ResolvedAt = CASE WHEN PendingEnd IS NOT NULL AND ?1 <> 'Delivered' THEN ?12 ELSE ?6 END,
    ResolvedTargets = COALESCE(?7, ResolvedTargets),
    ClaimedUntil = NULL, ClaimEpoch = NULL,
    AttemptCount = AttemptCount
        + CASE WHEN PendingEnd IS NOT NULL AND ?1 <> 'Delivered' THEN 1 ELSE 0 END
WHERE Id = ?8 AND ClaimEpoch = ?9 AND AttemptCount = ?11
  AND EXISTS (SELECT 1 FROM Leases WHERE Name = ?10 AND Epoch = ?9)
RETURNING Status, AttemptCount, PendingEndBy
