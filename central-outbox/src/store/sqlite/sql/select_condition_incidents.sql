-- The incidents of a site's condition on every list that are not final: what the site's
-- acknowledgement or clear reaches (IX_Incidents_Site_Condition).
SELECT Id FROM Incidents
WHERE SourceSiteId = ?1 AND ConditionKey = ?2
  AND Status IN ('Open', 'Acknowledged', 'Exhausted')
ORDER BY Id
