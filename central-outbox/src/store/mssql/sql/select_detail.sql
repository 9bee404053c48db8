SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT n.Id, n.NotificationId, n.Status, n.Type, n.ListName, n.Subject, n.SourceSiteId, n.RetryCount, n.LastError, n.SiteEnqueuedAt, n.CreatedAt, n.LastAttemptAt, n.NextAttemptAt, n.DeliveredAt, n.ResolvedAt, n.Priority, n.ConditionKey, n.DeliverAfter, n.Body, n.TypeData, n.SourceInstanceId, n.SourceScript, n.OriginExecutionId, n.OriginParentExecutionId, n.ResolvedTargets
FROM dbo.Notifications AS n
WHERE n.NotificationId = @P1;
SELECT a.AttemptNo, a.StartedAt, a.DurationMs, a.Outcome, a.Error, a.LeaseEpoch, a.Actor, a.DigestId, a.Provider
FROM dbo.NotificationAttempts AS a
WHERE a.NotificationId = @P1
ORDER BY a.AttemptNo;
SELECT k.CallNo, k.CalledAt, k.DurationMs, k.Status, k.Outcome, k.Error, k.Endpoint
FROM dbo.StatusCallbackCalls AS k
WHERE k.NotificationId = @P1
ORDER BY k.CallNo;
