SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
BEGIN TRANSACTION;
UPDATE l
SET l.Type = @P2, l.WebhookFormat = @P3, l.WebhookSecret = @P4, l.UpdatedAt = @now
FROM dbo.NotificationLists AS l
WHERE l.Name = @P1;
INSERT INTO dbo.NotificationLists (Name, Type, WebhookFormat, WebhookSecret, UpdatedAt)
SELECT @P1, @P2, @P3, @P4, @now
WHERE NOT EXISTS (SELECT 1 FROM dbo.NotificationLists AS x WHERE x.Name = @P1);
DELETE r
FROM dbo.NotificationListRecipients AS r
WHERE r.ListName = @P1;
INSERT INTO dbo.NotificationListRecipients (ListName, Address) VALUES (@P1, @P5), (@P1, @P6);
COMMIT TRANSACTION;
