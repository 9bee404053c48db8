-- What a notice about an incident quotes: its latest notification, and its priority.
SELECT LatestId, Priority FROM Incidents WHERE Id = ?1
