-- Status callbacks (issue 36, part 2), the schema of SQLite's migration 0015: a list's endpoint
-- that is told every final status of its notifications (central's status_callbacks), the
-- changes still to tell it, and the audit of every call. The trigger that queues the changes,
-- in the transaction that sets the status, is the living file
-- procedures/RecordSiteStatusChanges.sql (revision 2), created after this migration.

-- The endpoint, read when a call is made; NULL: the list has none.
IF COL_LENGTH(N'dbo.NotificationLists', N'StatusCallbackUrl') IS NULL
    ALTER TABLE dbo.NotificationLists ADD StatusCallbackUrl nvarchar(2048) NULL;
GO

-- One row per final status still to be told, deleted once answered or given up. Seq orders
-- the changes of one notification (the earlier change's transaction holds its row until it
-- commits); a change is called only once every earlier one of its notification is done.
IF OBJECT_ID(N'dbo.StatusCallbacks', N'U') IS NULL
BEGIN
CREATE TABLE dbo.StatusCallbacks (
    Seq            bigint IDENTITY(1, 1) NOT NULL,
    NotificationId uniqueidentifier NOT NULL,
    ListName       nvarchar(256) COLLATE Latin1_General_BIN2 NOT NULL,
    Status         nvarchar(16) COLLATE Latin1_General_BIN2 NOT NULL,
    DecidedAt      datetime2(3) NOT NULL,
    LastError      nvarchar(max) NULL,
    QueuedAt       datetime2(3) NOT NULL,
    Calls          int NOT NULL CONSTRAINT DF_StatusCallbacks_Calls DEFAULT (0),
    NextCallAt     datetime2(3) NOT NULL,
    CONSTRAINT PK_StatusCallbacks PRIMARY KEY CLUSTERED (Seq)
);
END;
GO
IF INDEXPROPERTY(OBJECT_ID(N'dbo.StatusCallbacks'), N'IX_StatusCallbacks_Due', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_StatusCallbacks_Due ON dbo.StatusCallbacks (NextCallAt, Seq);
END;
GO
IF INDEXPROPERTY(OBJECT_ID(N'dbo.StatusCallbacks'), N'IX_StatusCallbacks_Notification', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_StatusCallbacks_Notification ON dbo.StatusCallbacks (NotificationId, Seq);
END;
GO

-- The audit of every call, read with the notification's history and purged with it. Outcome:
-- 'Answered', 'Failed' (called again later), 'GivenUp'. Endpoint: `scheme://host:port`.
IF OBJECT_ID(N'dbo.StatusCallbackCalls', N'U') IS NULL
BEGIN
CREATE TABLE dbo.StatusCallbackCalls (
    NotificationId uniqueidentifier NOT NULL,
    CallNo         int NOT NULL,
    CalledAt       datetime2(3) NOT NULL,
    DurationMs     bigint NULL,
    Status         nvarchar(16) COLLATE Latin1_General_BIN2 NOT NULL,
    Outcome        nvarchar(16) COLLATE Latin1_General_BIN2 NOT NULL,
    Error          nvarchar(max) NULL,
    Endpoint       nvarchar(512) NULL,
    CONSTRAINT PK_StatusCallbackCalls PRIMARY KEY CLUSTERED (NotificationId, CallNo)
);
END;
