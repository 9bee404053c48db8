-- The incidents page, newest first: in the statuses ?1 names (',Open,Exhausted,'; '' for any),
-- only those with a late page if ?2, older than the cursor ?3 (NULL: from the newest), at most ?4.
SELECT Id, ListName, SourceSiteId, ConditionKey, Priority, AlarmId, LatestId, Subject, Status,
       OpenedAt, PageCount, Round, Step, NextDueAt, NextRound, NextStep, LatePages,
       AcknowledgedBy, AcknowledgedVia, AcknowledgedAt, EndedAt, Policy
FROM Incidents
WHERE (?1 = '' OR instr(?1, ',' || Status || ',') > 0)
  AND (?2 = 0 OR LatePages > 0)
  AND (?3 IS NULL OR Id < ?3)
ORDER BY Id DESC
LIMIT ?4
