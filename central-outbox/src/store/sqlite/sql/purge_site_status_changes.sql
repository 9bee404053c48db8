-- Up to ?2 changes decided before ?1 that no site confirmed, oldest first: a scan of the
-- feed, which holds only unconfirmed changes.
DELETE FROM SiteStatusFeed
WHERE Seq IN (SELECT Seq FROM SiteStatusFeed WHERE DecidedAt < ?1 ORDER BY Seq LIMIT ?2)
