SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
SELECT CASE WHEN EXISTS (
        SELECT 1 FROM dbo.Leases AS l WHERE l.Name = @P1 AND l.Epoch = @P2 AND l.ExpiresAt > @now)
    THEN 1 ELSE 0 END AS Held, @now AS Now;
SELECT TOP (@P3) i.Id, i.Status, i.Policy, i.ListName, i.LatestId, i.Priority, i.Cycle, i.PageCount,
    i.NextDueAt, i.NextRound, i.NextStep, i.AcknowledgedBy, i.AcknowledgedAt
FROM dbo.Incidents AS i
WHERE i.NextDueAt IS NOT NULL AND i.NextDueAt <= @now
ORDER BY i.NextDueAt, i.Id;
