-- Provider failover (issue 35): an email channel's fallback relays, and which relay (or
-- endpoint) each attempt went to.
--
-- FallbackRelays holds the relays in the admin's order in their one text form,
-- `host:port tls, host:port tls` (domain::smtp_relay); NULL or empty: none.
ALTER TABLE ChannelConfig ADD COLUMN FallbackRelays TEXT;

-- `host:port` of the relay an attempt was handed to; NULL for attempts recorded before this
-- column, attempts that never reached a channel (released unsent, an unknown list), and
-- webhook attempts (each list names its own endpoints).
ALTER TABLE NotificationAttempts ADD COLUMN Provider TEXT;
