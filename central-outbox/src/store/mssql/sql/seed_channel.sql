SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
INSERT INTO dbo.ChannelConfig (Channel, Host, Port, TlsMode, AuthMechanism, Username, Password, FromAddress, MaxRetries, RetryDelayMs, Backoff, MaxRetryDelayMs, MaxConcurrentConnections, RateLimitPerSecond, RateLimitBurst, TimeoutMs, OverallTimeoutMs, OAuthTokenUrl, OAuthClientId, OAuthClientSecret, OAuthScope, FallbackRelays, UpdatedAt)
SELECT @P1, @P2, @P3, @P4, @P5, @P6, @P7, @P8, @P9, @P10, @P11, @P12, @P13, @P14, @P15, @P16, @P17, @P18, @P19, @P20, @P21, @P22, @now
WHERE NOT EXISTS (SELECT 1 FROM dbo.ChannelConfig AS x WHERE x.Channel = @P1);
SELECT @@ROWCOUNT AS Inserted;
