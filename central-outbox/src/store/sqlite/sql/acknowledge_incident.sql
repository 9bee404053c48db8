-- The first acknowledgement (?3 by ?4, at ?2): the escalation stops; ?5 is the reminder's due
-- time, if the policy has one and the condition can be cleared.
UPDATE Incidents
SET Status = 'Acknowledged', AcknowledgedAt = ?2, AcknowledgedBy = ?3, AcknowledgedVia = ?4,
    NextDueAt = ?5, NextRound = NULL, NextStep = NULL, EndedAt = NULL
WHERE Id = ?1 AND Status IN ('Open', 'Exhausted')
