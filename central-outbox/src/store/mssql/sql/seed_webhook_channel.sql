SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
INSERT INTO dbo.ChannelConfig (Channel, MaxRetries, RetryDelayMs, Backoff, MaxRetryDelayMs, MaxConcurrentConnections, RateLimitPerSecond, RateLimitBurst, TimeoutMs, UpdatedAt)
SELECT @P1, @P2, @P3, @P4, @P5, @P6, @P7, @P8, @P9, @now
WHERE NOT EXISTS (SELECT 1 FROM dbo.ChannelConfig AS x WHERE x.Channel = @P1);
SELECT @@ROWCOUNT AS Inserted;
