SELECT AttemptNo, StartedAt, DurationMs, Outcome, Error, LeaseEpoch, Actor, DigestId, Provider
FROM NotificationAttempts WHERE NotificationId = ?1 ORDER BY AttemptNo
