-- A history entry that is not a delivery attempt (an operator's action, a supersede, a clear):
-- no lease epoch, and Actor says who or what wrote it.
INSERT INTO NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
VALUES (?1, ?2, ?3, ?4, ?5)
