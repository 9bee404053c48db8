-- The dispatcher's statements as stored procedures: claiming due rows and recording a group of
-- attempt outcomes (its busiest), and taking or renewing its lease (which must stay quick
-- however busy the server is). A call then sends the server a one-line EXEC instead
-- of a long batch, and the body is compiled once per session rather than parsed on every call:
-- on Babelfish, parsing was most of the server's time per delivery (claiming 4 of 3,000 due
-- rows: ~54 ms as a batch, ~2 ms as this procedure; recording 2 outcomes: ~0.7 ms); on SQL
-- Server it saves the batch's compile-cache lookup and the bytes on the wire.
--
-- The statements' rules are those of the batches in sql.rs (XACT_ABORT, one transaction, every
-- condition re-checked in the statement that changes the row, the database's clock). Two
-- Babelfish findings shape them. None uses OUTPUT: inside a procedure, Babelfish 4.4 loses the
-- target table of an UPDATE's OUTPUT clause when it plans the statement again, and the call fails
-- with "missing FROM-clause entry for table". None declares a table variable: each one costs
-- Babelfish ~0.7 ms per call (it creates a temporary table). A later
-- change to a procedure is a new migration that drops and creates it again (Babelfish rejects
-- the create-or-alter form). Batches are separated by GO lines, because CREATE PROCEDURE must
-- be alone in its batch; the migration runner sends them in order in one transaction.

-- Which rows a claim took, without OUTPUT: each claim stamps its rows with a token of its own.
IF COL_LENGTH(N'dbo.Notifications', N'ClaimToken') IS NULL
    ALTER TABLE dbo.Notifications ADD ClaimToken uniqueidentifier NULL;
GO

IF OBJECT_ID(N'dbo.ClaimDueNotifications', N'P') IS NOT NULL
    DROP PROCEDURE dbo.ClaimDueNotifications;
GO

-- Claims up to @Limit due rows of type @Type for @ClaimMs milliseconds under epoch @Epoch of
-- lease @Lease, and writes their InFlight attempt rows, in one transaction; returns the claimed
-- rows, oldest due first. Due rows come from two small filtered indexes: unclaimed
-- Pending/Retrying rows (the due scan), and rows whose claim ran out (the claim rescue: their
-- dispatcher died). READPAST skips rows another claim has locked; the UPDATE re-checks that each
-- row is still due and unclaimed and that the epoch still holds the lease, so two claims never
-- take the same row even where the hints are ignored. The rows this call took are those
-- carrying its token (found through the rescue index by their ClaimedUntil).
CREATE PROCEDURE dbo.ClaimDueNotifications
    @Epoch bigint,
    @ClaimMs int,
    @Limit bigint,
    @Type nvarchar(16),
    @Lease nvarchar(64)
AS
BEGIN
SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @until datetime2(3) = DATEADD(millisecond, @ClaimMs, @now);
DECLARE @token uniqueidentifier = NEWID();
BEGIN TRANSACTION;
UPDATE dbo.Notifications
SET ClaimedUntil = @until,
    ClaimEpoch = @Epoch,
    ClaimToken = @token,
    LastAttemptAt = @now,
    AttemptCount = AttemptCount + 1
