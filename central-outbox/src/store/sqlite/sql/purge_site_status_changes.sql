-- Up to ?2 changes decided before ?1 that no site confirmed, oldest first.
DELETE FROM SiteStatusFeed
WHERE Seq IN (SELECT Seq FROM SiteStatusFeed WHERE DecidedAt < ?1 ORDER BY DecidedAt LIMIT ?2)
