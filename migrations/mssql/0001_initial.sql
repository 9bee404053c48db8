-- Central outbox schema, MS SQL Server backend (also runs on Babelfish for PostgreSQL).
--
-- Applied by central-outbox at start-up inside sp_getapplock, in one transaction with its
-- SchemaMigrations row. Every CREATE is guarded by an existence check rather than written as
-- the create-or-alter form (which Babelfish rejects), so re-running the file is harmless.
--
-- Conventions: times are datetime2(3), UTC, milliseconds like the SQLite backend. Lengths are
-- in UTF-16 code units, so a column for text the service caps at N characters holds 2N (a
-- character outside the Basic Multilingual Plane takes two units). Text is
-- nvarchar (the driver binds strings as nvarchar, so a varchar column would be converted on every
-- comparison and lose its index seeks). Identifiers that the SQLite backend compares byte-wise
-- (names, statuses, site ids) use a binary collation so both backends agree on equality and
-- order whatever the database's default collation is.

-- One row per notification, whatever its channel. Id is the clustered key: inserts append at the
-- end of the table, and it is the tie-breaker of the newest-first keyset. NotificationId (the
-- site-generated, random UUID) is the idempotency key in its own narrow unique index, so random
-- inserts split 16-byte index pages rather than data pages.
IF OBJECT_ID(N'dbo.Notifications', N'U') IS NULL
BEGIN
CREATE TABLE dbo.Notifications (
    Id                      bigint IDENTITY(1, 1) NOT NULL,
    NotificationId          uniqueidentifier NOT NULL,
    Type                    nvarchar(16) COLLATE Latin1_General_BIN2 NOT NULL,
    ListName                nvarchar(256) COLLATE Latin1_General_BIN2 NOT NULL,
    Subject                 nvarchar(1000) NOT NULL,
    Body                    nvarchar(max) NOT NULL,
    TypeData                nvarchar(max) NOT NULL CONSTRAINT DF_Notifications_TypeData DEFAULT (N''),
    ContentHash             binary(32) NOT NULL,
    Status                  nvarchar(16) COLLATE Latin1_General_BIN2 NOT NULL,
    RetryCount              int NOT NULL CONSTRAINT DF_Notifications_RetryCount DEFAULT (0),
    -- History entries ever written (attempts and operator actions); numbers the next one.
    AttemptCount            int NOT NULL CONSTRAINT DF_Notifications_AttemptCount DEFAULT (0),
    LastError               nvarchar(max) NULL,
    ResolvedTargets         nvarchar(max) NULL,
    SourceSiteId            nvarchar(64) COLLATE Latin1_General_BIN2 NOT NULL,
    SourceInstanceId        nvarchar(512) NOT NULL CONSTRAINT DF_Notifications_SourceInstanceId DEFAULT (N''),
    SourceScript            nvarchar(512) NOT NULL CONSTRAINT DF_Notifications_SourceScript DEFAULT (N''),
    OriginExecutionId       uniqueidentifier NULL,
    OriginParentExecutionId uniqueidentifier NULL,
    SiteEnqueuedAt          datetime2(3) NOT NULL,
    CreatedAt               datetime2(3) NOT NULL,
    LastAttemptAt           datetime2(3) NULL,
    -- NULL means due now (fresh, or reset by an operator Retry).
    NextAttemptAt           datetime2(3) NULL,
    DeliveredAt             datetime2(3) NULL,
    ResolvedAt              datetime2(3) NULL,
    -- Dispatcher claim: being delivered under lease epoch ClaimEpoch until ClaimedUntil; after
    -- that the row is due again (its claimer is presumed dead).
    ClaimedUntil            datetime2(3) NULL,
    ClaimEpoch              bigint NULL,
    CONSTRAINT PK_Notifications PRIMARY KEY CLUSTERED (Id),
    CONSTRAINT CK_Notifications_Status
        CHECK (Status IN (N'Pending', N'Retrying', N'Delivered', N'Parked', N'Discarded'))
);
END;

