-- Starts or renews a site's watch (SiteStatusWatchers, migration 0014).
INSERT INTO SiteStatusWatchers (SiteId, WatchedAt) VALUES (?1, ?2)
ON CONFLICT (SiteId) DO UPDATE SET WatchedAt = excluded.WatchedAt
