-- What the escalation clock fires now (?1): the incidents whose next page, exhaustion or
-- reminder is due, longest due first (IX_Incidents_Due).
SELECT Id, Status, Policy, ListName, LatestId, Priority, Cycle, PageCount, NextDueAt,
       NextRound, NextStep, AcknowledgedBy, AcknowledgedAt
FROM Incidents
WHERE NextDueAt IS NOT NULL AND NextDueAt <= ?1
ORDER BY NextDueAt, Id
LIMIT ?2
