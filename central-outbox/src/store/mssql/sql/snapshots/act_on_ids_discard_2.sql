SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @targets TABLE (Ord bigint NOT NULL PRIMARY KEY, NotificationId uniqueidentifier NOT NULL);
DECLARE @changed TABLE (NotificationId uniqueidentifier NOT NULL PRIMARY KEY, AttemptCount int NOT NULL);
INSERT INTO @targets (Ord, NotificationId) VALUES (1, @P3), (2, @P4);
BEGIN TRANSACTION;
UPDATE n
SET n.Status = N'Discarded', n.ResolvedAt = @now, n.ClaimedUntil = NULL, n.ClaimEpoch = NULL, n.AttemptCount = n.AttemptCount + 1
OUTPUT inserted.NotificationId, inserted.AttemptCount INTO @changed
FROM dbo.Notifications AS n
JOIN @targets AS t ON t.NotificationId = n.NotificationId
WHERE n.Status = N'Parked';
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
SELECT c.NotificationId, c.AttemptCount, @now, @P1, @P2
FROM @changed AS c;
DECLARE @endMark uniqueidentifier = NEWID();
UPDATE i
SET i.Status = N'Discarded', i.EndedAt = @now, i.NextDueAt = NULL, i.NextRound = NULL,
    i.NextStep = NULL, i.HistoryCount = i.HistoryCount + 1, i.MarkToken = @endMark
FROM dbo.Incidents AS i
WHERE (i.Id IN (SELECT n.IncidentId FROM dbo.Notifications AS n JOIN @changed AS c ON c.NotificationId = n.NotificationId WHERE n.IncidentId IS NOT NULL AND (n.IncidentPage IS NULL OR n.IncidentPage = 1))) AND i.Status IN (N'Open', N'Acknowledged', N'Exhausted');
IF @@ROWCOUNT > 0
BEGIN
UPDATE n
SET n.Status = N'Discarded', n.ResolvedAt = @now, n.NextAttemptAt = NULL, n.ClaimedUntil = NULL,
    n.ClaimEpoch = NULL, n.ClaimToken = @endMark, n.AttemptCount = n.AttemptCount + 1
FROM dbo.Notifications AS n
JOIN dbo.Incidents AS i ON i.Id = n.IncidentId
WHERE i.MarkToken = @endMark AND n.IncidentPage > 1
  AND n.Status IN (N'Pending', N'Retrying', N'Held')
  AND (n.ClaimedUntil IS NULL OR n.ClaimedUntil <= @now);
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
SELECT n.NotificationId, n.AttemptCount, @now, N'OperatorDiscard', @P2
FROM dbo.Notifications AS n
JOIN dbo.Incidents AS i ON i.Id = n.IncidentId
WHERE i.MarkToken = @endMark AND n.ClaimToken = @endMark AND n.Status = N'Discarded';
UPDATE n
SET n.PendingEnd = N'Discarded', n.PendingEndBy = @P2
FROM dbo.Notifications AS n
JOIN dbo.Incidents AS i ON i.Id = n.IncidentId
WHERE i.MarkToken = @endMark AND n.IncidentPage > 1
  AND n.Status IN (N'Pending', N'Retrying', N'Held')
  AND n.ClaimedUntil > @now;
INSERT INTO dbo.IncidentHistory (IncidentId, Sequence, At, Kind, Actor, Detail)
SELECT i.Id, i.HistoryCount, @now, N'Discarded', @P2,
    N'its alarm was discarded; ' + CONVERT(nvarchar(12), (
        SELECT COUNT(*) FROM dbo.Notifications AS s
        WHERE s.IncidentId = i.Id AND s.ClaimToken = @endMark AND s.Status = N'Discarded'))
    + N' page notifications not yet sent were stopped'
FROM dbo.Incidents AS i
WHERE i.MarkToken = @endMark;
UPDATE dbo.Incidents SET MarkToken = NULL WHERE MarkToken = @endMark;
END;
COMMIT TRANSACTION;
SELECT t.Ord, CASE WHEN c.NotificationId IS NULL THEN 0 ELSE 1 END AS Changed, n.Id, n.NotificationId, n.Status, n.Type, n.ListName, n.Subject, n.SourceSiteId, n.RetryCount, n.LastError, n.SiteEnqueuedAt, n.CreatedAt, n.LastAttemptAt, n.NextAttemptAt, n.DeliveredAt, n.ResolvedAt, n.Priority, n.ConditionKey, n.DeliverAfter
FROM @targets AS t
LEFT JOIN @changed AS c ON c.NotificationId = t.NotificationId
LEFT JOIN dbo.Notifications AS n ON n.NotificationId = t.NotificationId
ORDER BY t.Ord;
