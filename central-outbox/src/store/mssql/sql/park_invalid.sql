SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
BEGIN TRANSACTION;
UPDATE n
SET n.Status = N'Parked', n.LastError = @P3, n.ResolvedAt = @now, n.ClaimedUntil = NULL, n.ClaimEpoch = NULL
FROM dbo.Notifications AS n
WHERE n.Id = @P1 AND n.ClaimEpoch = @P2;
UPDATE a
SET a.Outcome = N'PermanentFailure', a.DurationMs = 0, a.Error = @P3
FROM dbo.NotificationAttempts AS a
WHERE a.NotificationId = @P4 AND a.AttemptNo = @P5;
COMMIT TRANSACTION;
