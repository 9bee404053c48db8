-- Final statuses back to the sites (issue 36), the schema of SQLite's migration 0014: the sites
-- that watch their notifications' final statuses (NotificationIngest.WatchSiteStatus), and each
-- final status still to reach its site. The trigger that writes the feed, in the transaction
-- that sets the status, is a living file (procedures/RecordSiteStatusChanges.sql), created
-- after this migration.

IF OBJECT_ID(N'dbo.SiteStatusWatchers', N'U') IS NULL
BEGIN
CREATE TABLE dbo.SiteStatusWatchers (
    SiteId    nvarchar(64) COLLATE Latin1_General_BIN2 NOT NULL,
    -- When the site last opened its watch or confirmed a change, by the database's clock; the
    -- purge drops a watch not renewed for `site_status_keep`.
    WatchedAt datetime2(3) NOT NULL,
    CONSTRAINT PK_SiteStatusWatchers PRIMARY KEY CLUSTERED (SiteId)
);
END;
GO

-- Seq orders a site's changes: a later change of the same notification always has a higher
-- one, since the earlier change's transaction holds the notification's row until it commits.
-- Changes of different notifications may commit out of Seq order; the stream reads every
-- unconfirmed change each time (never "after the last seq sent"), so none is passed over.
IF OBJECT_ID(N'dbo.SiteStatusFeed', N'U') IS NULL
BEGIN
CREATE TABLE dbo.SiteStatusFeed (
    Seq            bigint IDENTITY(1, 1) NOT NULL,
    SiteId         nvarchar(64) COLLATE Latin1_General_BIN2 NOT NULL,
    NotificationId uniqueidentifier NOT NULL,
    Status         nvarchar(16) COLLATE Latin1_General_BIN2 NOT NULL,
    DecidedAt      datetime2(3) NOT NULL,
    LastError      nvarchar(max) NULL,
    CONSTRAINT PK_SiteStatusFeed PRIMARY KEY CLUSTERED (Seq)
);
END;
GO
DROP INDEX IF EXISTS IX_SiteStatusFeed_Site ON dbo.SiteStatusFeed;
GO
IF INDEXPROPERTY(OBJECT_ID(N'dbo.SiteStatusFeed'), N'IX_SiteStatusFeed_Site', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_SiteStatusFeed_Site ON dbo.SiteStatusFeed (SiteId, Seq);
END;
GO
-- No index on DecidedAt, as on SQLite: the purge scans the unconfirmed changes.
