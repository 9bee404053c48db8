-- A year of history (issue 37): the KPIs count each site's notifications delivered within the
-- window (a day by default) from this index alone, instead of reading every such row from the
-- table: with the seeds' 365 days of history that is some 14,000 rows per fresh GetKpis per
-- 5,000,000 kept. The same index as before with the site appended, so the purge (Status,
-- ResolvedAt) still uses it and the outcome write still updates one index, not two.
DROP INDEX IX_Notifications_Status_Resolved;
CREATE INDEX IX_Notifications_Status_Resolved ON Notifications (Status, ResolvedAt, SourceSiteId);
