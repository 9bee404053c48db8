-- The page messages of incident ?1 not handed to the relay (waiting and not claimed) end as ?3
-- (Acknowledged, Cleared or Discarded) at ?2; the claimed ones are left to mark_incident_pages.
-- AttemptCount numbers the history entry the caller writes for each row returned.
UPDATE Notifications
SET Status = ?3, ResolvedAt = ?2, NextAttemptAt = NULL,
    ClaimedUntil = NULL, ClaimEpoch = NULL, AttemptCount = AttemptCount + 1
WHERE IncidentId = ?1 AND IncidentPage > 1
  AND Status IN ('Pending', 'Retrying', 'Held')
  AND (ClaimedUntil IS NULL OR ClaimedUntil <= ?2)
RETURNING NotificationId, AttemptCount
