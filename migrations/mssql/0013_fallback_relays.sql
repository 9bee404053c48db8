-- Provider failover (issue 35), the schema of SQLite's migration 0010: an email channel's
-- fallback relays, and which relay each attempt went to (written by
-- procedures/RecordAttemptOutcomes.sql).
--
-- FallbackRelays holds the relays in the admin's order in their one text form,
-- `host:port tls, host:port tls` (domain::smtp_relay); NULL or empty: none.
IF COL_LENGTH(N'dbo.ChannelConfig', N'FallbackRelays') IS NULL
    ALTER TABLE dbo.ChannelConfig ADD FallbackRelays nvarchar(1200) NULL;

-- `host:port` of the relay an attempt was handed to; NULL for attempts recorded before this
-- column, attempts that never reached a channel (released unsent, an unknown list), and
-- webhook attempts (each list names its own endpoints).
IF COL_LENGTH(N'dbo.NotificationAttempts', N'Provider') IS NULL
    ALTER TABLE dbo.NotificationAttempts ADD Provider nvarchar(300) NULL;
