-- One incident, in the columns of select_incidents.sql.
SELECT Id, ListName, SourceSiteId, ConditionKey, Priority, AlarmId, LatestId, Subject, Status,
       OpenedAt, PageCount, Round, Step, NextDueAt, NextRound, NextStep, LatePages,
       AcknowledgedBy, AcknowledgedVia, AcknowledgedAt, EndedAt, Policy
FROM Incidents
WHERE Id = ?1
