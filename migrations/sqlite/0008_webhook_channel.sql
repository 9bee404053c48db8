-- The webhook channel's settings join the email channel's in ChannelConfig (one row per channel:
-- 'email', 'webhook'), so the database holds every channel setting and the config file only
-- seeds it (central's bootstrap). A webhook row has no relay: Host, Port, TlsMode and
-- FromAddress become nullable, and a CHECK keeps them required on the email row. SQLite cannot
-- drop NOT NULL from a column, so the table is built again with the same columns and rows
-- (nothing references it, and it has no index but its key).
CREATE TABLE ChannelConfig_new (
    Channel                  TEXT    PRIMARY KEY,
    Host                     TEXT,
    Port                     INTEGER,
    TlsMode                  TEXT,
    Username                 TEXT,
    Password                 TEXT,
    FromAddress              TEXT,
    MaxRetries               INTEGER NOT NULL,
    RetryDelayMs             INTEGER NOT NULL,
    MaxConcurrentConnections INTEGER NOT NULL,
    -- Email: connect and per-command timeout; webhook: one POST.
    TimeoutMs                INTEGER NOT NULL,
    UpdatedAt                INTEGER NOT NULL,
    Backoff                  TEXT    NOT NULL DEFAULT 'fixed',
    MaxRetryDelayMs          INTEGER,
    RateLimitPerSecond       REAL,
    RateLimitBurst           INTEGER,
    OverallTimeoutMs         INTEGER,
    AuthMechanism            TEXT    NOT NULL DEFAULT 'none',
    OAuthTokenUrl            TEXT,
    OAuthClientId            TEXT,
    OAuthClientSecret        TEXT,
    OAuthScope               TEXT,
    CHECK (Channel <> 'email'
        OR (Host IS NOT NULL AND Port IS NOT NULL AND TlsMode IS NOT NULL AND FromAddress IS NOT NULL))
) WITHOUT ROWID;
INSERT INTO ChannelConfig_new (Channel, Host, Port, TlsMode, Username, Password, FromAddress,
    MaxRetries, RetryDelayMs, MaxConcurrentConnections, TimeoutMs, UpdatedAt, Backoff,
    MaxRetryDelayMs, RateLimitPerSecond, RateLimitBurst, OverallTimeoutMs, AuthMechanism,
    OAuthTokenUrl, OAuthClientId, OAuthClientSecret, OAuthScope)
SELECT Channel, Host, Port, TlsMode, Username, Password, FromAddress, MaxRetries, RetryDelayMs,
    MaxConcurrentConnections, TimeoutMs, UpdatedAt, Backoff, MaxRetryDelayMs, RateLimitPerSecond,
    RateLimitBurst, OverallTimeoutMs, AuthMechanism, OAuthTokenUrl, OAuthClientId,
    OAuthClientSecret, OAuthScope
FROM ChannelConfig;
DROP TABLE ChannelConfig;
ALTER TABLE ChannelConfig_new RENAME TO ChannelConfig;
