ROLLBACK TO fire_incident
