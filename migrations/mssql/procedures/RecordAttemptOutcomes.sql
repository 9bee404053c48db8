-- dbo.RecordAttemptOutcomes, revision 6
--
-- Applies each outcome in @Outcomes (a JSON array, one object per row, no row twice; see
-- sql::record_outcomes) whose claim still stands: the row is still claimed by that attempt
-- under its epoch, and no other node has taken lease @Lease since (it is still at that epoch,
-- lapsed or not). Completes the attempt row only for those, so an outcome not applied leaves its
-- attempt InFlight (a possible duplicate, made visible). Returns the ids of the rows applied:
-- after the UPDATE, those unclaimed at the outcome's attempt whose attempt row is still InFlight
-- (only this attempt's outcome unclaims a row at its attempt number, and the UPDATE holds the
-- rows' locks until the commit; an outcome sent twice finds its attempt completed the second
-- time). The dispatcher's busiest statement with the claim (recording 2 outcomes on Babelfish:
-- ~0.7 ms as a procedure).
--
-- An outcome that would make a Held row Retrying (its digest failed for now) leaves it Held,
-- due again at the retry time, so that it goes out in the next digest of its list rather than
-- on its own (as SQLite's apply_outcome). LastError, ResolvedTargets, Error and Provider (the
-- relay the attempt went to, `host:port`; absent for attempts that reached none) arrive
-- percent-encoded and are decoded by dbo.DecodeOutcomeText (DecodeOutcomeText.sql says why).
--
-- A row superseded or cleared while this attempt was under way (PendingEnd) ends so, now,
-- unless the attempt delivered it: it is not retried or parked after the newer state or the
-- clear. Its history count then goes up by one, after the attempt row is completed (the applied
-- rows are found by the attempt's number first), and its ending is that entry (an ending by a
-- discard of its incident's alarm is recorded as the operator's discard, OperatorDiscard).
--
-- A page message of an incident that parks here, when it belongs to the incident's latest page,
-- the incident is still Open and its policy escalates on a park, makes the next page due now
-- instead of after the wait, with an Escalated history row naming it (one per incident, however
-- many of its messages parked in this call): the incidents are marked with @endToken
-- (MarkToken) and unmarked before the commit.
CREATE PROCEDURE dbo.RecordAttemptOutcomes
    @Lease nvarchar(64),
    @Outcomes nvarchar(max)
AS
BEGIN
SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @endToken uniqueidentifier = NEWID();
BEGIN TRANSACTION;
UPDATE n
SET n.Status = CASE
        WHEN n.PendingEnd IS NOT NULL AND o.Status <> N'Delivered' THEN n.PendingEnd
        WHEN n.Status = N'Held' AND o.Status = N'Retrying' THEN N'Held'
        ELSE o.Status END,
    n.RetryCount = o.RetryCount,
    n.LastError = COALESCE(CASE WHEN CHARINDEX(N'%', o.LastError) > 0 THEN dbo.DecodeOutcomeText(o.LastError) ELSE o.LastError END, n.LastError),
    n.NextAttemptAt = CASE WHEN n.PendingEnd IS NOT NULL AND o.Status <> N'Delivered' THEN NULL ELSE o.NextAttemptAt END,
    n.DeliveredAt = COALESCE(o.DeliveredAt, n.DeliveredAt),
    n.ResolvedAt = CASE WHEN n.PendingEnd IS NOT NULL AND o.Status <> N'Delivered' THEN @now ELSE o.ResolvedAt END,
    n.ResolvedTargets = COALESCE(CASE WHEN CHARINDEX(N'%', o.ResolvedTargets) > 0 THEN dbo.DecodeOutcomeText(o.ResolvedTargets) ELSE o.ResolvedTargets END, n.ResolvedTargets),
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
SET a.Outcome = o.Outcome, a.DurationMs = o.DurationMs,
    a.Error = CASE WHEN CHARINDEX(N'%', o.Error) > 0 THEN dbo.DecodeOutcomeText(o.Error) ELSE o.Error END,
    a.Provider = CASE WHEN CHARINDEX(N'%', o.Provider) > 0 THEN dbo.DecodeOutcomeText(o.Provider) ELSE o.Provider END
