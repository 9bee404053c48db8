SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
BEGIN TRANSACTION;
UPDATE c
SET c.Host = @P2, c.Port = @P3, c.TlsMode = @P4, c.AuthMechanism = @P5, c.Username = @P6,
    c.Password = @P7, c.FromAddress = @P8, c.MaxRetries = @P9, c.RetryDelayMs = @P10,
    c.Backoff = @P11, c.MaxRetryDelayMs = @P12, c.MaxConcurrentConnections = @P13,
    c.RateLimitPerSecond = @P14, c.RateLimitBurst = @P15, c.TimeoutMs = @P16,
    c.OverallTimeoutMs = @P17, c.OAuthTokenUrl = @P18, c.OAuthClientId = @P19,
    c.OAuthClientSecret = @P20, c.OAuthScope = @P21, c.FallbackRelays = @P22, c.UpdatedAt = @now
FROM dbo.ChannelConfig AS c
WHERE c.Channel = @P1;
INSERT INTO dbo.ChannelConfig (Channel, Host, Port, TlsMode, AuthMechanism, Username, Password, FromAddress, MaxRetries, RetryDelayMs, Backoff, MaxRetryDelayMs, MaxConcurrentConnections, RateLimitPerSecond, RateLimitBurst, TimeoutMs, OverallTimeoutMs, OAuthTokenUrl, OAuthClientId, OAuthClientSecret, OAuthScope, FallbackRelays, UpdatedAt)
SELECT @P1, @P2, @P3, @P4, @P5, @P6, @P7, @P8, @P9, @P10, @P11, @P12, @P13, @P14, @P15, @P16, @P17, @P18, @P19, @P20, @P21, @P22, @now
WHERE NOT EXISTS (SELECT 1 FROM dbo.ChannelConfig AS x WHERE x.Channel = @P1);
COMMIT TRANSACTION;
