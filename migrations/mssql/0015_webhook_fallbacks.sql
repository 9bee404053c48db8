-- Provider failover for webhooks (issue 35), the schema of SQLite's migration 0012: a webhook
-- list's fallback endpoints, the ones its attempts go to while its one endpoint fails
-- (central's domain::failover).
--
-- WebhookFallbacks holds the URLs in the admin's order, separated by one space (a parsed URL
-- never holds whitespace; store/stored_list.rs); NULL: none. At most 4 URLs of at most 2048
-- bytes each do not fit nvarchar(4000), hence max. They are not targets
-- (NotificationListRecipients): a notification goes to one of them, never to all.
--
-- No column changes for the attempts: NotificationAttempts.Provider (the relays' migration) now
-- also names the endpoint an attempt of such a list posted to, as `scheme://host:port`.
IF COL_LENGTH(N'dbo.NotificationLists', N'WebhookFallbacks') IS NULL
    ALTER TABLE dbo.NotificationLists ADD WebhookFallbacks nvarchar(max) NULL;
