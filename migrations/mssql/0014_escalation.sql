-- Escalation until someone answers (issue 35), the schema of SQLite's migration 0011: a list's
-- policy, the incidents its alarms open, each page an incident fires, and every step of an
-- incident's life as a history row. Timers are rows (Incidents.NextDueAt), never memory, so a
-- leader change or a restart loses no page and fires none twice (IncidentPages' key). Written
-- by procedures/SubmitNotification.sql (an alarm opens or joins its incident), by
-- procedures/RecordAttemptOutcomes.sql (a parked page escalates at once) and by the batches of
-- central-outbox/src/store/mssql/escalation.rs (the clock's turn, acknowledgements, clears).

-- The list's policy as JSON (store/stored_policy.rs); NULL: its alarms do not escalate. The
-- columns after it are what the submit procedure needs of the policy to open an incident,
-- derived from it by the same write (store/mssql/escalation.rs, `OpeningRule`), so the
-- procedure never reads JSON: the priorities it applies to (bit `rank` set), the wait after
-- step 1 in milliseconds, the page that wait leads to (both NULL: exhaustion), whether a parked
-- page escalates at once, and the opening history row's text after the alarm's id, list and
-- priority (`{due}` standing for the time the next page is due).
IF COL_LENGTH(N'dbo.NotificationLists', N'Escalation') IS NULL
    ALTER TABLE dbo.NotificationLists ADD Escalation nvarchar(max) NULL;
IF COL_LENGTH(N'dbo.NotificationLists', N'EscalationPriorities') IS NULL
    ALTER TABLE dbo.NotificationLists ADD EscalationPriorities int NULL;
IF COL_LENGTH(N'dbo.NotificationLists', N'EscalationFirstWaitMs') IS NULL
    ALTER TABLE dbo.NotificationLists ADD EscalationFirstWaitMs bigint NULL;
IF COL_LENGTH(N'dbo.NotificationLists', N'EscalationFirstRound') IS NULL
    ALTER TABLE dbo.NotificationLists ADD EscalationFirstRound int NULL;
IF COL_LENGTH(N'dbo.NotificationLists', N'EscalationFirstStep') IS NULL
    ALTER TABLE dbo.NotificationLists ADD EscalationFirstStep int NULL;
IF COL_LENGTH(N'dbo.NotificationLists', N'EscalateOnPark') IS NULL
    ALTER TABLE dbo.NotificationLists ADD EscalateOnPark int NULL;
IF COL_LENGTH(N'dbo.NotificationLists', N'EscalationOpenedNote') IS NULL
    ALTER TABLE dbo.NotificationLists ADD EscalationOpenedNote nvarchar(400) NULL;
GO

IF OBJECT_ID(N'dbo.Incidents', N'U') IS NULL
BEGIN
CREATE TABLE dbo.Incidents (
    -- The incident's number, as operators see and type it.
    Id              bigint IDENTITY(1, 1) NOT NULL,
    -- The list, site and condition of the alarm that opened it: a keyed alarm of the same
    -- three joins it while it is not final.
    ListName        nvarchar(256) COLLATE Latin1_General_BIN2 NOT NULL,
    SourceSiteId    nvarchar(64) COLLATE Latin1_General_BIN2 NOT NULL,
    ConditionKey    nvarchar(128) COLLATE Latin1_General_BIN2 NULL,
    Priority        int NOT NULL,
    -- The notification that opened it, and the latest of its condition (the state every later
    -- page quotes: a joined, newer notification replaces it).
    AlarmId         uniqueidentifier NOT NULL,
    LatestId        uniqueidentifier NOT NULL,
    Subject         nvarchar(1000) NOT NULL,
    -- The policy as it was when the incident opened (JSON, as NotificationLists.Escalation):
    -- an edit of the list's policy applies to incidents opened after it.
    Policy          nvarchar(max) NOT NULL,
    EscalateOnPark  int NOT NULL,
    -- Open, Acknowledged, Exhausted, Cleared, Discarded (domain::escalation::IncidentStatus).
    Status          nvarchar(16) COLLATE Latin1_General_BIN2 NOT NULL,
    OpenedAt        datetime2(3) NOT NULL,
    -- The last page fired: its number (1 is the alarm), cycle (reminders so far), round, step.
    PageCount       int NOT NULL CONSTRAINT DF_Incidents_PageCount DEFAULT (1),
    Cycle           int NOT NULL CONSTRAINT DF_Incidents_Cycle DEFAULT (0),
    Round           int NOT NULL CONSTRAINT DF_Incidents_Round DEFAULT (0),
    Step            int NOT NULL CONSTRAINT DF_Incidents_Step DEFAULT (1),
    -- What is due next, and when: Open, the page (NextRound, NextStep) or, with both NULL,
    -- exhaustion; Acknowledged, the reminder. NULL otherwise.
    NextDueAt       datetime2(3) NULL,
    NextRound       int NULL,
    NextStep        int NULL,
    -- Pages that fired LATE_AFTER or more after their due time (the console's "late").
    LatePages       int NOT NULL CONSTRAINT DF_Incidents_LatePages DEFAULT (0),
    AcknowledgedAt  datetime2(3) NULL,
    AcknowledgedBy  nvarchar(512) NULL,
    AcknowledgedVia nvarchar(16) COLLATE Latin1_General_BIN2 NULL,
    -- When it became Exhausted, Cleared or Discarded.
    EndedAt         datetime2(3) NULL,
    -- Numbers IncidentHistory rows: 1, 2, 3, ...
    HistoryCount    int NOT NULL CONSTRAINT DF_Incidents_HistoryCount DEFAULT (0),
    -- Set by a statement that changes many incidents at once (a clear, a discard, parked
    -- pages) to its own token, so its next statements find exactly those (no OUTPUT:
    -- migrations/mssql/README.md), and set back to NULL before its transaction commits.
    MarkToken       uniqueidentifier NULL,
    CONSTRAINT PK_Incidents PRIMARY KEY CLUSTERED (Id),
    CONSTRAINT CK_Incidents_Status
        CHECK (Status IN (N'Open', N'Acknowledged', N'Exhausted', N'Cleared', N'Discarded'))
);
END;
GO

-- The escalation clock: what is due next, over the incidents that wait for something. Each
-- index here is dropped if it exists and created, as migration 0012 says why.
DROP INDEX IF EXISTS IX_Incidents_Due ON dbo.Incidents;
GO
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Incidents'), N'IX_Incidents_Due', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Incidents_Due
    ON dbo.Incidents (NextDueAt, Id)
    WHERE NextDueAt IS NOT NULL;
END;
GO
-- At most one incident per condition is not final: the one a keyed alarm joins. Two submits of
-- one condition at once on two replicas: the second insert fails on this key and its submit is
-- stored again, then joining the first's incident (store/mssql/ingest.rs).
DROP INDEX IF EXISTS UX_Incidents_Condition ON dbo.Incidents;
GO
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Incidents'), N'UX_Incidents_Condition', N'IndexID') IS NULL
BEGIN
CREATE UNIQUE NONCLUSTERED INDEX UX_Incidents_Condition
    ON dbo.Incidents (SourceSiteId, ConditionKey, ListName)
    WHERE ConditionKey IS NOT NULL AND Status IN (N'Open', N'Acknowledged', N'Exhausted');
END;
GO

-- The incidents a statement marked (MarkToken): set and cleared again in the same
-- transaction, so this index holds nothing between statements.
DROP INDEX IF EXISTS IX_Incidents_Mark ON dbo.Incidents;
GO
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Incidents'), N'IX_Incidents_Mark', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Incidents_Mark
    ON dbo.Incidents (MarkToken)
    WHERE MarkToken IS NOT NULL;
END;
GO

-- One row per page an incident fired. The key is the incident, cycle, round and step: the
-- same page can never be written twice, whichever node fires it.
IF OBJECT_ID(N'dbo.IncidentPages', N'U') IS NULL
BEGIN
CREATE TABLE dbo.IncidentPages (
    IncidentId bigint NOT NULL,
    Cycle      int NOT NULL,
    Round      int NOT NULL,
    Step       int NOT NULL,
    PageNo     int NOT NULL,
    DueAt      datetime2(3) NOT NULL,
    FiredAt    datetime2(3) NOT NULL,
    -- How late it fired, when LATE_AFTER or more; NULL on time.
    LateMs     bigint NULL,
    -- The dispatcher lease epoch it fired under (0: the alarm, stored by ingest).
    LeaseEpoch bigint NOT NULL,
    CONSTRAINT PK_IncidentPages PRIMARY KEY CLUSTERED (IncidentId, Cycle, Round, Step)
);
END;
GO
DROP INDEX IF EXISTS UX_IncidentPages_PageNo ON dbo.IncidentPages;
GO
IF INDEXPROPERTY(OBJECT_ID(N'dbo.IncidentPages'), N'UX_IncidentPages_PageNo', N'IndexID') IS NULL
BEGIN
CREATE UNIQUE NONCLUSTERED INDEX UX_IncidentPages_PageNo ON dbo.IncidentPages (IncidentId, PageNo);
END;
GO

IF OBJECT_ID(N'dbo.IncidentHistory', N'U') IS NULL
BEGIN
CREATE TABLE dbo.IncidentHistory (
    IncidentId  bigint NOT NULL,
    Sequence    int NOT NULL,
    At          datetime2(3) NOT NULL,
    -- domain::escalation::IncidentEvent
    Kind        nvarchar(32) COLLATE Latin1_General_BIN2 NOT NULL,
    -- Who: an operator, a link's recipient, a site, or 'dispatcher'.
    Actor       nvarchar(512) NOT NULL,
    -- How an acknowledgement came (link, console, api, site); NULL for the rest.
    Means       nvarchar(16) COLLATE Latin1_General_BIN2 NULL,
    -- The address an acknowledgement came from, where there is one.
    FromAddress nvarchar(128) NULL,
    Detail      nvarchar(max) NOT NULL CONSTRAINT DF_IncidentHistory_Detail DEFAULT (N''),
    CONSTRAINT PK_IncidentHistory PRIMARY KEY CLUSTERED (IncidentId, Sequence)
);
END;
GO

-- Each notification of an incident: the alarm (page 1), a joined notification of its condition
-- (IncidentPage NULL), or a page's message to one list (IncidentPage 2, 3, ...). An
-- acknowledgement ends the page messages not yet handed to the relay.
IF COL_LENGTH(N'dbo.Notifications', N'IncidentId') IS NULL
    ALTER TABLE dbo.Notifications ADD IncidentId bigint NULL;
IF COL_LENGTH(N'dbo.Notifications', N'IncidentPage') IS NULL
    ALTER TABLE dbo.Notifications ADD IncidentPage int NULL;
GO
DROP INDEX IF EXISTS IX_Notifications_Incident ON dbo.Notifications;
GO
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Incident', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Incident
    ON dbo.Notifications (IncidentId, IncidentPage)
    WHERE IncidentId IS NOT NULL;
END;
GO

-- An acknowledgement ends the page messages it stops as Acknowledged.
IF OBJECT_ID(N'dbo.CK_Notifications_Status', N'C') IS NOT NULL
    ALTER TABLE dbo.Notifications DROP CONSTRAINT CK_Notifications_Status;
GO
IF OBJECT_ID(N'dbo.CK_Notifications_Status', N'C') IS NULL
    ALTER TABLE dbo.Notifications ADD CONSTRAINT CK_Notifications_Status
        CHECK (Status IN (N'Pending', N'Retrying', N'Delivered', N'Parked', N'Discarded', N'Superseded', N'Cleared', N'Held', N'Acknowledged'));
GO

