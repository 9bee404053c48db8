-- Who goes first (central's domain::serve_order): each row's priority and serve turn, the
-- indexes that serve the two claim orders and a submit's two reads of the turns, and the two
-- procedures that use them, dropped and created again (Babelfish rejects the create-or-alter
-- form). The procedures keep the rules of migration 0002 (no OUTPUT, no table variable: see
-- there); batches are separated by GO lines, because CREATE PROCEDURE must be alone in its
-- batch, and a column added by ALTER TABLE can only be named by a later batch.
--
-- Guards as in 0001. On Babelfish 4.4 INDEXPROPERTY does not find an index by its T-SQL name
-- (it stores it under a longer, hashed one), so there a second run of this file (or of 0001)
-- stops at the first CREATE INDEX; the migration runner never runs a file twice.

-- Priority rank: 0 critical, 1 high, 2 normal, 3 low (Priority::rank), so ascending order is
-- most urgent first. Rows stored before priorities existed are normal. An int, not a tinyint:
-- Babelfish 4.4 fails to add a NOT NULL tinyint column with a default to a table ("tuple
-- already updated by self").
IF COL_LENGTH(N'dbo.Notifications', N'Priority') IS NULL
    ALTER TABLE dbo.Notifications ADD Priority int NOT NULL CONSTRAINT DF_Notifications_Priority DEFAULT (2);
GO

-- The row's turn among the sites with work at its priority (domain::serve_order::serve_turn).
-- Rows stored before turns existed share turn 0: they go first, oldest first, as before.
IF COL_LENGTH(N'dbo.Notifications', N'ServeTurn') IS NULL
    ALTER TABLE dbo.Notifications ADD ServeTurn bigint NOT NULL CONSTRAINT DF_Notifications_ServeTurn DEFAULT (0);
GO

-- The claim in turn (rules 1 and 2): a channel's waiting rows by priority, then turn, like
-- SQLite's IX_Notifications_Serve. Rows in flight stay in it (a row is Pending or Retrying
-- until its outcome, and it still counts for the head turn, as on SQLite), so its first entry
-- at a priority is the head turn a submit reads, and the claim passes over the rows in flight
-- and those not due yet (retries waiting out their delay) by the included columns, without
-- looking each one up: the claim's rescue of claims that ran out is then the same scan.
-- `Priority >= 0` holds for every row: it is in the filter so that only the statements that
-- say it (the claim in turn and the head read) can use the index. Every statement on waiting
-- rows implies `Status IN (...)`, and without statistics (a new database, before its first
-- analyze) Babelfish's planner (PostgreSQL's) rates every index whose filter a statement
-- implies alike and took the wrong one: the claims re-checked their rows, and a submit read
-- the head, by scanning a channel's whole queue (3.3 ms instead of 0.3 ms per submit with 20,000
-- waiting).
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Serve', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Serve
    ON dbo.Notifications (Type, Priority, ServeTurn, Id)
    INCLUDE (ClaimedUntil, NextAttemptAt)
    WHERE Status IN (N'Pending', N'Retrying') AND Priority >= 0;
END;

-- A submit's other read: the newest turn the row's site has waiting at its priority (claimed
-- or not), the last entry of one seek. Rows of turn 0 (stored before turns existed) are left
-- out, which changes no turn: while one waits, the head is 0 and a site's newest turn counts
-- only when above it. As for IX_Notifications_Serve, that filter also keeps every other
-- statement on waiting rows away from this index.
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Site_Turn', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Site_Turn
    ON dbo.Notifications (Type, Priority, SourceSiteId, ServeTurn)
    WHERE Status IN (N'Pending', N'Retrying') AND ServeTurn > 0;
END;
GO

IF OBJECT_ID(N'dbo.ClaimDueNotifications', N'P') IS NOT NULL
    DROP PROCEDURE dbo.ClaimDueNotifications;
GO

