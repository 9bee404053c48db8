SET XACT_ABORT ON;
SET NOCOUNT ON;
INSERT INTO dbo.Notifications (NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, Status, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, CreatedAt, NextAttemptAt, Priority, ServeTurn)
SELECT @P1, @P2, @P3, @P4, @P5, @P6, @P7, N'Pending', @P8, @P9, @P10, @P11, @P12, @P13, SYSUTCDATETIME(), SYSUTCDATETIME(), @P14,
    1 + CASE WHEN COALESCE(t.SiteLast, 0) > COALESCE(t.Head, 0) THEN t.SiteLast ELSE COALESCE(t.Head, 0) END
FROM (
    SELECT (SELECT MIN(s.ServeTurn)
        FROM dbo.Notifications AS s
        WHERE s.Type = @P2 AND s.Priority = @P14
          AND s.Status IN (N'Pending', N'Retrying') AND s.Priority >= 0) AS Head,
        (SELECT MAX(l.ServeTurn)
        FROM dbo.Notifications AS l
        WHERE l.Type = @P2 AND l.Priority = @P14 AND l.SourceSiteId = @P8
          AND l.Status IN (N'Pending', N'Retrying') AND l.ServeTurn > 0) AS SiteLast
) AS t;
