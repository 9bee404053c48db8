SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT i.Id, i.ListName, i.SourceSiteId, i.ConditionKey, i.Priority, i.AlarmId, i.LatestId,
    i.Subject, i.Status, i.OpenedAt, i.PageCount, i.Round, i.Step, i.NextDueAt, i.NextRound,
    i.NextStep, i.LatePages, i.AcknowledgedBy, i.AcknowledgedVia, i.AcknowledgedAt, i.EndedAt,
    i.Policy
FROM dbo.Incidents AS i
WHERE i.Id = @P1;
SELECT p.PageNo, p.Cycle, p.Round, p.Step, p.DueAt, p.FiredAt, p.LateMs, p.LeaseEpoch
FROM dbo.IncidentPages AS p
WHERE p.IncidentId = @P1
ORDER BY p.PageNo;
SELECT h.Sequence, h.At, h.Kind, h.Actor, h.Means, h.FromAddress, h.Detail
FROM dbo.IncidentHistory AS h
WHERE h.IncidentId = @P1
ORDER BY h.Sequence;
SELECT n.NotificationId, n.ListName, n.IncidentPage, n.Status
FROM dbo.Notifications AS n
WHERE n.IncidentId = @P1
ORDER BY n.Id;
