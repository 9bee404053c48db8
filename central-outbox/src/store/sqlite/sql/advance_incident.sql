-- An incident fired page ?2 (cycle ?3, round ?4, step ?5), ?9 of them late; next due ?6: page
-- (?7, ?8), or with both NULL exhaustion. A reminder fires in Acknowledged and makes it Open.
UPDATE Incidents
SET Status = 'Open', PageCount = ?2, Cycle = ?3, Round = ?4, Step = ?5, NextDueAt = ?6,
    NextRound = ?7, NextStep = ?8, LatePages = LatePages + ?9
WHERE Id = ?1
