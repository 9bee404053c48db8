-- Site health at central (central's domain::site_health, as SQLite's migration 0007): the latest
-- report of each site-forwarder node, one row per (site, node), replaced by each new report.
-- Whether a node is online is not stored: it is decided at read time from ReceivedAt and
-- `site_offline_after`, both readings of the database's clock (SYSUTCDATETIME()), so every
-- replica agrees whatever its own clock says. Flags are int 0/1 (read back as every other int).
IF OBJECT_ID(N'dbo.SiteHealth', N'U') IS NULL
BEGIN
CREATE TABLE dbo.SiteHealth (
    SiteId              nvarchar(64) COLLATE Latin1_General_BIN2 NOT NULL,
    NodeName            nvarchar(64) COLLATE Latin1_General_BIN2 NOT NULL,
    Role                nvarchar(16) NOT NULL,
    BufferDepth         bigint NOT NULL,
    -- Ages and lags as the node measured them, in milliseconds.
    OldestBufferedAgeMs bigint NOT NULL,
    -- By the node's clock; NULL if it has forwarded nothing since it started.
    LastForwardAt       datetime2(3) NULL,
    StandbyLagRows      bigint NOT NULL,
    StandbyLagMs        bigint NOT NULL,
    Version             nvarchar(64) NOT NULL,
    CentralReachable    int NOT NULL,
    Rejected            bigint NOT NULL,
    SendsRefused        int NOT NULL,
    -- When central stored the report, by the database's clock.
    ReceivedAt          datetime2(3) NOT NULL,
    CONSTRAINT PK_SiteHealth PRIMARY KEY CLUSTERED (SiteId, NodeName),
    CONSTRAINT CK_SiteHealth_Role CHECK (Role IN (N'Active', N'Standby'))
);
END;
GO
