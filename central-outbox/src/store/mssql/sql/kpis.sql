SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT n.SourceSiteId,
    CAST(SUM(CASE WHEN n.Status IN (N'Pending', N'Retrying', N'Held') THEN 1 ELSE 0 END) AS bigint) AS QueueDepth,
    CAST(SUM(CASE WHEN (n.Status IN (N'Pending', N'Retrying') AND n.CreatedAt < @P2 AND (n.DeliverAfter IS NULL OR n.DeliverAfter < @P2))
                   OR (n.Status = N'Held' AND (n.NextAttemptAt IS NULL OR n.NextAttemptAt < @P2)) THEN 1 ELSE 0 END) AS bigint) AS Stuck,
    CAST(SUM(CASE WHEN n.Status = N'Parked' THEN 1 ELSE 0 END) AS bigint) AS Parked,
    CAST(SUM(CASE WHEN n.Status = N'Delivered' AND n.ResolvedAt >= @P3 THEN 1 ELSE 0 END) AS bigint) AS DeliveredRecently,
    MIN(CASE WHEN (n.Status = N'Pending' AND (n.DeliverAfter IS NULL OR n.DeliverAfter <= @P1))
              OR (n.Status IN (N'Retrying', N'Held') AND (n.NextAttemptAt IS NULL OR n.NextAttemptAt <= @P1))
        THEN CASE WHEN n.DeliverAfter > n.CreatedAt THEN n.DeliverAfter ELSE n.CreatedAt END END) AS OldestDue,
    MIN(CASE WHEN n.Status IN (N'Retrying', N'Held') AND n.NextAttemptAt > @P1
        THEN CASE WHEN n.DeliverAfter > n.CreatedAt THEN n.DeliverAfter ELSE n.CreatedAt END END) AS OldestWaiting
FROM dbo.Notifications AS n
WHERE n.Status IN (N'Pending', N'Retrying', N'Held', N'Parked')
   OR (n.Status = N'Delivered' AND n.ResolvedAt >= @P3)
GROUP BY n.SourceSiteId
ORDER BY n.SourceSiteId;
