-- Status callbacks (issue 36, part 2): a list may name an HTTPS endpoint of an IT system that
-- receives every final status of the list's notifications as a signed POST (central's
-- status_callbacks). The call never changes the notification; each one is recorded on its
-- history (StatusCallbackCalls).

-- The endpoint, read when a call is made, so an edit applies to the calls still waiting; NULL:
-- the list has none.
ALTER TABLE NotificationLists ADD COLUMN StatusCallbackUrl TEXT;

-- One row per final status still to be told to its list's endpoint, written by the triggers
-- below in the transaction that set the status (so no path that ends a notification can forget
-- it), and deleted once the endpoint answered or the calls were given up. Seq orders the changes
-- of one notification; a change is called only once every earlier one of its notification is
-- done. NextCallAt: when it is due (the queueing time, then each retry's).
CREATE TABLE StatusCallbacks (
    Seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    NotificationId TEXT    NOT NULL,
    ListName       TEXT    NOT NULL,
    Status         TEXT    NOT NULL,
    DecidedAt      INTEGER NOT NULL,
    LastError      TEXT,
    QueuedAt       INTEGER NOT NULL,
    Calls          INTEGER NOT NULL DEFAULT 0,
    NextCallAt     INTEGER NOT NULL
);
-- The due scan, and a change's earlier ones.
CREATE INDEX IX_StatusCallbacks_Due ON StatusCallbacks (NextCallAt, Seq);
CREATE INDEX IX_StatusCallbacks_Notification ON StatusCallbacks (NotificationId, Seq);

-- The audit of every call, read with the notification's history and purged with it. Outcome:
-- 'Answered' (2xx), 'Failed' (retried later), 'GivenUp' (the last call of a change that was
-- never answered). Endpoint is `scheme://host:port`, never the path or query (it may hold a
-- token).
CREATE TABLE StatusCallbackCalls (
    NotificationId TEXT    NOT NULL,
    CallNo         INTEGER NOT NULL,
    CalledAt       INTEGER NOT NULL,
    DurationMs     INTEGER,
    Status         TEXT    NOT NULL,
    Outcome        TEXT    NOT NULL,
    Error          TEXT,
    Endpoint       TEXT,
    PRIMARY KEY (NotificationId, CallNo)
) WITHOUT ROWID;

-- The triggers of 0014 are replaced by one per event that records both a site status change and
-- a status callback: each trigger a row fires costs the writer a few microseconds on every final
-- status, whether or not it records anything, and the dispatcher's outcome writes wait on that
-- writer. A list without an endpoint costs one key lookup, an unwatched site another.
DROP TRIGGER TR_Notifications_FinalStatus;
DROP TRIGGER TR_Notifications_StoredFinal;

-- A row that reaches a final status, or changes from one to another (Parked, then Discarded).
CREATE TRIGGER TR_Notifications_FinalStatus AFTER UPDATE OF Status ON Notifications
WHEN NEW.Status IN ('Delivered', 'Parked', 'Discarded', 'Superseded', 'Cleared', 'Acknowledged')
     AND NEW.Status <> OLD.Status
BEGIN
    INSERT INTO SiteStatusFeed (SiteId, NotificationId, Status, DecidedAt, LastError)
    SELECT NEW.SourceSiteId, NEW.NotificationId, NEW.Status,
           COALESCE(NEW.ResolvedAt, NEW.CreatedAt), NEW.LastError
    WHERE EXISTS (SELECT 1 FROM SiteStatusWatchers WHERE SiteId = NEW.SourceSiteId);
    INSERT INTO StatusCallbacks (NotificationId, ListName, Status, DecidedAt, LastError,
        QueuedAt, NextCallAt)
    SELECT NEW.NotificationId, NEW.ListName, NEW.Status, COALESCE(NEW.ResolvedAt, NEW.CreatedAt),
           NEW.LastError, COALESCE(NEW.ResolvedAt, NEW.CreatedAt),
           COALESCE(NEW.ResolvedAt, NEW.CreatedAt)
    FROM NotificationLists AS l
    WHERE l.Name = NEW.ListName AND l.StatusCallbackUrl IS NOT NULL;
END;

-- A row stored final (one the site cleared before forwarding it).
CREATE TRIGGER TR_Notifications_StoredFinal AFTER INSERT ON Notifications
WHEN NEW.Status IN ('Delivered', 'Parked', 'Discarded', 'Superseded', 'Cleared', 'Acknowledged')
BEGIN
    INSERT INTO SiteStatusFeed (SiteId, NotificationId, Status, DecidedAt, LastError)
    SELECT NEW.SourceSiteId, NEW.NotificationId, NEW.Status,
           COALESCE(NEW.ResolvedAt, NEW.CreatedAt), NEW.LastError
    WHERE EXISTS (SELECT 1 FROM SiteStatusWatchers WHERE SiteId = NEW.SourceSiteId);
    INSERT INTO StatusCallbacks (NotificationId, ListName, Status, DecidedAt, LastError,
        QueuedAt, NextCallAt)
    SELECT NEW.NotificationId, NEW.ListName, NEW.Status, COALESCE(NEW.ResolvedAt, NEW.CreatedAt),
           NEW.LastError, COALESCE(NEW.ResolvedAt, NEW.CreatedAt),
           COALESCE(NEW.ResolvedAt, NEW.CreatedAt)
    FROM NotificationLists AS l
    WHERE l.Name = NEW.ListName AND l.StatusCallbackUrl IS NOT NULL;
END;
