-- Central outbox schema, SQLite backend. Timestamps are UTC milliseconds since the Unix epoch
-- (INTEGER), so comparisons are integer compares; read them with
-- datetime(col / 1000, 'unixepoch').

-- One row per notification, whatever its channel. Id is the rowid: inserts append, and it is the
-- stable tie-breaker for keyset pagination. NotificationId (the site-generated UUID) is the
-- idempotency key.
CREATE TABLE Notifications (
    Id                      INTEGER PRIMARY KEY,
    NotificationId          TEXT    NOT NULL UNIQUE,
    Type                    TEXT    NOT NULL,
    ListName                TEXT    NOT NULL,
    Subject                 TEXT    NOT NULL,
    Body                    TEXT    NOT NULL,
    TypeData                TEXT    NOT NULL DEFAULT '',
    ContentHash             BLOB    NOT NULL,
    Status                  TEXT    NOT NULL,
    RetryCount              INTEGER NOT NULL DEFAULT 0,
    -- Attempts ever started (RetryCount resets on operator Retry; this never does).
    AttemptCount            INTEGER NOT NULL DEFAULT 0,
    LastError               TEXT,
    ResolvedTargets         TEXT,
    SourceSiteId            TEXT    NOT NULL,
    SourceInstanceId        TEXT    NOT NULL DEFAULT '',
    SourceScript            TEXT    NOT NULL DEFAULT '',
    OriginExecutionId       TEXT,
    OriginParentExecutionId TEXT,
    SiteEnqueuedAt          INTEGER NOT NULL,
    CreatedAt               INTEGER NOT NULL,
    LastAttemptAt           INTEGER,
    -- NULL means due now (fresh, or reset by an operator Retry).
    NextAttemptAt           INTEGER,
    DeliveredAt             INTEGER,
    ResolvedAt              INTEGER,
    -- Dispatcher claim: the row is being delivered under lease epoch ClaimEpoch until
    -- ClaimedUntil; after that it is due again (its claimer is presumed dead).
    ClaimedUntil            INTEGER,
    ClaimEpoch              INTEGER
);

-- The due scan: only non-terminal rows are in this index, so it stays as small as the queue.
-- NULLs (due now) sort first, then retries by due time.
CREATE INDEX IX_Notifications_Due ON Notifications (NextAttemptAt, Id)
    WHERE Status IN ('Pending', 'Retrying');
-- The UI list, newest first, and its most common filters.
CREATE INDEX IX_Notifications_Created ON Notifications (CreatedAt DESC, Id DESC);
CREATE INDEX IX_Notifications_Site_Created ON Notifications (SourceSiteId, CreatedAt DESC);
-- KPIs and the retention purge.
CREATE INDEX IX_Notifications_Status_Resolved ON Notifications (Status, ResolvedAt);

-- One row per delivery attempt and per operator action, oldest first by AttemptNo.
CREATE TABLE NotificationAttempts (
    NotificationId TEXT    NOT NULL,
    AttemptNo      INTEGER NOT NULL,
    StartedAt      INTEGER NOT NULL,
    DurationMs     INTEGER,
    -- InFlight, Delivered, TransientFailure, PermanentFailure
    Outcome        TEXT    NOT NULL,
    Error          TEXT,
    LeaseEpoch     INTEGER,
    PRIMARY KEY (NotificationId, AttemptNo)
) WITHOUT ROWID;

CREATE TABLE NotificationLists (
    Name      TEXT    PRIMARY KEY,
    Type      TEXT    NOT NULL,
    UpdatedAt INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE NotificationListRecipients (
    ListName TEXT NOT NULL REFERENCES NotificationLists (Name) ON DELETE CASCADE,
    Address  TEXT NOT NULL,
    PRIMARY KEY (ListName, Address)
) WITHOUT ROWID;

-- Channel settings, one row per channel ('email' for now).
CREATE TABLE ChannelConfig (
    Channel                  TEXT    PRIMARY KEY,
    Host                     TEXT    NOT NULL,
    Port                     INTEGER NOT NULL,
    TlsMode                  TEXT    NOT NULL,
    Username                 TEXT,
    Password                 TEXT,
    FromAddress              TEXT    NOT NULL,
    MaxRetries               INTEGER NOT NULL,
    RetryDelayMs             INTEGER NOT NULL,
    MaxConcurrentConnections INTEGER NOT NULL,
    TimeoutMs                INTEGER NOT NULL,
    UpdatedAt                INTEGER NOT NULL
) WITHOUT ROWID;

-- Leader leases. Epoch increases every time the lease changes hands: it is the fencing token.
CREATE TABLE Leases (
    Name      TEXT    PRIMARY KEY,
    Holder    TEXT    NOT NULL,
    Epoch     INTEGER NOT NULL,
    ExpiresAt INTEGER NOT NULL
) WITHOUT ROWID;
