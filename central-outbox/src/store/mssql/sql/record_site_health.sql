SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
BEGIN TRANSACTION;
UPDATE h
SET h.Role = @P3, h.BufferDepth = @P4, h.OldestBufferedAgeMs = @P5, h.LastForwardAt = @P6,
    h.StandbyLagRows = @P7, h.StandbyLagMs = @P8, h.Version = @P9, h.CentralReachable = @P10,
    h.Rejected = @P11, h.SendsRefused = @P12, h.ReceivedAt = @now
FROM dbo.SiteHealth AS h
WHERE h.SiteId = @P1 AND h.NodeName = @P2;
INSERT INTO dbo.SiteHealth (SiteId, NodeName, Role, BufferDepth, OldestBufferedAgeMs, LastForwardAt, StandbyLagRows, StandbyLagMs, Version, CentralReachable, Rejected, SendsRefused, ReceivedAt)
SELECT @P1, @P2, @P3, @P4, @P5, @P6, @P7, @P8, @P9, @P10, @P11, @P12, @now
WHERE NOT EXISTS (SELECT 1 FROM dbo.SiteHealth AS x WHERE x.SiteId = @P1 AND x.NodeName = @P2);
COMMIT TRANSACTION;
