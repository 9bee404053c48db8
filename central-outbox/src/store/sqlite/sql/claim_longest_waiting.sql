-- Rule 3 of domain::serve_order: due longest first (IX_Notifications_Type_Due).
--
-- Takes up to ?4 due rows of type ?6, stamping the claim (until ?1, epoch ?2, at ?3) only while
-- epoch ?2 holds lease ?5. Every row has its due time in NextAttemptAt (its creation time when
-- stored, the retry time after a failure, the operator's time after a Retry; NULL is a row
-- stored before that rule, due now). The last column is the longest-waiting order, as RETURNING
-- gives rows in no particular order. claim_longest_waiting.sql and claim_in_turn.sql differ
-- only in their ORDER BY.
UPDATE Notifications
SET ClaimedUntil = ?1, ClaimEpoch = ?2, LastAttemptAt = ?3,
    AttemptCount = AttemptCount + 1
WHERE Id IN (
        SELECT Id FROM Notifications
        WHERE Status IN ('Pending', 'Retrying') AND Type = ?6
          AND (NextAttemptAt IS NULL OR NextAttemptAt <= ?3)
          AND (ClaimedUntil IS NULL OR ClaimedUntil <= ?3)
        ORDER BY NextAttemptAt, Id
        LIMIT ?4)
  AND EXISTS (SELECT 1 FROM Leases
              WHERE Name = ?5 AND Epoch = ?2 AND ExpiresAt > ?3)
RETURNING Id, NotificationId, Type, ListName, Subject, Body, TypeData, RetryCount,
          AttemptCount, SourceSiteId, SourceInstanceId, SourceScript,
          OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, Priority,
          ServeTurn, COALESCE(NextAttemptAt, 0), IncidentId, IncidentPage
