-- An incident ends (?2: Exhausted, Cleared or Discarded) at ?3: nothing is due for it any more.
-- Only from a status that is not final; returns it if it changed.
UPDATE Incidents
SET Status = ?2, EndedAt = ?3, NextDueAt = NULL, NextRound = NULL, NextStep = NULL
WHERE Id = ?1 AND Status IN ('Open', 'Acknowledged', 'Exhausted')
RETURNING Id
