-- The columns `channel::read_webhook` reads, in its order: the webhook row has no relay.
SELECT MaxRetries, RetryDelayMs, Backoff, MaxRetryDelayMs, MaxConcurrentConnections,
       RateLimitPerSecond, RateLimitBurst, TimeoutMs, UpdatedAt
FROM ChannelConfig WHERE Channel = ?1
