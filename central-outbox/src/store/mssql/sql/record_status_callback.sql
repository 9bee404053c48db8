SET XACT_ABORT ON;
SET NOCOUNT ON;
BEGIN TRANSACTION;
INSERT INTO dbo.StatusCallbackCalls (NotificationId, CallNo, CalledAt, DurationMs, Status, Outcome, Error, Endpoint)
SELECT @P1, COALESCE(MAX(k.CallNo), 0) + 1, @P2, @P3, @P4, @P5, @P6, @P7
FROM dbo.StatusCallbackCalls AS k
WHERE k.NotificationId = @P1;
DELETE c
FROM dbo.StatusCallbacks AS c
WHERE c.Seq = @P8 AND @P9 IS NULL;
UPDATE c
SET c.Calls = c.Calls + 1, c.NextCallAt = @P9
FROM dbo.StatusCallbacks AS c
WHERE c.Seq = @P8 AND @P9 IS NOT NULL;
COMMIT TRANSACTION;
