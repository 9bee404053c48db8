SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @targets TABLE (Ord bigint NOT NULL PRIMARY KEY, NotificationId uniqueidentifier NOT NULL);
DECLARE @changed TABLE (NotificationId uniqueidentifier NOT NULL PRIMARY KEY, AttemptCount int NOT NULL);
BEGIN TRANSACTION;
INSERT INTO @targets (Ord, NotificationId)
SELECT TOP (@P3) ROW_NUMBER() OVER (ORDER BY n.CreatedAt, n.Id) AS Ord, n.NotificationId
FROM dbo.Notifications AS n WITH (UPDLOCK, ROWLOCK)
WHERE 1 = 1
  AND n.Status IN (@P5)
  AND n.SourceSiteId = @P6
ORDER BY n.CreatedAt, n.Id;
UPDATE n
SET n.Status = N'Pending', n.RetryCount = 0, n.NextAttemptAt = SYSUTCDATETIME(), n.LastError = NULL, n.ResolvedAt = NULL, n.ClaimedUntil = NULL, n.ClaimEpoch = NULL, n.AttemptCount = n.AttemptCount + 1
OUTPUT inserted.NotificationId, inserted.AttemptCount INTO @changed
FROM dbo.Notifications AS n
JOIN @targets AS t ON t.NotificationId = n.NotificationId
WHERE n.Status = N'Parked' AND t.Ord <= @P4;
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
SELECT c.NotificationId, c.AttemptCount, @now, @P1, @P2
FROM @changed AS c;
COMMIT TRANSACTION;
SELECT c.NotificationId
FROM @changed AS c
JOIN @targets AS t ON t.NotificationId = c.NotificationId
ORDER BY t.Ord;
SELECT COUNT_BIG(*) AS Matching FROM @targets;
