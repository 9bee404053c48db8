-- One change the site stored.
DELETE FROM SiteStatusFeed WHERE SiteId = ?1 AND Seq = ?2
