DELETE FROM IncidentPages WHERE IncidentId = ?1
