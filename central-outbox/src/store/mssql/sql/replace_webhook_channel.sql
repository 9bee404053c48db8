SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
BEGIN TRANSACTION;
UPDATE c
SET c.MaxRetries = @P2, c.RetryDelayMs = @P3, c.Backoff = @P4, c.MaxRetryDelayMs = @P5,
    c.MaxConcurrentConnections = @P6, c.RateLimitPerSecond = @P7, c.RateLimitBurst = @P8,
    c.TimeoutMs = @P9, c.UpdatedAt = @now
FROM dbo.ChannelConfig AS c
WHERE c.Channel = @P1;
INSERT INTO dbo.ChannelConfig (Channel, MaxRetries, RetryDelayMs, Backoff, MaxRetryDelayMs, MaxConcurrentConnections, RateLimitPerSecond, RateLimitBurst, TimeoutMs, UpdatedAt)
SELECT @P1, @P2, @P3, @P4, @P5, @P6, @P7, @P8, @P9, @now
WHERE NOT EXISTS (SELECT 1 FROM dbo.ChannelConfig AS x WHERE x.Channel = @P1);
COMMIT TRANSACTION;
