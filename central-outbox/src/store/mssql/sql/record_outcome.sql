SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @applied int;
BEGIN TRANSACTION;
UPDATE n
SET n.Status = CASE WHEN n.Status = N'Held' AND @P1 = N'Retrying' THEN N'Held' ELSE @P1 END,
    n.RetryCount = @P2,
    n.LastError = COALESCE(@P3, n.LastError),
    n.NextAttemptAt = @P4,
    n.DeliveredAt = COALESCE(@P5, n.DeliveredAt),
    n.ResolvedAt = @P6,
    n.ResolvedTargets = COALESCE(@P7, n.ResolvedTargets),
    n.ClaimedUntil = NULL,
    n.ClaimEpoch = NULL
FROM dbo.Notifications AS n
WHERE n.Id = @P8 AND n.ClaimEpoch = @P9 AND n.AttemptCount = @P12
  AND EXISTS (SELECT 1 FROM dbo.Leases AS l WHERE l.Name = @P10 AND l.Epoch = @P9);
SET @applied = @@ROWCOUNT;
UPDATE a
SET a.Outcome = @P13, a.DurationMs = @P14, a.Error = @P15
FROM dbo.NotificationAttempts AS a
WHERE @applied = 1 AND a.NotificationId = @P11 AND a.AttemptNo = @P12;
COMMIT TRANSACTION;
SELECT @applied AS Applied;
