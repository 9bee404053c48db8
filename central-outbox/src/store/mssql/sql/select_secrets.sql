SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT l.Name, l.WebhookSecret
FROM dbo.NotificationLists AS l
WHERE l.WebhookSecret IS NOT NULL;
SELECT c.Channel, c.Password, c.OAuthClientSecret
FROM dbo.ChannelConfig AS c
WHERE c.Password IS NOT NULL OR c.OAuthClientSecret IS NOT NULL;
