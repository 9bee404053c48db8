SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @targets TABLE (Ord bigint NOT NULL PRIMARY KEY, NotificationId uniqueidentifier NOT NULL);
DECLARE @changed TABLE (NotificationId uniqueidentifier NOT NULL PRIMARY KEY, AttemptCount int NOT NULL);
INSERT INTO @targets (Ord, NotificationId) VALUES (1, @P3), (2, @P4);
BEGIN TRANSACTION;
UPDATE n
SET n.Status = N'Pending', n.RetryCount = 0, n.NextAttemptAt = SYSUTCDATETIME(), n.LastError = NULL, n.ResolvedAt = NULL, n.ClaimedUntil = NULL, n.ClaimEpoch = NULL, n.AttemptCount = n.AttemptCount + 1
OUTPUT inserted.NotificationId, inserted.AttemptCount INTO @changed
FROM dbo.Notifications AS n
JOIN @targets AS t ON t.NotificationId = n.NotificationId
WHERE n.Status = N'Parked';
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
SELECT c.NotificationId, c.AttemptCount, @now, @P1, @P2
FROM @changed AS c;
COMMIT TRANSACTION;
SELECT t.Ord, CASE WHEN c.NotificationId IS NULL THEN 0 ELSE 1 END AS Changed, n.Id, n.NotificationId, n.Status, n.Type, n.ListName, n.Subject, n.SourceSiteId, n.RetryCount, n.LastError, n.SiteEnqueuedAt, n.CreatedAt, n.LastAttemptAt, n.NextAttemptAt, n.DeliveredAt, n.ResolvedAt, n.Priority, n.ConditionKey, n.DeliverAfter
FROM @targets AS t
LEFT JOIN @changed AS c ON c.NotificationId = t.NotificationId
LEFT JOIN dbo.Notifications AS n ON n.NotificationId = t.NotificationId
ORDER BY t.Ord;
