-- Site health at central (central's domain::site_health): the latest report of each site-forwarder
-- node, one row per (site, node), replaced by each new report. Whether a node is online is not
-- stored: it is decided at read time from ReceivedAt (this process's clock, which is the
-- database's clock for SQLite) and `site_offline_after`.
CREATE TABLE SiteHealth (
    SiteId              TEXT    NOT NULL,
    NodeName            TEXT    NOT NULL,
    Role                TEXT    NOT NULL CHECK (Role IN ('Active', 'Standby')),
    BufferDepth         INTEGER NOT NULL,
    -- Ages and lags as the node measured them, in milliseconds.
    OldestBufferedAgeMs INTEGER NOT NULL,
    -- By the node's clock, Unix milliseconds; NULL if it has forwarded nothing since it started.
    LastForwardAt       INTEGER,
    StandbyLagRows      INTEGER NOT NULL,
    StandbyLagMs        INTEGER NOT NULL,
    Version             TEXT    NOT NULL,
    CentralReachable    INTEGER NOT NULL,
    Rejected            INTEGER NOT NULL,
    SendsRefused        INTEGER NOT NULL,
    -- When central stored the report, Unix milliseconds.
    ReceivedAt          INTEGER NOT NULL,
    PRIMARY KEY (SiteId, NodeName)
) WITHOUT ROWID;
