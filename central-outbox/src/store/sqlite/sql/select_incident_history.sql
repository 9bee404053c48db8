SELECT Sequence, At, Kind, Actor, Means, FromAddress, Detail
FROM IncidentHistory WHERE IncidentId = ?1 ORDER BY Sequence
