-- One row per (site, node): the latest report replaces the one before.
INSERT INTO SiteHealth (SiteId, NodeName, Role, BufferDepth, OldestBufferedAgeMs,
                        LastForwardAt, StandbyLagRows, StandbyLagMs, Version,
                        CentralReachable, Rejected, SendsRefused, ReceivedAt)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
ON CONFLICT (SiteId, NodeName) DO UPDATE SET
    Role = excluded.Role,
    BufferDepth = excluded.BufferDepth,
    OldestBufferedAgeMs = excluded.OldestBufferedAgeMs,
    LastForwardAt = excluded.LastForwardAt,
    StandbyLagRows = excluded.StandbyLagRows,
    StandbyLagMs = excluded.StandbyLagMs,
    Version = excluded.Version,
    CentralReachable = excluded.CentralReachable,
    Rejected = excluded.Rejected,
    SendsRefused = excluded.SendsRefused,
    ReceivedAt = excluded.ReceivedAt
