-- Provider failover for webhooks (issue 35): a webhook list's fallback endpoints, the ones its
-- attempts go to while its one endpoint fails (central's domain::failover).
--
-- WebhookFallbacks holds the URLs in the admin's order, separated by one space (a parsed URL
-- never holds whitespace; store/stored_list.rs); NULL: none. They are not targets
-- (NotificationListRecipients): a notification goes to one of them, never to all.
--
-- No column changes for the attempts: NotificationAttempts.Provider (the relays' migration) now
-- also names the endpoint an attempt of such a list posted to, as `scheme://host:port`.
ALTER TABLE NotificationLists ADD COLUMN WebhookFallbacks TEXT;
