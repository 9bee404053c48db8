SELECT SiteId, NodeName, Role, BufferDepth, OldestBufferedAgeMs, LastForwardAt,
       StandbyLagRows, StandbyLagMs, Version, CentralReachable, Rejected, SendsRefused,
       ReceivedAt
FROM SiteHealth
ORDER BY SiteId, NodeName
