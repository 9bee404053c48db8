DELETE FROM Incidents WHERE Id = ?1
