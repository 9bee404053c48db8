SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
SELECT @now AS ReadAt;
SELECT h.SiteId, h.NodeName, h.Role, h.BufferDepth, h.OldestBufferedAgeMs, h.LastForwardAt,
    h.StandbyLagRows, h.StandbyLagMs, h.Version, h.CentralReachable, h.Rejected, h.SendsRefused,
    h.ReceivedAt
FROM dbo.SiteHealth AS h
ORDER BY h.SiteId, h.NodeName;
