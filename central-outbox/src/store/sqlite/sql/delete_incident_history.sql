DELETE FROM IncidentHistory WHERE IncidentId = ?1
