UPDATE NotificationAttempts SET Outcome = 'PermanentFailure', DurationMs = 0, Error = ?3
WHERE NotificationId = ?1 AND AttemptNo = ?2
