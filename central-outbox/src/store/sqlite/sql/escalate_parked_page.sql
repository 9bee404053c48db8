-- The message of notification row ?1 parked. If it belongs to its incident's latest page, the
-- incident is still open and its policy escalates on a park, the next page is due now (?2)
-- instead of after the wait. Returns the incident.
UPDATE Incidents
SET NextDueAt = ?2
WHERE Id = (SELECT IncidentId FROM Notifications WHERE Id = ?1)
  AND PageCount = (SELECT IncidentPage FROM Notifications WHERE Id = ?1)
  AND Status = 'Open' AND EscalateOnPark = 1 AND NextDueAt > ?2
RETURNING Id
