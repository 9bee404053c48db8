SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @token uniqueidentifier = NEWID();
BEGIN TRANSACTION;
UPDATE n
SET n.Status = N'Cleared', n.ResolvedAt = @now, n.NextAttemptAt = NULL, n.ClaimedUntil = NULL, n.ClaimEpoch = NULL, n.ClaimToken = @token, n.AttemptCount = n.AttemptCount + 1
FROM dbo.Notifications AS n
WHERE n.Status IN (N'Pending', N'Retrying', N'Held', N'Parked') AND n.ConditionKey IS NOT NULL
  AND n.SourceSiteId = @P1 AND n.ConditionKey = @P2
  AND (n.ClaimedUntil IS NULL OR n.ClaimedUntil <= @now);
UPDATE n
SET n.PendingEnd = N'Cleared', n.PendingEndBy = @P3
FROM dbo.Notifications AS n
WHERE n.Status IN (N'Pending', N'Retrying', N'Held') AND n.ConditionKey IS NOT NULL
  AND n.SourceSiteId = @P1 AND n.ConditionKey = @P2
  AND n.ClaimedUntil > @now;
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
SELECT n.NotificationId, n.AttemptCount, @now, N'Cleared', @P3
FROM dbo.Notifications AS n
WHERE n.Status = N'Cleared' AND n.ResolvedAt = @now AND n.ClaimToken = @token;
SELECT n.NotificationId
FROM dbo.Notifications AS n
WHERE n.Status = N'Cleared' AND n.ResolvedAt = @now AND n.ClaimToken = @token;
