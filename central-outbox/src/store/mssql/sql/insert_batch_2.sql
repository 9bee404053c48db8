SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @inserted TABLE (NotificationId uniqueidentifier NOT NULL PRIMARY KEY);
INSERT INTO dbo.Notifications (NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, Status, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, CreatedAt, NextAttemptAt)
OUTPUT inserted.NotificationId INTO @inserted
SELECT v.NotificationId, v.Type, v.ListName, v.Subject, v.Body, v.TypeData, v.ContentHash, N'Pending', v.SourceSiteId, v.SourceInstanceId, v.SourceScript, v.OriginExecutionId, v.OriginParentExecutionId, v.SiteEnqueuedAt, @now, @now
FROM (VALUES
    (@P1, @P2, @P3, @P4, @P5, @P6, @P7, @P8, @P9, @P10, @P11, @P12, @P13),
    (@P14, @P15, @P16, @P17, @P18, @P19, @P20, @P21, @P22, @P23, @P24, @P25, @P26)
) AS v (NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt)
WHERE NOT EXISTS (SELECT 1 FROM dbo.Notifications AS e WHERE e.NotificationId = v.NotificationId);
SELECT n.NotificationId, n.ContentHash, CASE WHEN i.NotificationId IS NULL THEN 0 ELSE 1 END AS Inserted
FROM dbo.Notifications AS n
LEFT JOIN @inserted AS i ON i.NotificationId = n.NotificationId
WHERE n.NotificationId IN (@P1, @P14);
