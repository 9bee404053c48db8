SELECT PageNo, Cycle, Round, Step, DueAt, FiredAt, LateMs, LeaseEpoch
FROM IncidentPages WHERE IncidentId = ?1 ORDER BY PageNo
