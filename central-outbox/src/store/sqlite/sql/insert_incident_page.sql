-- A page an incident fired. The key (incident, cycle, round, step) refuses a second write of the
-- same page, whichever node tries.
INSERT INTO IncidentPages (
    IncidentId, Cycle, Round, Step, PageNo, DueAt, FiredAt, LateMs, LeaseEpoch)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