WHERE Id IN (
    SELECT TOP (@Limit) due.Id
    FROM (
        SELECT c.Id, c.NextAttemptAt
        FROM dbo.Notifications AS c WITH (ROWLOCK, READPAST, UPDLOCK)
        WHERE c.Status IN (N'Pending', N'Retrying') AND c.ClaimedUntil IS NULL
          AND c.Type = @Type AND (c.NextAttemptAt IS NULL OR c.NextAttemptAt <= @now)
        UNION ALL
        SELECT r.Id, r.NextAttemptAt
        FROM dbo.Notifications AS r WITH (ROWLOCK, READPAST, UPDLOCK)
        WHERE r.ClaimedUntil IS NOT NULL AND r.ClaimedUntil <= @now
          AND r.Type = @Type AND r.Status IN (N'Pending', N'Retrying')
          AND (r.NextAttemptAt IS NULL OR r.NextAttemptAt <= @now)
    ) AS due
    ORDER BY due.NextAttemptAt, due.Id
)
  AND Status IN (N'Pending', N'Retrying')
  AND Type = @Type
  AND (NextAttemptAt IS NULL OR NextAttemptAt <= @now)
  AND (ClaimedUntil IS NULL OR ClaimedUntil <= @now)
  AND EXISTS (SELECT 1 FROM dbo.Leases AS l WHERE l.Name = @Lease AND l.Epoch = @Epoch AND l.ExpiresAt > @now);
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, LeaseEpoch)
SELECT n.NotificationId, n.AttemptCount, @now, N'InFlight', @Epoch
FROM dbo.Notifications AS n
WHERE n.Type = @Type AND n.ClaimedUntil = @until AND n.ClaimToken = @token;
SELECT n.Id, n.NotificationId, n.Type, n.ListName, n.Subject, n.Body, n.TypeData, n.RetryCount, n.AttemptCount, n.SourceSiteId, n.SourceInstanceId, n.SourceScript, n.OriginExecutionId, n.OriginParentExecutionId, n.SiteEnqueuedAt
FROM dbo.Notifications AS n
WHERE n.Type = @Type AND n.ClaimedUntil = @until AND n.ClaimToken = @token
ORDER BY n.NextAttemptAt, n.Id;
COMMIT TRANSACTION;
END;
GO

IF OBJECT_ID(N'dbo.RecordAttemptOutcomes', N'P') IS NOT NULL
    DROP PROCEDURE dbo.RecordAttemptOutcomes;
GO

-- Applies each outcome in @Outcomes (a JSON array, one object per row, no row twice; see
-- sql::record_outcomes) whose claim still stands: the row is still claimed by that attempt
-- under its epoch, and no other node has taken lease @Lease since (it is still at that epoch,
-- lapsed or not). Completes the attempt row only for those, so an outcome not applied leaves its
-- attempt InFlight (a possible duplicate, made visible). Returns the ids of the rows applied:
-- after the UPDATE, those unclaimed at the outcome's attempt whose attempt row is still InFlight
-- (only this attempt's outcome unclaims a row at its attempt number, and the UPDATE holds the
-- rows' locks until the commit; an outcome sent twice finds its attempt completed the second
-- time).
CREATE PROCEDURE dbo.RecordAttemptOutcomes
    @Lease nvarchar(64),
    @Outcomes nvarchar(max)
AS
BEGIN
SET XACT_ABORT ON;
SET NOCOUNT ON;
BEGIN TRANSACTION;
UPDATE n
SET n.Status = o.Status,
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

IF OBJECT_ID(N'dbo.AcquireLease', N'P') IS NOT NULL
    DROP PROCEDURE dbo.AcquireLease;
GO

-- Takes or renews lease @Name for @Holder for @TtlMs milliseconds: renews (same epoch) if the
-- holder was the last to hold it, even if it lapsed (nobody held it in between, so its claims
-- are still its own); takes it with the next epoch if another holder's lease has lapsed; creates
-- it at epoch 1 if it never existed. Returns the epoch held, or no row. Two nodes creating a
-- never-held lease at once: one insert fails on the key (the caller runs it again). The lease
-- row this call wrote is the one with its holder and its new expiry (the UPDATE keeps the row
-- locked until the commit).
CREATE PROCEDURE dbo.AcquireLease
    @Name nvarchar(64),
    @Holder nvarchar(1024),
    @TtlMs int
AS
BEGIN
SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @until datetime2(3) = DATEADD(millisecond, @TtlMs, @now);
BEGIN TRANSACTION;
UPDATE dbo.Leases
SET Epoch = CASE WHEN Holder = @Holder THEN Epoch ELSE Epoch + 1 END,
    Holder = @Holder,
    ExpiresAt = @until
WHERE Name = @Name AND (Holder = @Holder OR ExpiresAt <= @now);
INSERT INTO dbo.Leases (Name, Holder, Epoch, ExpiresAt)
SELECT @Name, @Holder, 1, @until
WHERE NOT EXISTS (SELECT 1 FROM dbo.Leases AS x WHERE x.Name = @Name);
SELECT l.Epoch
FROM dbo.Leases AS l
WHERE l.Name = @Name AND l.Holder = @Holder AND l.ExpiresAt = @until;
COMMIT TRANSACTION;
END;
