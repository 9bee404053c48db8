SET XACT_ABORT ON;
SET NOCOUNT ON;
INSERT INTO dbo.Notifications (NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, Status, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, CreatedAt, NextAttemptAt)
VALUES (@P1, @P2, @P3, @P4, @P5, @P6, @P7, N'Pending', @P8, @P9, @P10, @P11, @P12, @P13, SYSUTCDATETIME(), SYSUTCDATETIME());
