-- Written with the claim: an attempt row still InFlight after its claim lapsed marks a delivery
-- that may have happened (a possible duplicate).
INSERT INTO NotificationAttempts
    (NotificationId, AttemptNo, StartedAt, Outcome, LeaseEpoch, DigestId)
VALUES (?1, ?2, ?3, 'InFlight', ?4, ?5)
