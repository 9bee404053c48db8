-- A newer notification of the incident's condition joined it: later pages quote it.
UPDATE Incidents SET LatestId = ?2, Subject = ?3 WHERE Id = ?1
