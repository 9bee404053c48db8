SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT l.Name AS ConsolidatingList
FROM dbo.NotificationLists AS l
WHERE (l.ConsolidateThreshold IS NOT NULL OR l.Escalation IS NOT NULL) AND l.Name IN (@P331);
IF @@ROWCOUNT > 0 RETURN;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @inserted TABLE (NotificationId uniqueidentifier NOT NULL PRIMARY KEY);
BEGIN TRANSACTION;
EXEC dbo.SubmitNotification @NotificationId = @P1, @Type = @P2, @ListName = @P3, @Subject = @P4, @Body = @P5, @TypeData = @P6, @ContentHash = @P7, @SourceSiteId = @P8, @SourceInstanceId = @P9, @SourceScript = @P10, @OriginExecutionId = @P11, @OriginParentExecutionId = @P12, @SiteEnqueuedAt = @P13, @Priority = @P14, @ConditionKey = @P15, @ClearedAtSite = @P16, @ClearedBy = @P17, @DeliverAfter = @P18, @SubmittedAt = @now;
INSERT INTO dbo.Notifications (NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, Status, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, CreatedAt, NextAttemptAt, Priority, ServeTurn)
OUTPUT inserted.NotificationId INTO @inserted
SELECT w.NotificationId, w.Type, w.ListName, w.Subject, w.Body, w.TypeData, w.ContentHash, N'Pending', w.SourceSiteId, w.SourceInstanceId, w.SourceScript, w.OriginExecutionId, w.OriginParentExecutionId, w.SiteEnqueuedAt, @now, @now, w.Priority, w.ServeTurn
FROM (
    SELECT TOP (20) g.Ord, g.NotificationId, g.Type, g.ListName, g.Subject, g.Body, g.TypeData, g.ContentHash, g.SourceSiteId, g.SourceInstanceId, g.SourceScript, g.OriginExecutionId, g.OriginParentExecutionId, g.SiteEnqueuedAt, g.Priority,
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
            (1, @P19, @P20, @P21, @P22, @P23, @P24, @P25, @P26, @P27, @P28, @P29, @P30, @P31, @P32),
            (2, @P33, @P34, @P35, @P36, @P37, @P38, @P39, @P40, @P41, @P42, @P43, @P44, @P45, @P46),
            (3, @P47, @P48, @P49, @P50, @P51, @P52, @P53, @P54, @P55, @P56, @P57, @P58, @P59, @P60),
            (4, @P61, @P62, @P63, @P64, @P65, @P66, @P67, @P68, @P69, @P70, @P71, @P72, @P73, @P74),
            (5, @P75, @P76, @P77, @P78, @P79, @P80, @P81, @P82, @P83, @P84, @P85, @P86, @P87, @P88),
            (6, @P89, @P90, @P91, @P92, @P93, @P94, @P95, @P96, @P97, @P98, @P99, @P100, @P101, @P102),
            (7, @P103, @P104, @P105, @P106, @P107, @P108, @P109, @P110, @P111, @P112, @P113, @P114, @P115, @P116),
            (8, @P117, @P118, @P119, @P120, @P121, @P122, @P123, @P124, @P125, @P126, @P127, @P128, @P129, @P130),
            (9, @P131, @P132, @P133, @P134, @P135, @P136, @P137, @P138, @P139, @P140, @P141, @P142, @P143, @P144),
            (10, @P145, @P146, @P147, @P148, @P149, @P150, @P151, @P152, @P153, @P154, @P155, @P156, @P157, @P158),
            (11, @P159, @P160, @P161, @P162, @P163, @P164, @P165, @P166, @P167, @P168, @P169, @P170, @P171, @P172),
            (12, @P173, @P174, @P175, @P176, @P177, @P178, @P179, @P180, @P181, @P182, @P183, @P184, @P185, @P186),
            (13, @P187, @P188, @P189, @P190, @P191, @P192, @P193, @P194, @P195, @P196, @P197, @P198, @P199, @P200),
            (14, @P201, @P202, @P203, @P204, @P205, @P206, @P207, @P208, @P209, @P210, @P211, @P212, @P213, @P214),
            (15, @P215, @P216, @P217, @P218, @P219, @P220, @P221, @P222, @P223, @P224, @P225, @P226, @P227, @P228),
            (16, @P229, @P230, @P231, @P232, @P233, @P234, @P235, @P236, @P237, @P238, @P239, @P240, @P241, @P242),
            (17, @P243, @P244, @P245, @P246, @P247, @P248, @P249, @P250, @P251, @P252, @P253, @P254, @P255, @P256),
            (18, @P257, @P258, @P259, @P260, @P261, @P262, @P263, @P264, @P265, @P266, @P267, @P268, @P269, @P270),
            (19, @P271, @P272, @P273, @P274, @P275, @P276, @P277, @P278, @P279, @P280, @P281, @P282, @P283, @P284),
            (20, @P285, @P286, @P287, @P288, @P289, @P290, @P291, @P292, @P293, @P294, @P295, @P296, @P297, @P298)
        ) AS v (Ord, NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, Priority)
        WHERE NOT EXISTS (SELECT 1 FROM dbo.Notifications AS e WHERE e.NotificationId = v.NotificationId)
    ) AS g
    ORDER BY g.Ord
) AS w;
EXEC dbo.SubmitNotification @NotificationId = @P299, @Type = @P300, @ListName = @P301, @Subject = @P302, @Body = @P303, @TypeData = @P304, @ContentHash = @P305, @SourceSiteId = @P306, @SourceInstanceId = @P307, @SourceScript = @P308, @OriginExecutionId = @P309, @OriginParentExecutionId = @P310, @SiteEnqueuedAt = @P311, @Priority = @P312, @ConditionKey = @P313, @ClearedAtSite = @P314, @ClearedBy = @P315, @DeliverAfter = @P316, @SubmittedAt = @now;
EXEC dbo.SubmitNotification @NotificationId = @P317, @Type = @P318, @ListName = @P319, @Subject = @P320, @Body = @P321, @TypeData = @P322, @ContentHash = @P323, @SourceSiteId = @P324, @SourceInstanceId = @P325, @SourceScript = @P326, @OriginExecutionId = @P327, @OriginParentExecutionId = @P328, @SiteEnqueuedAt = @P329, @Priority = @P330, @SubmittedAt = @now;
COMMIT TRANSACTION;
SELECT n.NotificationId, n.ContentHash, CASE WHEN i.NotificationId IS NULL THEN 0 ELSE 1 END AS Inserted
FROM dbo.Notifications AS n
LEFT JOIN @inserted AS i ON i.NotificationId = n.NotificationId
WHERE n.NotificationId IN (@P19, @P33, @P47, @P61, @P75, @P89, @P103, @P117, @P131, @P145, @P159, @P173, @P187, @P201, @P215, @P229, @P243, @P257, @P271, @P285);
