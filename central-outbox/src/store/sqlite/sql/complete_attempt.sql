-- Run only when record_outcome.sql applied: otherwise the attempt row stays InFlight, marking a
-- possible duplicate.
UPDATE NotificationAttempts SET Outcome = ?3, DurationMs = ?4, Error = ?5, Provider = ?6
WHERE NotificationId = ?1 AND AttemptNo = ?2
