INSERT INTO IncidentHistory (IncidentId, Sequence, At, Kind, Actor, Means, FromAddress, Detail)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
