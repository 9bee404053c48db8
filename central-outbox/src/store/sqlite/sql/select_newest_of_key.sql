-- The newest row of a condition (site ?1, key ?2, list ?3) enqueued at the site after ?4: the
-- latest state, ties by arrival (IX_Notifications_ConditionLatest, read backwards).
SELECT NotificationId FROM Notifications
WHERE SourceSiteId = ?1 AND ConditionKey = ?2 AND ListName = ?3 AND SiteEnqueuedAt > ?4
ORDER BY SiteEnqueuedAt DESC, Id DESC
LIMIT 1
