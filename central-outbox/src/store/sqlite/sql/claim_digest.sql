-- Takes up to ?4 due held rows of type ?5 and list ?6, longest due first, stamping the claim
-- (until ?1, epoch ?2, at ?3). The caller has checked the lease (check_lease.sql) in the same
-- write transaction. The columns are in the order `ClaimedRow::read` reads them.
UPDATE Notifications
SET ClaimedUntil = ?1, ClaimEpoch = ?2, LastAttemptAt = ?3,
    AttemptCount = AttemptCount + 1
WHERE Id IN (
        SELECT Id FROM Notifications
        WHERE Status = 'Held' AND Type = ?5 AND ListName = ?6
          AND NextAttemptAt <= ?3
          AND (ClaimedUntil IS NULL OR ClaimedUntil <= ?3)
        ORDER BY NextAttemptAt, Id
        LIMIT ?4)
RETURNING Id, NotificationId, Type, ListName, Subject, Body, TypeData, RetryCount,
          AttemptCount, SourceSiteId, SourceInstanceId, SourceScript,
          OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, Priority,
          ServeTurn, NextAttemptAt, IncidentId, IncidentPage
