SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT TOP (@P1) n.Id, n.NotificationId, n.Status, n.Type, n.ListName, n.Subject, n.SourceSiteId, n.RetryCount, n.LastError, n.SiteEnqueuedAt, n.CreatedAt, n.LastAttemptAt, n.NextAttemptAt, n.DeliveredAt, n.ResolvedAt
FROM dbo.Notifications AS n
WHERE 1 = 1
  AND n.Status IN (@P2, @P3)
  AND n.Type = @P4
  AND n.SourceSiteId = @P5
  AND n.ListName = @P6
  AND n.CreatedAt >= @P7
  AND n.CreatedAt < @P8
  AND n.Status IN (N'Pending', N'Retrying') AND n.CreatedAt < @P9
  AND n.ResolvedAt < @P10
  AND CHARINDEX(LOWER(@P11), LOWER(n.Subject)) > 0
  AND (n.CreatedAt < @P12 OR (n.CreatedAt = @P12 AND n.Id < @P13))
ORDER BY n.CreatedAt DESC, n.Id DESC;
