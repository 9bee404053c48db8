-- The site nodes whose latest report was received at or before ?1 (Unix ms): gone for the
-- retention. The table holds at most MAX_NODES_PER_SITE rows a site, so one statement.
DELETE FROM SiteHealth
WHERE ReceivedAt <= ?1
RETURNING SiteId, NodeName
