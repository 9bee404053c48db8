-- Numbers the incident's next history row.
UPDATE Incidents SET HistoryCount = HistoryCount + 1 WHERE Id = ?1 RETURNING HistoryCount
