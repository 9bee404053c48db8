-- An alarm (?5, stored now, ?11) opens an incident under its list's policy (?8, the snapshot);
-- the alarm is page 1, and ?12 to ?14 are what is due after it.
INSERT INTO Incidents (
    ListName, SourceSiteId, ConditionKey, Priority, AlarmId, LatestId, Subject, Policy,
    EscalateOnPark, Status, OpenedAt, NextDueAt, NextRound, NextStep)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
RETURNING Id