-- Claims due rows of type @Type for @ClaimMs milliseconds under epoch @Epoch of lease @Lease,
-- and writes their InFlight attempt rows, in one transaction, in the two orders of
-- domain::serve_order: first up to @LongestWaiting rows due longest (NextAttemptAt, Id: rule
-- 3), then up to @InTurn more by priority and serve turn (Priority, ServeTurn, Id: rules 1 and
-- 2). Returns the claimed rows in that order: the longest-waiting ones first, in theirs, then
-- the others in theirs.
--
-- Each half is the claim of migration 0002 in its own order, over one small filtered index.
-- The longest-waiting half reads unclaimed Pending/Retrying rows by due time
-- (IX_Notifications_Due) and rows whose claim ran out (their dispatcher died) by their
-- ClaimedUntil (IX_Notifications_ClaimRescue, a few rows if any, sorted): each source gives
-- its first rows in due order (its own TOP) and the half takes the first of those, the same
-- rows as the first of their union. A TOP over the union itself made Babelfish (PostgreSQL)
-- read and sort every due row of the channel (a claim of 12 rows with 20,000 due: 7.5 ms, in
-- migration 0002's claim too): it reads an index in order only for the TOP of one table. The
-- in-turn half is one such TOP: IX_Notifications_Serve holds the rows in flight too, so a row
-- whose claim ran out is taken in its turn by the same scan, which passes over the rows still
-- claimed (with 20,000 due, both halves: 2.8 ms).
--
-- ROWLOCK keeps the claim to the rows it takes; UPDLOCK makes two claims reading the same due
-- rows queue for them instead of both reading and then deadlocking on the upgrade; READPAST
-- lets a claim skip the rows another claim holds rather than wait for it to commit and then
-- find them taken. Babelfish ignores the hints: the UPDATE re-checks that each row is still
-- due and unclaimed and that the epoch still holds the lease, so two claims never take the
-- same row either way. Each half stamps its rows with a token of its own (no OUTPUT: see
-- migration 0002); the rows this call took are those carrying either token (found through
-- IX_Notifications_ClaimRescue by their ClaimedUntil), and the token tells which order a row
-- was taken in. The in-turn half runs second, so it never takes a row the first just took:
-- that row is no longer unclaimed, and its token rules it out even when a zero claim time
-- makes it look expired at once.
--
-- @Limit is the single size of the previous version of this procedure (oldest due first): a
-- replica still running the previous release during an upgrade keeps claiming, in turn.
CREATE PROCEDURE dbo.ClaimDueNotifications
    @Epoch bigint,
    @ClaimMs int,
    @LongestWaiting bigint = 0,
    @InTurn bigint = NULL,
    @Type nvarchar(16),
    @Lease nvarchar(64),
    @Limit bigint = NULL
AS
BEGIN
SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @until datetime2(3) = DATEADD(millisecond, @ClaimMs, @now);
DECLARE @waitingToken uniqueidentifier = NEWID();
DECLARE @turnToken uniqueidentifier = NEWID();
DECLARE @turnRows bigint = COALESCE(@InTurn, @Limit, 0);
BEGIN TRANSACTION;
IF @LongestWaiting > 0
UPDATE dbo.Notifications
SET ClaimedUntil = @until,
    ClaimEpoch = @Epoch,
    ClaimToken = @waitingToken,
    LastAttemptAt = @now,
    AttemptCount = AttemptCount + 1
WHERE Id IN (
    SELECT TOP (@LongestWaiting) due.Id
    FROM (
        SELECT u.Id, u.NextAttemptAt
        FROM (
            SELECT TOP (@LongestWaiting) c.Id, c.NextAttemptAt
            FROM dbo.Notifications AS c WITH (ROWLOCK, READPAST, UPDLOCK)
            WHERE c.Status IN (N'Pending', N'Retrying') AND c.ClaimedUntil IS NULL
              AND c.Type = @Type AND (c.NextAttemptAt IS NULL OR c.NextAttemptAt <= @now)
            ORDER BY c.NextAttemptAt, c.Id
        ) AS u
        UNION ALL
        SELECT x.Id, x.NextAttemptAt
        FROM (
            SELECT TOP (@LongestWaiting) r.Id, r.NextAttemptAt
            FROM dbo.Notifications AS r WITH (ROWLOCK, READPAST, UPDLOCK)
            WHERE r.ClaimedUntil IS NOT NULL AND r.ClaimedUntil <= @now
              AND r.Type = @Type AND r.Status IN (N'Pending', N'Retrying')
              AND (r.NextAttemptAt IS NULL OR r.NextAttemptAt <= @now)
            ORDER BY r.NextAttemptAt, r.Id
        ) AS x
    ) AS due
    ORDER BY due.NextAttemptAt, due.Id
)
  AND Status IN (N'Pending', N'Retrying')
  AND Type = @Type
  AND (NextAttemptAt IS NULL OR NextAttemptAt <= @now)
  AND (ClaimedUntil IS NULL OR ClaimedUntil <= @now)
  AND EXISTS (SELECT 1 FROM dbo.Leases AS l WHERE l.Name = @Lease AND l.Epoch = @Epoch AND l.ExpiresAt > @now);
IF @turnRows > 0
UPDATE dbo.Notifications
SET ClaimedUntil = @until,
    ClaimEpoch = @Epoch,
    ClaimToken = @turnToken,
    LastAttemptAt = @now,
    AttemptCount = AttemptCount + 1
WHERE Id IN (
    SELECT TOP (@turnRows) c.Id
    FROM dbo.Notifications AS c WITH (ROWLOCK, READPAST, UPDLOCK)
    WHERE c.Status IN (N'Pending', N'Retrying') AND c.Priority >= 0 AND c.Type = @Type
      AND (c.ClaimedUntil IS NULL OR c.ClaimedUntil <= @now)
      AND (c.NextAttemptAt IS NULL OR c.NextAttemptAt <= @now)
    ORDER BY c.Priority, c.ServeTurn, c.Id
)
  AND Status IN (N'Pending', N'Retrying')
  AND Type = @Type
  AND (NextAttemptAt IS NULL OR NextAttemptAt <= @now)
  AND (ClaimedUntil IS NULL OR ClaimedUntil <= @now)
  AND (ClaimToken IS NULL OR ClaimToken <> @waitingToken)
  AND EXISTS (SELECT 1 FROM dbo.Leases AS l WHERE l.Name = @Lease AND l.Epoch = @Epoch AND l.ExpiresAt > @now);
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, LeaseEpoch)
SELECT n.NotificationId, n.AttemptCount, @now, N'InFlight', @Epoch
FROM dbo.Notifications AS n
WHERE n.Type = @Type AND n.ClaimedUntil = @until AND n.ClaimToken IN (@waitingToken, @turnToken);
SELECT n.Id, n.NotificationId, n.Type, n.ListName, n.Subject, n.Body, n.TypeData, n.RetryCount, n.AttemptCount, n.SourceSiteId, n.SourceInstanceId, n.SourceScript, n.OriginExecutionId, n.OriginParentExecutionId, n.SiteEnqueuedAt, n.Priority
FROM dbo.Notifications AS n
WHERE n.Type = @Type AND n.ClaimedUntil = @until AND n.ClaimToken IN (@waitingToken, @turnToken)
ORDER BY CASE WHEN n.ClaimToken = @waitingToken THEN 0 ELSE 1 END,
    CASE WHEN n.ClaimToken = @waitingToken THEN n.NextAttemptAt END,
    CASE WHEN n.ClaimToken = @turnToken THEN n.Priority END,
    CASE WHEN n.ClaimToken = @turnToken THEN n.ServeTurn END,
    n.Id;
