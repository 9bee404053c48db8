-- Up to ?2 watches not renewed since ?1.
DELETE FROM SiteStatusWatchers
WHERE SiteId IN (SELECT SiteId FROM SiteStatusWatchers WHERE WatchedAt < ?1 LIMIT ?2)
