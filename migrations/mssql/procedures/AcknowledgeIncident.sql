-- dbo.AcknowledgeIncident, revision 1
--
-- The first acknowledgement of incident @Id by @Actor (@Means; from @From, where there is one),
-- as store/mssql/escalation.rs decided it from the incident it read (@Status, @PageCount,
-- @NextDueAt): applied only while the incident is still in that state, which the UPDATE
-- re-checks, so an acknowledgement and a page decided from the same state are never both
-- applied. In one transaction: the incident becomes Acknowledged (its reminder, if @ReminderMs is
-- given, due that long after now; nothing else due), its page messages not yet handed to the
-- relay end Acknowledged with a history entry each, those being delivered are marked to end so
-- unless their attempt delivers them (PendingEnd), and its history row says how many were
-- stopped, then @Rest, then the reminder's time. Answers Applied (0: the incident had moved on,
-- and the caller reads it again), Stopped and the database's clock.
--
-- A procedure rather than the batch the other acknowledgements are: the first acknowledgement
-- is the one an operator waits on, and on Babelfish a call is parsed in a fraction of the time
-- of its batch. The acknowledgement that also tells every list reached ("acknowledged by X")
-- stores those notices in the batch (store/mssql/sql/escalation.rs), its shape varying with them.
CREATE PROCEDURE dbo.AcknowledgeIncident
    @Id bigint,
    @Status nvarchar(16),
    @PageCount int,
    @NextDueAt datetime2(3),
    @Actor nvarchar(512),
    @Means nvarchar(16),
    @From nvarchar(128),
    @ReminderMs bigint,
    @Rest nvarchar(max)
AS
BEGIN
SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @applied int = 0;
DECLARE @stopped int = 0;
DECLARE @mark uniqueidentifier = NEWID();
DECLARE @reminder datetime2(3);
IF @ReminderMs IS NOT NULL
    SET @reminder = DATEADD(millisecond, CAST(@ReminderMs % 1000 AS int),
        DATEADD(second, CAST(@ReminderMs / 1000 AS int), @now));
BEGIN TRANSACTION;
UPDATE i
SET i.Status = N'Acknowledged', i.AcknowledgedAt = @now, i.AcknowledgedBy = @Actor,
    i.AcknowledgedVia = @Means, i.NextDueAt = @reminder, i.NextRound = NULL, i.NextStep = NULL,
    i.EndedAt = NULL, i.HistoryCount = i.HistoryCount + 1
FROM dbo.Incidents AS i
WHERE i.Id = @Id AND i.Status = @Status AND i.PageCount = @PageCount
  AND ((@NextDueAt IS NULL AND i.NextDueAt IS NULL) OR i.NextDueAt = @NextDueAt);
SET @applied = @@ROWCOUNT;
IF @applied = 1
BEGIN
    UPDATE n
    SET n.Status = N'Acknowledged', n.ResolvedAt = @now, n.NextAttemptAt = NULL,
        n.ClaimedUntil = NULL, n.ClaimEpoch = NULL, n.ClaimToken = @mark,
        n.AttemptCount = n.AttemptCount + 1
    FROM dbo.Notifications AS n
    WHERE n.IncidentId = @Id AND n.IncidentPage > 1
      AND n.Status IN (N'Pending', N'Retrying', N'Held')
      AND (n.ClaimedUntil IS NULL OR n.ClaimedUntil <= @now);
    SET @stopped = @@ROWCOUNT;
    INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
    SELECT n.NotificationId, n.AttemptCount, @now, N'Acknowledged', LEFT(@Actor, 256)
    FROM dbo.Notifications AS n
    WHERE n.IncidentId = @Id AND n.ClaimToken = @mark AND n.Status = N'Acknowledged';
    UPDATE n
    SET n.PendingEnd = N'Acknowledged', n.PendingEndBy = LEFT(@Actor, 256)
    FROM dbo.Notifications AS n
    WHERE n.IncidentId = @Id AND n.IncidentPage > 1
      AND n.Status IN (N'Pending', N'Retrying', N'Held')
      AND n.ClaimedUntil > @now;
    INSERT INTO dbo.IncidentHistory (IncidentId, Sequence, At, Kind, Actor, Means, FromAddress, Detail)
    SELECT i.Id, i.HistoryCount, @now, N'Acknowledged', @Actor, @Means, @From,
        CONVERT(nvarchar(12), @stopped) + @Rest
        + CASE WHEN @reminder IS NULL THEN N''
               ELSE N'; reminder at ' + CONVERT(nvarchar(23), @reminder, 126) + N'+00:00 unless cleared' END
    FROM dbo.Incidents AS i
    WHERE i.Id = @Id;
END;
COMMIT TRANSACTION;
SELECT @applied AS Applied, @stopped AS Stopped, @now AS Now;
END;
