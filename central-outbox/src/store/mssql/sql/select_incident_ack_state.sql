SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
SELECT i.Status, i.PageCount, i.NextDueAt, i.AcknowledgedBy, i.AcknowledgedVia, i.AcknowledgedAt,
    i.EndedAt, i.Policy, i.ConditionKey, i.LatestId, i.Priority, @now AS Now
FROM dbo.Incidents AS i
WHERE i.Id = @P1;
