SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT TOP (@P1) n.Id, n.NotificationId, n.Status, n.Type, n.ListName, n.Subject, n.SourceSiteId, n.RetryCount, n.LastError, n.SiteEnqueuedAt, n.CreatedAt, n.LastAttemptAt, n.NextAttemptAt, n.DeliveredAt, n.ResolvedAt, n.Priority, n.ConditionKey, n.DeliverAfter
FROM dbo.Notifications AS n
WHERE 1 = 1
  AND n.Status IN (@P2, @P3)
  AND n.Type = @P4
  AND n.Priority IN (@P5, @P6)
  AND n.ConditionKey = @P7
  AND n.SourceSiteId = @P8
  AND n.ListName = @P9
  AND n.CreatedAt >= @P10
  AND n.CreatedAt < @P11
  AND ((n.Status IN (N'Pending', N'Retrying') AND n.CreatedAt < @P12 AND (n.DeliverAfter IS NULL OR n.DeliverAfter < @P13)) OR (n.Status = N'Held' AND (n.NextAttemptAt IS NULL OR n.NextAttemptAt < @P14)))
  AND n.Status = N'Pending' AND n.DeliverAfter > @P15
  AND n.ResolvedAt < @P16
  AND CHARINDEX(LOWER(@P17), LOWER(n.Subject)) > 0
  AND (n.CreatedAt < @P18 OR (n.CreatedAt = @P18 AND n.Id < @P19))
ORDER BY n.CreatedAt DESC, n.Id DESC;
