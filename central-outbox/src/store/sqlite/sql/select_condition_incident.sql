-- The incident of a condition that is not final, which a keyed alarm of the same site, key and
-- list joins (UX_Incidents_Condition: there is at most one).
SELECT Id FROM Incidents
WHERE SourceSiteId = ?1 AND ConditionKey = ?2 AND ListName = ?3
  AND Status IN ('Open', 'Acknowledged', 'Exhausted')
