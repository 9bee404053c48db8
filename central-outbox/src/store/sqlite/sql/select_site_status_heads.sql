-- The sites with changes after a seq, and the newest of each: a range of the primary key.
-- NOT INDEXED because the planner otherwise serves the GROUP BY from IX_SiteStatusFeed_Site and
-- reads the whole feed, which holds days of changes while a site is cut off; this runs after
-- every outcome write.
SELECT SiteId, MAX(Seq) FROM SiteStatusFeed NOT INDEXED WHERE Seq > ?1 GROUP BY SiteId
