-- One row per (site, node): the latest report replaces the one before. A new node is inserted
-- only while its site has fewer than ?14 nodes (MAX_NODES_PER_SITE); otherwise nothing changes
-- and the caller sees no row changed. One statement on the one writer: no race past the bound.
-- (`WHERE` on the SELECT also tells SQLite's parser that ON CONFLICT belongs to the INSERT.)
INSERT INTO SiteHealth (SiteId, NodeName, Role, BufferDepth, OldestBufferedAgeMs,
                        LastForwardAt, StandbyLagRows, StandbyLagMs, Version,
                        CentralReachable, Rejected, SendsRefused, ReceivedAt)
SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13
WHERE EXISTS (SELECT 1 FROM SiteHealth WHERE SiteId = ?1 AND NodeName = ?2)
   OR (SELECT COUNT(*) FROM SiteHealth WHERE SiteId = ?1) < ?14
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