COMMIT TRANSACTION;
END;
GO

IF OBJECT_ID(N'dbo.SubmitNotification', N'P') IS NOT NULL
    DROP PROCEDURE dbo.SubmitNotification;
GO

-- The submit of a single notification of migration 0004, which now also stores the row's
-- priority and serve turn: one past the later of the head turn (the smallest turn waiting at
-- that type and priority, in flight or not: the first entry of IX_Notifications_Serve there)
-- and the newest turn its site has waiting there (the last entry of
-- IX_Notifications_Site_Turn, which leaves turn 0 out, changing no turn), 0 standing for
-- nothing waiting (domain::serve_order::serve_turn). Both reads are one seek each, in the
-- INSERT itself. No hint or stricter isolation serialises two submits at once: both may read
-- the same turns and store the same turn, a tie the claim gives to the older row (Id), as the
-- rule does for rows stored together. The rules of the answer are those of migration 0004.
-- @Priority defaults to normal, so a replica still running the previous release during an
-- upgrade keeps submitting.
CREATE PROCEDURE dbo.SubmitNotification
    @NotificationId uniqueidentifier,
    @Type nvarchar(16),
    @ListName nvarchar(256),
    @Subject nvarchar(1000),
    @Body nvarchar(max),
    @TypeData nvarchar(max),
    @ContentHash binary(32),
    @SourceSiteId nvarchar(64),
    @SourceInstanceId nvarchar(512),
    @SourceScript nvarchar(512),
    @OriginExecutionId uniqueidentifier,
    @OriginParentExecutionId uniqueidentifier,
    @SiteEnqueuedAt datetime2(3),
    @Priority int = 2
AS
BEGIN
SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @inserted int = 0;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
IF NOT EXISTS (SELECT 1 FROM dbo.Notifications AS e WHERE e.NotificationId = @NotificationId)
BEGIN
    INSERT INTO dbo.Notifications (NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, Status, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, CreatedAt, NextAttemptAt, Priority, ServeTurn)
    SELECT @NotificationId, @Type, @ListName, @Subject, @Body, @TypeData, @ContentHash, N'Pending', @SourceSiteId, @SourceInstanceId, @SourceScript, @OriginExecutionId, @OriginParentExecutionId, @SiteEnqueuedAt, @now, @now, @Priority,
        1 + CASE WHEN t.SiteLast > t.Head THEN t.SiteLast ELSE t.Head END
    FROM (
        SELECT COALESCE((
                SELECT MIN(s.ServeTurn)
                FROM dbo.Notifications AS s
                WHERE s.Type = @Type AND s.Priority = @Priority
                  AND s.Status IN (N'Pending', N'Retrying') AND s.Priority >= 0), 0) AS Head,
            COALESCE((
                SELECT MAX(l.ServeTurn)
                FROM dbo.Notifications AS l
                WHERE l.Type = @Type AND l.Priority = @Priority AND l.SourceSiteId = @SourceSiteId
                  AND l.Status IN (N'Pending', N'Retrying') AND l.ServeTurn > 0), 0) AS SiteLast
    ) AS t;
    SET @inserted = @@ROWCOUNT;
END;
SELECT n.NotificationId, n.ContentHash, @inserted AS Inserted
FROM dbo.Notifications AS n
WHERE n.NotificationId = @NotificationId;
END;
