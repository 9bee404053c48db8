-- Flood consolidation, opt-in per list (central's domain::consolidation, as SQLite's migration
-- 0006). A list that sets it holds the notifications that arrive over its threshold within one
-- window (status Held, due at the window's end) and sends them as digests; each keeps its own row
-- and history. Batches are separated by GO lines as in migrations 0005 and 0006 (a column added
-- by ALTER TABLE can only be named by a later batch; CREATE PROCEDURE must be alone in its
-- batch), and the procedures that change are dropped and created again (Babelfish rejects the
-- create-or-alter form). No procedure uses OUTPUT or a table variable (see migration 0002).

-- The list's settings: all three set, or none (no consolidation). The constraint keeps them
-- within domain::consolidation::limits, so every reader can use them as stored; SQLite, which
-- cannot add such a constraint to an existing table, skips settings out of those limits
-- instead, which comes to the same for every value the service writes.
-- One column per statement: Babelfish 4.4 rejects an ADD of several columns.
IF COL_LENGTH(N'dbo.NotificationLists', N'ConsolidateThreshold') IS NULL
    ALTER TABLE dbo.NotificationLists ADD ConsolidateThreshold int NULL;
IF COL_LENGTH(N'dbo.NotificationLists', N'ConsolidateWindowSeconds') IS NULL
    ALTER TABLE dbo.NotificationLists ADD ConsolidateWindowSeconds int NULL;
IF COL_LENGTH(N'dbo.NotificationLists', N'ConsolidateMaxPerDigest') IS NULL
    ALTER TABLE dbo.NotificationLists ADD ConsolidateMaxPerDigest int NULL;
GO

IF OBJECT_ID(N'dbo.CK_NotificationLists_Consolidation', N'C') IS NULL
    ALTER TABLE dbo.NotificationLists ADD CONSTRAINT CK_NotificationLists_Consolidation
        CHECK ((ConsolidateThreshold IS NULL AND ConsolidateWindowSeconds IS NULL AND ConsolidateMaxPerDigest IS NULL)
            OR (ConsolidateThreshold BETWEEN 1 AND 100000 AND ConsolidateWindowSeconds BETWEEN 1 AND 43200
                AND ConsolidateMaxPerDigest BETWEEN 2 AND 500));
GO

-- How many notifications arrived for a list in its current window (one row per list: an arrival
-- in a later window starts again at 1, one in an earlier window, from a replica whose clock
-- lags, counts into the later one), counted in the submit's transaction, so every replica counts
-- the same arrivals once. The UPDATE of a list's row is the lock that serialises the counts of
-- its submits. No foreign key to NotificationLists (see migration 0003 for Babelfish's), and a
-- list's row outlives the list, as on SQLite: a list deleted and created again within a window
-- goes on counting. The service writes a list's row when it turns consolidation on
-- (sql::replace_list), so a submit only ever updates it, and two first arrivals never race to
-- insert it.
IF OBJECT_ID(N'dbo.ConsolidationWindows', N'U') IS NULL
BEGIN
CREATE TABLE dbo.ConsolidationWindows (
    ListName    nvarchar(256) COLLATE Latin1_General_BIN2 NOT NULL,
    WindowStart datetime2(3) NOT NULL,
    Arrived     int NOT NULL,
    CONSTRAINT PK_ConsolidationWindows PRIMARY KEY CLUSTERED (ListName)
);
END;
GO

-- The attempt of a notification sent in a digest names the digest (its id: the mail's
-- Message-ID, the webhook's Idempotency-Key). A uniqueidentifier like NotificationId, which the
-- digest's id is: 16 bytes rather than 72, read back as every other id is.
IF COL_LENGTH(N'dbo.NotificationAttempts', N'DigestId') IS NULL
    ALTER TABLE dbo.NotificationAttempts ADD DigestId uniqueidentifier NULL;
GO

-- Held joins the statuses: the constraint is dropped and created again with it.
IF OBJECT_ID(N'dbo.CK_Notifications_Status', N'C') IS NOT NULL
    ALTER TABLE dbo.Notifications DROP CONSTRAINT CK_Notifications_Status;
GO

IF OBJECT_ID(N'dbo.CK_Notifications_Status', N'C') IS NULL
    ALTER TABLE dbo.Notifications ADD CONSTRAINT CK_Notifications_Status
        CHECK (Status IN (N'Pending', N'Retrying', N'Delivered', N'Parked', N'Discarded', N'Superseded', N'Cleared', N'Held'));
GO

-- The digest claim's two reads, as SQLite's: the held rows of one channel by due time (the end
-- of their window, or the retry time after a failed digest), whose first names the list; then
-- those of that list. Only Held rows are in them, so they stay as small as what is held. The
-- second's filter also says `ListName > N''` (true of every list name, which is never empty):
-- only the claim, which says it too, can use that index, so the first read, whose filter both
-- indexes' `Status = N'Held'` would imply, is never planned on the per-list one (Babelfish's
-- planner rates alike every index whose filter a statement implies: see migration 0005).
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Held', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Held
    ON dbo.Notifications (Type, NextAttemptAt, Id)
    INCLUDE (ListName, ClaimedUntil)
    WHERE Status = N'Held';
END;

IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Held_List', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Held_List
    ON dbo.Notifications (Type, ListName, NextAttemptAt, Id)
    INCLUDE (ClaimedUntil)
    WHERE Status = N'Held' AND ListName > N'';
END;
GO

-- A held row can be superseded and cleared like the other waiting ones: the index of migration
-- 0006 is created again with Held in its filter. DROP INDEX IF EXISTS rather than an
-- INDEXPROPERTY guard, which never finds the index on Babelfish (see migration 0005).
DROP INDEX IF EXISTS IX_Notifications_Condition ON dbo.Notifications;
GO

IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Condition', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Condition
    ON dbo.Notifications (SourceSiteId, ConditionKey, ListName, SiteEnqueuedAt)
    WHERE Status IN (N'Pending', N'Retrying', N'Held') AND ConditionKey IS NOT NULL;
END;
GO

IF OBJECT_ID(N'dbo.SubmitNotification', N'P') IS NOT NULL
    DROP PROCEDURE dbo.SubmitNotification;
GO

-- The submit of a single notification of migration 0006, which now also counts an accepted row
-- not cleared at the site as an arrival of its list's current window when the list
-- consolidates, and stores it Held, due at the window's end, when it is over the list's
-- threshold and not critical (priority rank 0), in the same transaction, as the SQLite backend
-- stores a row (its turn is the one it would have had: a Held row is never served in turn).
-- Windows are aligned to the Unix epoch (domain::consolidation::Consolidation::window_of): the
-- window of @now starts @now less its milliseconds since 1970-01-01 modulo the window's length.
-- A keyed row's supersede ends Held rows too. Every row of a submit of many rows is stored at
-- the batch's @SubmittedAt (sql::insert_in_order), so the rows of one submit arrive in one
-- window whatever the clock says, as on SQLite; the rows of a consolidating list always go
-- through this procedure, in batch order (sql::insert_rows). The rules of migrations 0004 to
-- 0006 are unchanged, and so are the parameters: a replica still running the previous release
-- during an upgrade keeps submitting (and its rows are counted and held).
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
    @Priority int = 2,
    @ConditionKey nvarchar(128) = NULL,
    @ClearedAtSite datetime2(3) = NULL,
    @ClearedBy nvarchar(256) = NULL,
    @SubmittedAt datetime2(3) = NULL
AS
BEGIN
SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @inserted int = 0;
DECLARE @now datetime2(3) = COALESCE(@SubmittedAt, SYSUTCDATETIME());
DECLARE @threshold int;
DECLARE @window int;
DECLARE @start datetime2(3);
DECLARE @arrived int;
DECLARE @heldUntil datetime2(3);
IF NOT EXISTS (SELECT 1 FROM dbo.Notifications AS e WHERE e.NotificationId = @NotificationId)
BEGIN
    BEGIN TRANSACTION;
    IF @ClearedAtSite IS NULL
        SELECT @threshold = l.ConsolidateThreshold, @window = l.ConsolidateWindowSeconds
        FROM dbo.NotificationLists AS l
        WHERE l.Name = @ListName;
    IF @threshold IS NOT NULL
    BEGIN
        SET @start = DATEADD(millisecond,
            -CAST(DATEDIFF_BIG(millisecond, CAST('19700101' AS datetime2(3)), @now) % (CAST(@window AS bigint) * 1000) AS int),
            @now);
        UPDATE dbo.ConsolidationWindows
        SET Arrived = CASE WHEN WindowStart < @start THEN 1 ELSE Arrived + 1 END,
            WindowStart = CASE WHEN WindowStart < @start THEN @start ELSE WindowStart END
        WHERE ListName = @ListName;
        IF @@ROWCOUNT = 0
            INSERT INTO dbo.ConsolidationWindows (ListName, WindowStart, Arrived)
            VALUES (@ListName, @start, 1);
        SELECT @arrived = w.Arrived
        FROM dbo.ConsolidationWindows AS w
        WHERE w.ListName = @ListName;
        IF @arrived > @threshold AND @Priority <> 0
            -- Due two seconds after the window's end (domain::consolidation::SETTLE), so a row
            -- of the window still being committed by another session joins the same digest.
            SET @heldUntil = DATEADD(second, @window + 2, @start);
    END;
    INSERT INTO dbo.Notifications (NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, Status, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, CreatedAt, NextAttemptAt, ResolvedAt, AttemptCount, Priority, ServeTurn, ConditionKey)
    SELECT @NotificationId, @Type, @ListName, @Subject, @Body, @TypeData, @ContentHash,
        CASE WHEN @ClearedAtSite IS NOT NULL THEN N'Cleared' WHEN @heldUntil IS NOT NULL THEN N'Held' ELSE N'Pending' END,
        @SourceSiteId, @SourceInstanceId, @SourceScript, @OriginExecutionId, @OriginParentExecutionId, @SiteEnqueuedAt, @now,
        CASE WHEN @ClearedAtSite IS NULL THEN COALESCE(@heldUntil, @now) END,
        CASE WHEN @ClearedAtSite IS NOT NULL THEN @now END,
        CASE WHEN @ClearedAtSite IS NULL THEN 0 ELSE 1 END,
        @Priority,
        1 + CASE WHEN t.SiteLast > t.Head THEN t.SiteLast ELSE t.Head END,
        @ConditionKey
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
    IF @ClearedAtSite IS NOT NULL
        INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
        VALUES (@NotificationId, 1, @ClearedAtSite, N'Cleared', @ClearedBy);
    ELSE IF @ConditionKey IS NOT NULL
    BEGIN
        UPDATE dbo.Notifications
        SET Status = N'Superseded',
            ResolvedAt = @now,
            NextAttemptAt = NULL,
            ClaimedUntil = NULL,
            ClaimEpoch = NULL,
            ClaimToken = @NotificationId,
            AttemptCount = AttemptCount + 1
        WHERE Status IN (N'Pending', N'Retrying', N'Held') AND ConditionKey IS NOT NULL
          AND SourceSiteId = @SourceSiteId AND ConditionKey = @ConditionKey AND ListName = @ListName
          AND SiteEnqueuedAt <= @SiteEnqueuedAt AND NotificationId <> @NotificationId
          AND (ClaimedUntil IS NULL OR ClaimedUntil <= @now);
        IF @@ROWCOUNT > 0
            INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
            SELECT n.NotificationId, n.AttemptCount, @now, N'Superseded', LOWER(CONVERT(nvarchar(36), @NotificationId))
            FROM dbo.Notifications AS n
            WHERE n.Status = N'Superseded' AND n.ResolvedAt = @now AND n.ClaimToken = @NotificationId;
    END;
    COMMIT TRANSACTION;
END;
SELECT n.NotificationId, n.ContentHash, @inserted AS Inserted
FROM dbo.Notifications AS n
WHERE n.NotificationId = @NotificationId;
END;
GO

IF OBJECT_ID(N'dbo.RecordAttemptOutcomes', N'P') IS NOT NULL
    DROP PROCEDURE dbo.RecordAttemptOutcomes;
GO

-- The outcomes of migration 0002, but an outcome that would make a Held row Retrying (its
-- digest failed for now) leaves it Held, due again at the retry time, so that it goes out in
-- the next digest of its list rather than on its own (as SQLite's apply_outcome).
CREATE PROCEDURE dbo.RecordAttemptOutcomes
    @Lease nvarchar(64),
    @Outcomes nvarchar(max)
AS
BEGIN
SET XACT_ABORT ON;
SET NOCOUNT ON;
BEGIN TRANSACTION;
UPDATE n
SET n.Status = CASE WHEN n.Status = N'Held' AND o.Status = N'Retrying' THEN N'Held' ELSE o.Status END,
    n.RetryCount = o.RetryCount,
    n.LastError = COALESCE(o.LastError, n.LastError),
    n.NextAttemptAt = o.NextAttemptAt,
    n.DeliveredAt = COALESCE(o.DeliveredAt, n.DeliveredAt),
    n.ResolvedAt = o.ResolvedAt,
    n.ResolvedTargets = COALESCE(o.ResolvedTargets, n.ResolvedTargets),
    n.ClaimedUntil = NULL,
    n.ClaimEpoch = NULL
FROM dbo.Notifications AS n
JOIN OPENJSON(@Outcomes) WITH (
    Id bigint '$.Id',
    Epoch bigint '$.Epoch',
    AttemptNo int '$.AttemptNo',
    NotificationId uniqueidentifier '$.NotificationId',
    Status nvarchar(16) '$.Status',
    RetryCount int '$.RetryCount',
    LastError nvarchar(max) '$.LastError',
    NextAttemptAt datetime2(7) '$.NextAttemptAt',
    DeliveredAt datetime2(7) '$.DeliveredAt',
    ResolvedAt datetime2(7) '$.ResolvedAt',
    ResolvedTargets nvarchar(max) '$.ResolvedTargets',
    Outcome nvarchar(32) '$.Outcome',
    DurationMs bigint '$.DurationMs',
    Error nvarchar(max) '$.Error'
) AS o ON o.Id = n.Id
WHERE n.ClaimEpoch = o.Epoch AND n.AttemptCount = o.AttemptNo
  AND EXISTS (SELECT 1 FROM dbo.Leases AS l WHERE l.Name = @Lease AND l.Epoch = o.Epoch);
SELECT n.Id
FROM dbo.Notifications AS n
JOIN OPENJSON(@Outcomes) WITH (Id bigint '$.Id', NotificationId uniqueidentifier '$.NotificationId', AttemptNo int '$.AttemptNo') AS o
  ON o.Id = n.Id
JOIN dbo.NotificationAttempts AS a ON a.NotificationId = o.NotificationId AND a.AttemptNo = o.AttemptNo
WHERE n.ClaimEpoch IS NULL AND n.AttemptCount = o.AttemptNo AND a.Outcome = N'InFlight';
UPDATE a
SET a.Outcome = o.Outcome, a.DurationMs = o.DurationMs, a.Error = o.Error
FROM dbo.NotificationAttempts AS a
JOIN OPENJSON(@Outcomes) WITH (
    Id bigint '$.Id',
    NotificationId uniqueidentifier '$.NotificationId',
    AttemptNo int '$.AttemptNo',
    Outcome nvarchar(32) '$.Outcome',
    DurationMs bigint '$.DurationMs',
    Error nvarchar(max) '$.Error'
) AS o ON o.NotificationId = a.NotificationId AND o.AttemptNo = a.AttemptNo
JOIN dbo.Notifications AS n ON n.Id = o.Id
WHERE n.ClaimEpoch IS NULL AND n.AttemptCount = o.AttemptNo AND a.Outcome = N'InFlight';
COMMIT TRANSACTION;
END;
GO

IF OBJECT_ID(N'dbo.ClaimDigestNotifications', N'P') IS NOT NULL
    DROP PROCEDURE dbo.ClaimDigestNotifications;
GO

-- Claims, as digest @DigestId, the due Held rows of one list of type @Type for @ClaimMs
-- milliseconds under epoch @Epoch of lease @Lease (only while that epoch holds it), and writes
-- their InFlight attempt rows, each naming the digest, in one transaction
-- (OutboxStore::claim_digest): the list is that of the longest-due Held row (NextAttemptAt,
-- Id: IX_Notifications_Held), the rows up to the list's ConsolidateMaxPerDigest (500,
-- domain::consolidation::limits::MAX_PER_DIGEST, if the list no longer consolidates or is gone)
-- of its due Held rows of that type, longest due first (IX_Notifications_Held_List). A Held row
-- whose claim ran out (its dispatcher died mid-digest) is due again. Hints and re-checks as in
-- dbo.ClaimDueNotifications (migration 0005): the UPDATE re-checks each row and the lease, the
-- rows it took carry this call's token. Returns the claimed rows, longest due first; none when
-- no Held row is due or the epoch does not hold the lease.
CREATE PROCEDURE dbo.ClaimDigestNotifications
    @Epoch bigint,
    @ClaimMs int,
    @Type nvarchar(16),
    @Lease nvarchar(64),
    @DigestId uniqueidentifier
AS
BEGIN
SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @until datetime2(3) = DATEADD(millisecond, @ClaimMs, @now);
DECLARE @token uniqueidentifier = NEWID();
DECLARE @list nvarchar(256);
DECLARE @max int;
BEGIN TRANSACTION;
IF EXISTS (SELECT 1 FROM dbo.Leases AS l WHERE l.Name = @Lease AND l.Epoch = @Epoch AND l.ExpiresAt > @now)
    SELECT TOP (1) @list = h.ListName
    FROM dbo.Notifications AS h
    WHERE h.Status = N'Held' AND h.Type = @Type AND h.NextAttemptAt <= @now
      AND (h.ClaimedUntil IS NULL OR h.ClaimedUntil <= @now)
    ORDER BY h.NextAttemptAt, h.Id;
IF @list IS NOT NULL
BEGIN
    SELECT @max = l.ConsolidateMaxPerDigest
    FROM dbo.NotificationLists AS l
    WHERE l.Name = @list;
    SET @max = COALESCE(@max, 500);
    UPDATE dbo.Notifications
    SET ClaimedUntil = @until,
        ClaimEpoch = @Epoch,
        ClaimToken = @token,
        LastAttemptAt = @now,
        AttemptCount = AttemptCount + 1
    WHERE Id IN (
        SELECT TOP (@max) c.Id
        FROM dbo.Notifications AS c WITH (ROWLOCK, READPAST, UPDLOCK)
        WHERE c.Status = N'Held' AND c.ListName > N'' AND c.Type = @Type AND c.ListName = @list
          AND c.NextAttemptAt <= @now AND (c.ClaimedUntil IS NULL OR c.ClaimedUntil <= @now)
        ORDER BY c.NextAttemptAt, c.Id
    )
      AND Status = N'Held'
      AND Type = @Type
      AND ListName = @list
      AND NextAttemptAt <= @now
      AND (ClaimedUntil IS NULL OR ClaimedUntil <= @now)
      AND EXISTS (SELECT 1 FROM dbo.Leases AS l WHERE l.Name = @Lease AND l.Epoch = @Epoch AND l.ExpiresAt > @now);
    INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, LeaseEpoch, DigestId)
    SELECT n.NotificationId, n.AttemptCount, @now, N'InFlight', @Epoch, @DigestId
    FROM dbo.Notifications AS n
    WHERE n.Type = @Type AND n.ClaimedUntil = @until AND n.ClaimToken = @token;
END;
SELECT n.Id, n.NotificationId, n.Type, n.ListName, n.Subject, n.Body, n.TypeData, n.RetryCount, n.AttemptCount, n.SourceSiteId, n.SourceInstanceId, n.SourceScript, n.OriginExecutionId, n.OriginParentExecutionId, n.SiteEnqueuedAt, n.Priority
FROM dbo.Notifications AS n
WHERE n.Type = @Type AND n.ClaimedUntil = @until AND n.ClaimToken = @token
ORDER BY n.NextAttemptAt, n.Id;
COMMIT TRANSACTION;
END;
