SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @gone TABLE (SiteId nvarchar(64) NOT NULL, NodeName nvarchar(64) NOT NULL);
DELETE h
OUTPUT deleted.SiteId, deleted.NodeName INTO @gone
FROM dbo.SiteHealth AS h
WHERE h.ReceivedAt <= DATEADD(millisecond, -@P2, DATEADD(second, -@P1, SYSUTCDATETIME()));
SELECT g.SiteId, g.NodeName FROM @gone AS g ORDER BY g.SiteId, g.NodeName;
