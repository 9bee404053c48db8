-- The webhook channel's settings join the email channel's in dbo.ChannelConfig (one row per
-- channel: 'email', 'webhook'; as SQLite's migration 0008), so the database holds every channel
-- setting and the config file only seeds it (central's bootstrap). A webhook row has no relay:
-- Host, Port, TlsMode and FromAddress become nullable, and a CHECK keeps them required on the
-- email row.
--
-- Babelfish refuses ALTER COLUMN ... NULL, so the table is built again, as SQLite's is: its rows
-- go to a temporary table (which lives as long as the session, and so across this file's
-- batches, all of one transaction), the table is created anew with the same names, and the rows
-- come back. Each step is guarded, so a re-run finds nothing to do.
IF EXISTS (SELECT 1 FROM sys.columns WHERE object_id = OBJECT_ID(N'dbo.ChannelConfig') AND name = N'Host' AND is_nullable = 0)
BEGIN
    SELECT Channel, Host, Port, TlsMode, AuthMechanism, Username, Password, FromAddress, MaxRetries,
        RetryDelayMs, Backoff, MaxRetryDelayMs, MaxConcurrentConnections, RateLimitPerSecond,
        RateLimitBurst, TimeoutMs, OverallTimeoutMs, OAuthTokenUrl, OAuthClientId,
        OAuthClientSecret, OAuthScope, UpdatedAt
    INTO #ChannelConfigRows
    FROM dbo.ChannelConfig;
    DROP TABLE dbo.ChannelConfig;
END;
GO

IF OBJECT_ID(N'dbo.ChannelConfig', N'U') IS NULL
BEGIN
CREATE TABLE dbo.ChannelConfig (
    Channel                  nvarchar(32) COLLATE Latin1_General_BIN2 NOT NULL,
    Host                     nvarchar(512) NULL,
    Port                     int NULL,
    TlsMode                  nvarchar(16) NULL,
    AuthMechanism            nvarchar(16) NOT NULL CONSTRAINT DF_ChannelConfig_AuthMechanism DEFAULT (N'none'),
    Username                 nvarchar(512) NULL,
    Password                 nvarchar(max) NULL,
    FromAddress              nvarchar(1024) NULL,
    MaxRetries               bigint NOT NULL,
    RetryDelayMs             bigint NOT NULL,
    Backoff                  nvarchar(16) NOT NULL CONSTRAINT DF_ChannelConfig_Backoff DEFAULT (N'fixed'),
    MaxRetryDelayMs          bigint NULL,
    MaxConcurrentConnections int NOT NULL,
    RateLimitPerSecond       float NULL,
    RateLimitBurst           bigint NULL,
    -- Email: connect and per-command timeout; webhook: one POST.
    TimeoutMs                bigint NOT NULL,
    OverallTimeoutMs         bigint NULL,
    OAuthTokenUrl            nvarchar(max) NULL,
    OAuthClientId            nvarchar(max) NULL,
    OAuthClientSecret        nvarchar(max) NULL,
    OAuthScope               nvarchar(max) NULL,
    UpdatedAt                datetime2(3) NOT NULL,
    CONSTRAINT PK_ChannelConfig PRIMARY KEY CLUSTERED (Channel),
    CONSTRAINT CK_ChannelConfig_EmailRelay CHECK (Channel <> N'email'
        OR (Host IS NOT NULL AND Port IS NOT NULL AND TlsMode IS NOT NULL AND FromAddress IS NOT NULL))
);
END;
GO

IF OBJECT_ID(N'tempdb..#ChannelConfigRows') IS NOT NULL
    INSERT INTO dbo.ChannelConfig (Channel, Host, Port, TlsMode, AuthMechanism, Username, Password,
        FromAddress, MaxRetries, RetryDelayMs, Backoff, MaxRetryDelayMs, MaxConcurrentConnections,
        RateLimitPerSecond, RateLimitBurst, TimeoutMs, OverallTimeoutMs, OAuthTokenUrl,
        OAuthClientId, OAuthClientSecret, OAuthScope, UpdatedAt)
    SELECT Channel, Host, Port, TlsMode, AuthMechanism, Username, Password, FromAddress, MaxRetries,
        RetryDelayMs, Backoff, MaxRetryDelayMs, MaxConcurrentConnections, RateLimitPerSecond,
        RateLimitBurst, TimeoutMs, OverallTimeoutMs, OAuthTokenUrl, OAuthClientId,
        OAuthClientSecret, OAuthScope, UpdatedAt
    FROM #ChannelConfigRows;
GO

IF OBJECT_ID(N'tempdb..#ChannelConfigRows') IS NOT NULL
    DROP TABLE #ChannelConfigRows;
GO
