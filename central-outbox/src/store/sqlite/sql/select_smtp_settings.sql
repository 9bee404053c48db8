-- The columns `channel::read_smtp` reads, in its order.
SELECT Host, Port, TlsMode, AuthMechanism, Username, Password, FromAddress,
       MaxRetries, RetryDelayMs, Backoff, MaxRetryDelayMs, MaxConcurrentConnections,
       RateLimitPerSecond, RateLimitBurst, TimeoutMs, OverallTimeoutMs, OAuthTokenUrl,
       OAuthClientId, OAuthClientSecret, OAuthScope, UpdatedAt, FallbackRelays
FROM ChannelConfig WHERE Channel = ?1
