SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
SELECT (SELECT TOP (1) n.NextAttemptAt
        FROM dbo.Notifications AS n
        WHERE n.Type = @P1 AND n.Status IN (N'Pending', N'Retrying') AND n.ClaimedUntil IS NULL
          AND n.NextAttemptAt > @now
        ORDER BY n.NextAttemptAt) AS NextDue,
    @now AS Now;
