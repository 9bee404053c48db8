-- An incident was due in a status with nothing to fire (a hand edit): nothing is due for it now,
-- so the clock moves on to the others.
UPDATE Incidents SET NextDueAt = NULL, NextRound = NULL, NextStep = NULL WHERE Id = ?1
