-- dbo.ClaimDigestNotifications, revision 3
--
-- Claims, as digest @DigestId, the due Held rows of one list of type @Type for @ClaimMs
-- milliseconds under epoch @Epoch of lease @Lease (only while that epoch holds it), and writes
-- their InFlight attempt rows, each naming the digest, in one transaction
-- (OutboxStore::claim_digest): the list is that of the longest-due Held row (NextAttemptAt,
-- Id: IX_Notifications_Held), the rows up to the list's ConsolidateMaxPerDigest (500,
-- domain::consolidation::limits::MAX_PER_DIGEST, if the list no longer consolidates or is gone)
-- of its due Held rows of that type, longest due first (IX_Notifications_Held_List). A Held row
-- whose claim ran out (its dispatcher died mid-digest) is due again. Hints and re-checks as in
-- dbo.ClaimDueNotifications (ClaimDueNotifications.sql): the UPDATE re-checks each row and the
-- lease, the rows it took carry this call's token. Returns the claimed rows, longest due first;
-- none when no Held row is due or the epoch does not hold the lease.
--
-- First, in the same transaction, the rows a supersede or clear ended while they were claimed
-- and whose claim then expired without an outcome end as recorded (Superseded or Cleared, with
-- their history entry), so that no claim delivers them again (SQLite's settle_pending_ends).
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
DECLARE @settleToken uniqueidentifier = NEWID();
DECLARE @until datetime2(3) = DATEADD(millisecond, @ClaimMs, @now);
DECLARE @token uniqueidentifier = NEWID();
DECLARE @list nvarchar(256);
DECLARE @max int;
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
SELECT n.Id, n.NotificationId, n.Type, n.ListName, n.Subject, n.Body, n.TypeData, n.RetryCount, n.AttemptCount, n.SourceSiteId, n.SourceInstanceId, n.SourceScript, n.OriginExecutionId, n.OriginParentExecutionId, n.SiteEnqueuedAt, n.Priority, n.IncidentId, n.IncidentPage
FROM dbo.Notifications AS n
WHERE n.Type = @Type AND n.ClaimedUntil = @until AND n.ClaimToken = @token
ORDER BY n.NextAttemptAt, n.Id;
COMMIT TRANSACTION;
END;
