SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @stored int;
BEGIN TRANSACTION;
UPDATE h
SET h.Role = @P3, h.BufferDepth = @P4, h.OldestBufferedAgeMs = @P5, h.LastForwardAt = @P6,
    h.StandbyLagRows = @P7, h.StandbyLagMs = @P8, h.Version = @P9, h.CentralReachable = @P10,
    h.Rejected = @P11, h.SendsRefused = @P12, h.ReceivedAt = @now
FROM dbo.SiteHealth AS h
WHERE h.SiteId = @P1 AND h.NodeName = @P2;
SET @stored = @@ROWCOUNT;
INSERT INTO dbo.SiteHealth (SiteId, NodeName, Role, BufferDepth, OldestBufferedAgeMs, LastForwardAt, StandbyLagRows, StandbyLagMs, Version, CentralReachable, Rejected, SendsRefused, ReceivedAt)
SELECT @P1, @P2, @P3, @P4, @P5, @P6, @P7, @P8, @P9, @P10, @P11, @P12, @now
WHERE @stored = 0
    AND (SELECT COUNT(*) FROM dbo.SiteHealth AS s WHERE s.SiteId = @P1) < @P13;
SET @stored = @stored + @@ROWCOUNT;
COMMIT TRANSACTION;
SELECT @stored AS Stored;