-- The idempotency key. Random UUIDs land anywhere in this index: the fill factor leaves room on
-- each page so that inserts split pages less often between index rebuilds.
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'UX_Notifications_NotificationId', N'IndexID') IS NULL
BEGIN
CREATE UNIQUE NONCLUSTERED INDEX UX_Notifications_NotificationId
    ON dbo.Notifications (NotificationId) WITH (FILLFACTOR = 80);
END;

-- The due scan per channel: unclaimed Pending/Retrying rows only, so it stays as small as the
-- queue. NULL NextAttemptAt (due now) sorts first, then retries by due time.
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Due', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Due
    ON dbo.Notifications (Type, NextAttemptAt, Id)
    WHERE Status IN (N'Pending', N'Retrying') AND ClaimedUntil IS NULL;
END;

-- The claim rescue: rows claimed by a dispatcher, found by when their claim runs out. Holds only
-- the rows in flight right now.
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_ClaimRescue', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_ClaimRescue
    ON dbo.Notifications (Type, ClaimedUntil, Id)
    INCLUDE (Status, NextAttemptAt)
    WHERE ClaimedUntil IS NOT NULL;
END;

-- The UI list, newest first, and its most common filters (status, site).
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Created', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Created
    ON dbo.Notifications (CreatedAt DESC, Id DESC);
END;

IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Status_Created', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Status_Created
    ON dbo.Notifications (Status, CreatedAt DESC, Id DESC);
END;

IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Site_Created', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Site_Created
    ON dbo.Notifications (SourceSiteId, CreatedAt DESC, Id DESC);
END;

-- KPIs (live, parked and recently delivered rows per site, covered by the included columns) and
-- the retention purge (terminal rows by ResolvedAt).
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Status_Resolved', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Status_Resolved
    ON dbo.Notifications (Status, ResolvedAt)
    INCLUDE (SourceSiteId, CreatedAt, NextAttemptAt);
END;

-- One row per delivery attempt and per operator action; AttemptNo is the entry's number in the
-- notification's history. Clustered on an appending key like Notifications, with the lookup by
-- (NotificationId, AttemptNo) in a narrow unique index. Operator entries have Outcome
-- 'OperatorRetry' or 'OperatorDiscard', no LeaseEpoch, and the operator in Actor.
IF OBJECT_ID(N'dbo.NotificationAttempts', N'U') IS NULL
BEGIN
CREATE TABLE dbo.NotificationAttempts (
    Id             bigint IDENTITY(1, 1) NOT NULL,
    NotificationId uniqueidentifier NOT NULL,
    AttemptNo      int NOT NULL,
    StartedAt      datetime2(3) NOT NULL,
    DurationMs     bigint NULL,
    -- InFlight, Delivered, TransientFailure, PermanentFailure, OperatorRetry, OperatorDiscard
    Outcome        nvarchar(32) COLLATE Latin1_General_BIN2 NOT NULL,
    Error          nvarchar(max) NULL,
    LeaseEpoch     bigint NULL,
    Actor          nvarchar(256) NULL,
    CONSTRAINT PK_NotificationAttempts PRIMARY KEY CLUSTERED (Id)
);
END;

IF INDEXPROPERTY(OBJECT_ID(N'dbo.NotificationAttempts'), N'UX_NotificationAttempts_Notification', N'IndexID') IS NULL
BEGIN
CREATE UNIQUE NONCLUSTERED INDEX UX_NotificationAttempts_Notification
    ON dbo.NotificationAttempts (NotificationId, AttemptNo) WITH (FILLFACTOR = 80);
END;