FROM dbo.NotificationAttempts AS a
JOIN OPENJSON(@Outcomes) WITH (
    Id bigint '$.Id',
    NotificationId uniqueidentifier '$.NotificationId',
    AttemptNo int '$.AttemptNo',
    Outcome nvarchar(32) '$.Outcome',
    DurationMs bigint '$.DurationMs',
    Error nvarchar(max) '$.Error',
    Provider nvarchar(300) '$.Provider'
) AS o ON o.NotificationId = a.NotificationId AND o.AttemptNo = a.AttemptNo
JOIN dbo.Notifications AS n ON n.Id = o.Id
WHERE n.ClaimEpoch IS NULL AND n.AttemptCount = o.AttemptNo AND a.Outcome = N'InFlight';
UPDATE n
SET n.AttemptCount = n.AttemptCount + 1, n.ClaimToken = @endToken
FROM dbo.Notifications AS n
JOIN OPENJSON(@Outcomes) WITH (Id bigint '$.Id', AttemptNo int '$.AttemptNo', Status nvarchar(16) '$.Status') AS o
  ON o.Id = n.Id
WHERE n.ClaimEpoch IS NULL AND n.AttemptCount = o.AttemptNo AND n.PendingEnd IS NOT NULL
  AND n.Status = n.PendingEnd AND o.Status <> N'Delivered';
IF @@ROWCOUNT > 0
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
SELECT n.NotificationId, n.AttemptCount, @now, CASE n.Status WHEN N'Discarded' THEN N'OperatorDiscard' ELSE n.Status END, n.PendingEndBy
FROM dbo.Notifications AS n
JOIN OPENJSON(@Outcomes) WITH (Id bigint '$.Id') AS o ON o.Id = n.Id
WHERE n.ClaimToken = @endToken;
UPDATE i
SET i.NextDueAt = @now, i.HistoryCount = i.HistoryCount + 1, i.MarkToken = @endToken
FROM dbo.Incidents AS i
WHERE i.Status = N'Open' AND i.EscalateOnPark = 1 AND i.NextDueAt > @now
  AND EXISTS (
    SELECT 1
    FROM dbo.Notifications AS n
    JOIN OPENJSON(@Outcomes) WITH (Id bigint '$.Id', AttemptNo int '$.AttemptNo', Status nvarchar(16) '$.Status') AS o
      ON o.Id = n.Id
    WHERE n.IncidentId = i.Id AND n.IncidentPage = i.PageCount AND o.Status = N'Parked'
      AND n.Status = N'Parked' AND n.ClaimEpoch IS NULL AND n.AttemptCount = o.AttemptNo);
IF @@ROWCOUNT > 0
BEGIN
INSERT INTO dbo.IncidentHistory (IncidentId, Sequence, At, Kind, Actor, Detail)
SELECT i.Id, i.HistoryCount, @now, N'Escalated', N'dispatcher',
    N'notification ' + LOWER(CONVERT(nvarchar(36), (
        SELECT TOP (1) n.NotificationId
        FROM dbo.Notifications AS n
        JOIN OPENJSON(@Outcomes) WITH (Id bigint '$.Id', Status nvarchar(16) '$.Status') AS o
          ON o.Id = n.Id
        WHERE n.IncidentId = i.Id AND n.IncidentPage = i.PageCount AND o.Status = N'Parked'
          AND n.Status = N'Parked'
        ORDER BY n.Id))) + N' of its latest page parked: the next page is due now'
FROM dbo.Incidents AS i
WHERE i.MarkToken = @endToken;
UPDATE dbo.Incidents SET MarkToken = NULL WHERE MarkToken = @endToken;
END;
COMMIT TRANSACTION;
END;
