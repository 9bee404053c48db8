SET XACT_ABORT ON;
SET NOCOUNT ON;
UPDATE l
SET l.WebhookSecret = @P3
FROM dbo.NotificationLists AS l
WHERE l.Name = @P1 AND l.WebhookSecret = @P2;
