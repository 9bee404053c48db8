INSERT INTO ChannelConfig (Channel, MaxRetries, RetryDelayMs, Backoff, MaxRetryDelayMs,
    MaxConcurrentConnections, RateLimitPerSecond, RateLimitBurst, TimeoutMs, UpdatedAt)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
ON CONFLICT (Channel) DO UPDATE SET
    MaxRetries = excluded.MaxRetries, RetryDelayMs = excluded.RetryDelayMs,
    Backoff = excluded.Backoff, MaxRetryDelayMs = excluded.MaxRetryDelayMs,
    MaxConcurrentConnections = excluded.MaxConcurrentConnections,
    RateLimitPerSecond = excluded.RateLimitPerSecond,
    RateLimitBurst = excluded.RateLimitBurst, TimeoutMs = excluded.TimeoutMs,
    UpdatedAt = excluded.UpdatedAt
