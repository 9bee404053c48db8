-- A keyed row just stored (?1) whose site, key and list already have a row enqueued at the site
-- later than it: it is stale on arrival, so it is stored Superseded, its supersede history entry
-- 1. Returns the row's key, with which select_newest_of_key.sql reads the newer row the entry
-- names (a subquery in RETURNING cannot: SQLite uses no index for it, and it read every keyed
-- row ever stored). A tie with the new row itself is not newer: between rows of one site time
-- the later arrival wins (supersede_older.sql ends the earlier one).
UPDATE Notifications
SET Status = 'Superseded', ResolvedAt = ?2, NextAttemptAt = NULL, AttemptCount = 1
WHERE NotificationId = ?1
  AND EXISTS (SELECT 1 FROM Notifications AS newer
              WHERE newer.SourceSiteId = Notifications.SourceSiteId
                AND newer.ConditionKey = Notifications.ConditionKey
                AND newer.ListName = Notifications.ListName
                AND newer.SiteEnqueuedAt > Notifications.SiteEnqueuedAt)
RETURNING SourceSiteId, ConditionKey, ListName, SiteEnqueuedAt
