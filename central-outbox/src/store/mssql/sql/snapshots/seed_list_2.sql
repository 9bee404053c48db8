SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @inserted int;
BEGIN TRANSACTION;
INSERT INTO dbo.NotificationLists (Name, Type, WebhookFormat, WebhookSecret, UpdatedAt, ConsolidateThreshold, ConsolidateWindowSeconds, ConsolidateMaxPerDigest, WebhookFallbacks)
SELECT @P1, @P2, @P3, @P4, @now, @P5, @P6, @P7, @P8
WHERE NOT EXISTS (SELECT 1 FROM dbo.NotificationLists AS x WHERE x.Name = @P1);
SET @inserted = @@ROWCOUNT;
IF @inserted = 1
BEGIN
INSERT INTO dbo.ConsolidationWindows (ListName, WindowStart, Arrived)
SELECT @P1, CAST('19700101' AS datetime2(3)), 0
WHERE @P5 IS NOT NULL AND NOT EXISTS (SELECT 1 FROM dbo.ConsolidationWindows AS w WHERE w.ListName = @P1);
DELETE r
FROM dbo.NotificationListRecipients AS r
WHERE r.ListName = @P1;
INSERT INTO dbo.NotificationListRecipients (ListName, Address) VALUES (@P1, @P9), (@P1, @P10);
UPDATE dbo.NotificationLists
SET Escalation = @P11, EscalationPriorities = @P12, EscalationFirstWaitMs = @P13, EscalationFirstRound = @P14,
    EscalationFirstStep = @P15, EscalateOnPark = @P16, EscalationOpenedNote = @P17,
    StatusCallbackUrl = @P18
WHERE Name = @P1;
END;
COMMIT TRANSACTION;
SELECT @inserted AS Inserted;
