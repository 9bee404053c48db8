SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT c.Host, c.Port, c.TlsMode, c.AuthMechanism, c.Username, c.Password, c.FromAddress, c.MaxRetries, c.RetryDelayMs, c.Backoff, c.MaxRetryDelayMs, c.MaxConcurrentConnections, c.RateLimitPerSecond, c.RateLimitBurst, c.TimeoutMs, c.OverallTimeoutMs, c.OAuthTokenUrl, c.OAuthClientId, c.OAuthClientSecret, c.OAuthScope, c.UpdatedAt, c.FallbackRelays
FROM dbo.ChannelConfig AS c
WHERE c.Channel = @P1;
