SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT l.Name, l.Type, l.WebhookFormat, l.WebhookSecret, l.UpdatedAt, l.ConsolidateThreshold, l.ConsolidateWindowSeconds, l.ConsolidateMaxPerDigest, l.Escalation, l.WebhookFallbacks, l.StatusCallbackUrl
FROM dbo.NotificationLists AS l
WHERE l.Name = @P1;
SELECT r.ListName, r.Address
FROM dbo.NotificationListRecipients AS r
WHERE r.ListName = @P1;
