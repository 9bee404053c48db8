INSERT INTO ChannelConfig (Channel, Host, Port, TlsMode, AuthMechanism, Username,
    Password, FromAddress, MaxRetries, RetryDelayMs, Backoff, MaxRetryDelayMs,
    MaxConcurrentConnections, RateLimitPerSecond, RateLimitBurst, TimeoutMs,
    OverallTimeoutMs, OAuthTokenUrl, OAuthClientId, OAuthClientSecret, OAuthScope,
    UpdatedAt, FallbackRelays)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,
        ?19, ?20, ?21, ?22, ?23)
ON CONFLICT (Channel) DO UPDATE SET
    Host = excluded.Host, Port = excluded.Port, TlsMode = excluded.TlsMode,
    AuthMechanism = excluded.AuthMechanism, Username = excluded.Username,
    Password = excluded.Password, FromAddress = excluded.FromAddress,
    MaxRetries = excluded.MaxRetries, RetryDelayMs = excluded.RetryDelayMs,
    Backoff = excluded.Backoff, MaxRetryDelayMs = excluded.MaxRetryDelayMs,
    MaxConcurrentConnections = excluded.MaxConcurrentConnections,
    RateLimitPerSecond = excluded.RateLimitPerSecond,
    RateLimitBurst = excluded.RateLimitBurst, TimeoutMs = excluded.TimeoutMs,
    OverallTimeoutMs = excluded.OverallTimeoutMs,
    OAuthTokenUrl = excluded.OAuthTokenUrl, OAuthClientId = excluded.OAuthClientId,
    OAuthClientSecret = excluded.OAuthClientSecret, OAuthScope = excluded.OAuthScope,
    UpdatedAt = excluded.UpdatedAt, FallbackRelays = excluded.FallbackRelays
