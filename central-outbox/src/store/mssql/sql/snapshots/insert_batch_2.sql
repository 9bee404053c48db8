SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT l.Name AS ConsolidatingList
FROM dbo.NotificationLists AS l
WHERE (l.ConsolidateThreshold IS NOT NULL OR l.Escalation IS NOT NULL) AND l.Name IN (@P29);
IF @@ROWCOUNT > 0 RETURN;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @inserted TABLE (NotificationId uniqueidentifier NOT NULL PRIMARY KEY);
INSERT INTO dbo.Notifications (NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, Status, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, CreatedAt, NextAttemptAt, Priority, ServeTurn)
OUTPUT inserted.NotificationId INTO @inserted
SELECT w.NotificationId, w.Type, w.ListName, w.Subject, w.Body, w.TypeData, w.ContentHash, N'Pending', w.SourceSiteId, w.SourceInstanceId, w.SourceScript, w.OriginExecutionId, w.OriginParentExecutionId, w.SiteEnqueuedAt, @now, @now, w.Priority, w.ServeTurn
FROM (
    SELECT TOP (2) g.Ord, g.NotificationId, g.Type, g.ListName, g.Subject, g.Body, g.TypeData, g.ContentHash, g.SourceSiteId, g.SourceInstanceId, g.SourceScript, g.OriginExecutionId, g.OriginParentExecutionId, g.SiteEnqueuedAt, g.Priority,
        CASE WHEN g.Head IS NULL AND g.SiteLast IS NULL THEN CASE WHEN g.SiteFirst = g.GroupFirst THEN 0 ELSE 1 END
            WHEN COALESCE(g.SiteLast, 0) > COALESCE(g.Head, 0) THEN g.SiteLast
            ELSE COALESCE(g.Head, 0) END
        + ROW_NUMBER() OVER (PARTITION BY g.Type, g.Priority, g.SourceSiteId COLLATE Latin1_General_BIN2 ORDER BY g.Ord) AS ServeTurn
    FROM (
        SELECT v.Ord, v.NotificationId, v.Type, v.ListName, v.Subject, v.Body, v.TypeData, v.ContentHash, v.SourceSiteId, v.SourceInstanceId, v.SourceScript, v.OriginExecutionId, v.OriginParentExecutionId, v.SiteEnqueuedAt, v.Priority,
            (SELECT MIN(s.ServeTurn)
        FROM dbo.Notifications AS s
        WHERE s.Type = v.Type AND s.Priority = v.Priority
          AND s.Status IN (N'Pending', N'Retrying') AND s.Priority >= 0) AS Head,
        (SELECT MAX(l.ServeTurn)
        FROM dbo.Notifications AS l
        WHERE l.Type = v.Type AND l.Priority = v.Priority AND l.SourceSiteId = v.SourceSiteId
          AND l.Status IN (N'Pending', N'Retrying') AND l.ServeTurn > 0) AS SiteLast,
            MIN(v.Ord) OVER (PARTITION BY v.Type, v.Priority) AS GroupFirst,
            MIN(v.Ord) OVER (PARTITION BY v.Type, v.Priority, v.SourceSiteId COLLATE Latin1_General_BIN2) AS SiteFirst
        FROM (VALUES
            (1, @P1, @P2, @P3, @P4, @P5, @P6, @P7, @P8, @P9, @P10, @P11, @P12, @P13, @P14),
            (2, @P15, @P16, @P17, @P18, @P19, @P20, @P21, @P22, @P23, @P24, @P25, @P26, @P27, @P28)
        ) AS v (Ord, NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, Priority)
        WHERE NOT EXISTS (SELECT 1 FROM dbo.Notifications AS e WHERE e.NotificationId = v.NotificationId)
    ) AS g
    ORDER BY g.Ord
) AS w;
SELECT n.NotificationId, n.ContentHash, CASE WHEN i.NotificationId IS NULL THEN 0 ELSE 1 END AS Inserted
FROM dbo.Notifications AS n
LEFT JOIN @inserted AS i ON i.NotificationId = n.NotificationId
WHERE n.NotificationId IN (@P1, @P15);
