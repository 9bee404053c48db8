SELECT AttemptNo, StartedAt, DurationMs, Outcome, Error, LeaseEpoch, Actor, DigestId
FROM NotificationAttempts WHERE NotificationId = ?1 ORDER BY AttemptNo