-- Notification lists. A webhook list keeps its payload format and optional HMAC signing secret
-- here (both NULL for email lists) and its endpoint URLs as recipients.
IF OBJECT_ID(N'dbo.NotificationLists', N'U') IS NULL
BEGIN
CREATE TABLE dbo.NotificationLists (
    Name          nvarchar(256) COLLATE Latin1_General_BIN2 NOT NULL,
    Type          nvarchar(16) COLLATE Latin1_General_BIN2 NOT NULL,
    WebhookFormat nvarchar(16) NULL,
    WebhookSecret nvarchar(max) NULL,
    UpdatedAt     datetime2(3) NOT NULL,
    CONSTRAINT PK_NotificationLists PRIMARY KEY CLUSTERED (Name)
);
END;

-- A list's addresses or endpoint URLs (read back sorted by address). Keyed by an identity within
-- the list because a URL (up to 2048 characters) is too long for an index key.
IF OBJECT_ID(N'dbo.NotificationListRecipients', N'U') IS NULL
BEGIN
CREATE TABLE dbo.NotificationListRecipients (
    ListName nvarchar(256) COLLATE Latin1_General_BIN2 NOT NULL,
    Id       int IDENTITY(1, 1) NOT NULL,
    Address  nvarchar(2048) NOT NULL,
    CONSTRAINT PK_NotificationListRecipients PRIMARY KEY CLUSTERED (ListName, Id),
    CONSTRAINT FK_NotificationListRecipients_List FOREIGN KEY (ListName)
        REFERENCES dbo.NotificationLists (Name) ON DELETE CASCADE
);
END;

-- Channel settings, one row per channel ('email' for now). AuthMechanism is 'none', 'password'
-- (Username/Password) or 'xoauth2' (Username and the OAuth2 client-credentials grant).
IF OBJECT_ID(N'dbo.ChannelConfig', N'U') IS NULL
BEGIN
CREATE TABLE dbo.ChannelConfig (
    Channel                  nvarchar(32) COLLATE Latin1_General_BIN2 NOT NULL,
    Host                     nvarchar(512) NOT NULL,
    Port                     int NOT NULL,
    TlsMode                  nvarchar(16) NOT NULL,
    AuthMechanism            nvarchar(16) NOT NULL CONSTRAINT DF_ChannelConfig_AuthMechanism DEFAULT (N'none'),
    Username                 nvarchar(512) NULL,
    Password                 nvarchar(max) NULL,
    FromAddress              nvarchar(1024) NOT NULL,
    MaxRetries               bigint NOT NULL,
    RetryDelayMs             bigint NOT NULL,
    Backoff                  nvarchar(16) NOT NULL CONSTRAINT DF_ChannelConfig_Backoff DEFAULT (N'fixed'),
    MaxRetryDelayMs          bigint NULL,
    MaxConcurrentConnections int NOT NULL,
    RateLimitPerSecond       float NULL,
    RateLimitBurst           bigint NULL,
    TimeoutMs                bigint NOT NULL,
    OverallTimeoutMs         bigint NULL,
    OAuthTokenUrl            nvarchar(max) NULL,
    OAuthClientId            nvarchar(max) NULL,
    OAuthClientSecret        nvarchar(max) NULL,
    OAuthScope               nvarchar(max) NULL,
    UpdatedAt                datetime2(3) NOT NULL,
    CONSTRAINT PK_ChannelConfig PRIMARY KEY CLUSTERED (Channel)
);
END;

-- Leader leases. Epoch increases every time the lease changes hands: it is the fencing token.
-- ExpiresAt is on the database's clock (SYSUTCDATETIME), shared by every replica.
IF OBJECT_ID(N'dbo.Leases', N'U') IS NULL
BEGIN
CREATE TABLE dbo.Leases (
    Name      nvarchar(64) COLLATE Latin1_General_BIN2 NOT NULL,
    Holder    nvarchar(1024) COLLATE Latin1_General_BIN2 NOT NULL,
    Epoch     bigint NOT NULL,
    ExpiresAt datetime2(3) NOT NULL,
    CONSTRAINT PK_Leases PRIMARY KEY CLUSTERED (Name)
);
END;
