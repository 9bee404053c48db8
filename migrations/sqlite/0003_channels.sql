-- Webhook lists and the full channel settings (backoff, rate limit, overall timeout, XOAUTH2).

-- A webhook list keeps its endpoint URLs in NotificationListRecipients.Address, its payload format
-- and optional HMAC signing secret here. Both are NULL for email lists.
ALTER TABLE NotificationLists ADD COLUMN WebhookFormat TEXT;
ALTER TABLE NotificationLists ADD COLUMN WebhookSecret TEXT;

-- Retry backoff, rate limit, whole-attempt timeout and the authentication mechanism of a
-- channel. AuthMechanism is 'none', 'password' (Username/Password) or 'xoauth2' (Username and the
-- OAuth2 client-credentials grant in the OAuth* columns).
ALTER TABLE ChannelConfig ADD COLUMN Backoff TEXT NOT NULL DEFAULT 'fixed';
ALTER TABLE ChannelConfig ADD COLUMN MaxRetryDelayMs INTEGER;
ALTER TABLE ChannelConfig ADD COLUMN RateLimitPerSecond REAL;
ALTER TABLE ChannelConfig ADD COLUMN RateLimitBurst INTEGER;
ALTER TABLE ChannelConfig ADD COLUMN OverallTimeoutMs INTEGER;
ALTER TABLE ChannelConfig ADD COLUMN AuthMechanism TEXT NOT NULL DEFAULT 'none';
ALTER TABLE ChannelConfig ADD COLUMN OAuthTokenUrl TEXT;
ALTER TABLE ChannelConfig ADD COLUMN OAuthClientId TEXT;
ALTER TABLE ChannelConfig ADD COLUMN OAuthClientSecret TEXT;
ALTER TABLE ChannelConfig ADD COLUMN OAuthScope TEXT;
UPDATE ChannelConfig SET AuthMechanism = 'password' WHERE Username IS NOT NULL AND Password IS NOT NULL;

-- The due scan per channel: the dispatcher claims each channel's rows separately, so each
-- channel's concurrency and rate limits hold.
CREATE INDEX IX_Notifications_Type_Due ON Notifications (Type, NextAttemptAt, Id)
    WHERE Status IN ('Pending', 'Retrying');
-- It replaces the channel-blind due index.
DROP INDEX IX_Notifications_Due;
