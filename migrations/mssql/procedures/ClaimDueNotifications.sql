-- dbo.ClaimDueNotifications, revision 4
--
-- Claims due rows of type @Type for @ClaimMs milliseconds under epoch @Epoch of lease @Lease,
-- and writes their InFlight attempt rows, in one transaction, in the two orders of
-- domain::serve_order: first up to @LongestWaiting rows due longest (NextAttemptAt, Id: rule
-- 3), then up to @InTurn more by priority and serve turn (Priority, ServeTurn, Id: rules 1 and
-- 2). Returns the claimed rows in that order: the longest-waiting ones first, in theirs, then
-- the others in theirs. The dispatcher's busiest statement with the outcomes: on Babelfish,
-- claiming 4 of 3,000 due rows took ~54 ms as a batch and ~2 ms as a procedure.
--
-- Each half claims in its own order over one small filtered index. The longest-waiting half
-- reads unclaimed Pending/Retrying rows by due time (IX_Notifications_Due) and rows whose claim
-- ran out (their dispatcher died) by their ClaimedUntil (IX_Notifications_ClaimRescue, a few
-- rows if any, sorted): each source gives its first rows in due order (its own TOP) and the half
-- takes the first of those, the same rows as the first of their union. A TOP over the union
-- itself made Babelfish (PostgreSQL) read and sort every due row of the channel (a claim of 12
-- rows with 20,000 due: 7.5 ms, in revision 1 too): it reads an index in order only for the
-- TOP of one table. The in-turn half is one such TOP: IX_Notifications_Serve holds the rows in
-- flight too, so a row whose claim ran out is taken in its turn by the same scan, which passes
-- over the rows still claimed (with 20,000 due, both halves: 2.8 ms).
--
-- ROWLOCK keeps the claim to the rows it takes; UPDLOCK makes two claims reading the same due
-- rows queue for them instead of both reading and then deadlocking on the upgrade; READPAST
-- lets a claim skip the rows another claim holds rather than wait for it to commit and then
-- find them taken. Babelfish ignores the hints: the UPDATE re-checks that each row is still
-- due and unclaimed and that the epoch still holds the lease, so two claims never take the
-- same row either way. Each half stamps its rows with a token of its own (no OUTPUT:
-- migrations/mssql/README.md); the rows this call took are those carrying either token (found
-- through IX_Notifications_ClaimRescue by their ClaimedUntil), and the token tells which order
-- a row was taken in. The in-turn half runs second, so it never takes a row the first just took:
-- that row is no longer unclaimed, and its token rules it out even when a zero claim time
-- makes it look expired at once.
--
-- @Limit is revision 1's single size (oldest due first): a replica still running a release
-- from before serve order keeps claiming during an upgrade, in turn.
--
-- First, in the same transaction, the rows a supersede or clear ended while they were claimed
-- and whose claim then expired without an outcome end as recorded (Superseded or Cleared, with
-- their history entry), so that no claim delivers them again (SQLite's settle_pending_ends).
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
DECLARE @settleToken uniqueidentifier = NEWID();
DECLARE @until datetime2(3) = DATEADD(millisecond, @ClaimMs, @now);
DECLARE @waitingToken uniqueidentifier = NEWID();
DECLARE @turnToken uniqueidentifier = NEWID();
DECLARE @turnRows bigint = COALESCE(@InTurn, @Limit, 0);
BEGIN TRANSACTION;
-- Rows superseded or cleared while claimed whose claim expired without an outcome (the node
-- delivering them died) end as recorded, each with its history entry, before this claim could
-- take them again (IX_Notifications_PendingEnd: almost always empty).
UPDATE dbo.Notifications
SET Status = PendingEnd, ResolvedAt = @now, NextAttemptAt = NULL, ClaimedUntil = NULL,
    ClaimEpoch = NULL, ClaimToken = @settleToken, AttemptCount = AttemptCount + 1
WHERE PendingEnd IS NOT NULL AND Status IN (N'Pending', N'Retrying', N'Held') AND ClaimedUntil <= @now;
IF @@ROWCOUNT > 0
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
SELECT n.NotificationId, n.AttemptCount, @now, CASE n.Status WHEN N'Discarded' THEN N'OperatorDiscard' ELSE n.Status END, n.PendingEndBy
FROM dbo.Notifications AS n
WHERE n.Status IN (N'Superseded', N'Cleared') AND n.ResolvedAt = @now AND n.ClaimToken = @settleToken;
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
SELECT n.Id, n.NotificationId, n.Type, n.ListName, n.Subject, n.Body, n.TypeData, n.RetryCount, n.AttemptCount, n.SourceSiteId, n.SourceInstanceId, n.SourceScript, n.OriginExecutionId, n.OriginParentExecutionId, n.SiteEnqueuedAt, n.Priority, n.IncidentId, n.IncidentPage
FROM dbo.Notifications AS n
WHERE n.Type = @Type AND n.ClaimedUntil = @until AND n.ClaimToken IN (@waitingToken, @turnToken)
ORDER BY CASE WHEN n.ClaimToken = @waitingToken THEN 0 ELSE 1 END,
    CASE WHEN n.ClaimToken = @waitingToken THEN n.NextAttemptAt END,
    CASE WHEN n.ClaimToken = @turnToken THEN n.Priority END,
    CASE WHEN n.ClaimToken = @turnToken THEN n.ServeTurn END,
    n.Id;
COMMIT TRANSACTION;
END;
