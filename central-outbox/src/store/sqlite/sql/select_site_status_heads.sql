-- The sites with changes after a seq, and the newest of each: a range of the primary key.
SELECT SiteId, MAX(Seq) FROM SiteStatusFeed WHERE Seq > ?1 GROUP BY SiteId
