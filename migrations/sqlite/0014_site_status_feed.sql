-- Final statuses back to the sites (issue 36): every final status a notification of a watching
-- site reaches is recorded here, in the same transaction that sets it, until the site confirms
-- it stored it (NotificationIngest.WatchSiteStatus; central's grpc::site_status).
--
-- The triggers, not the statements that end a notification, write the feed: a notification
-- reaches a final status on a dozen paths (an attempt's outcome, a supersede, a clear, an
-- operator's discard, an acknowledgement, ingest of a row the site cleared...), and a trigger
-- makes it impossible for one of them, or the next one added, to forget its site.

-- The sites that watch, since their first WatchSiteStatus. Only their notifications are fed,
-- so a central nobody watches writes nothing extra. A watch not renewed for the retention
-- (`site_status_keep`) is dropped by the purge, with what it had not taken.
CREATE TABLE SiteStatusWatchers (
    SiteId        TEXT    PRIMARY KEY,
    WatchedAt     INTEGER NOT NULL
) WITHOUT ROWID;

-- One row per final status still to reach its site. Seq orders a site's changes: a later change
-- of the same notification always has a higher one (its row is locked by the earlier change's
-- transaction until that commits). The status, its time and its reason are copied as they were
-- then; what does not change (list, subject...) is read from the notification when it is sent.
CREATE TABLE SiteStatusFeed (
    Seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    SiteId         TEXT    NOT NULL,
    NotificationId TEXT    NOT NULL,
    Status         TEXT    NOT NULL,
    DecidedAt      INTEGER NOT NULL,
    LastError      TEXT
);
CREATE INDEX IX_SiteStatusFeed_Site ON SiteStatusFeed (SiteId, Seq);
-- No index on DecidedAt: every change is written and deleted on the dispatch path, and the
-- daily purge that looks for old ones scans a table that holds only unconfirmed changes.

-- A row that reaches a final status, or changes from one to another (Parked, then Discarded).
CREATE TRIGGER TR_Notifications_FinalStatus AFTER UPDATE OF Status ON Notifications
WHEN NEW.Status IN ('Delivered', 'Parked', 'Discarded', 'Superseded', 'Cleared', 'Acknowledged')
     AND NEW.Status <> OLD.Status
BEGIN
    INSERT INTO SiteStatusFeed (SiteId, NotificationId, Status, DecidedAt, LastError)
    SELECT NEW.SourceSiteId, NEW.NotificationId, NEW.Status,
           COALESCE(NEW.ResolvedAt, NEW.CreatedAt), NEW.LastError
    WHERE EXISTS (SELECT 1 FROM SiteStatusWatchers WHERE SiteId = NEW.SourceSiteId);
END;

-- A row stored final (one the site cleared before forwarding it).
CREATE TRIGGER TR_Notifications_StoredFinal AFTER INSERT ON Notifications
WHEN NEW.Status IN ('Delivered', 'Parked', 'Discarded', 'Superseded', 'Cleared', 'Acknowledged')
BEGIN
    INSERT INTO SiteStatusFeed (SiteId, NotificationId, Status, DecidedAt, LastError)
    SELECT NEW.SourceSiteId, NEW.NotificationId, NEW.Status,
           COALESCE(NEW.ResolvedAt, NEW.CreatedAt), NEW.LastError
    WHERE EXISTS (SELECT 1 FROM SiteStatusWatchers WHERE SiteId = NEW.SourceSiteId);
END;
