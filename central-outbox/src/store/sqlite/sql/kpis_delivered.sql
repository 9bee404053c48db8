-- Each site's notifications delivered since ?1, from IX_Notifications_Status_Resolved alone
-- (it holds the site): the rows themselves are never read.
SELECT SourceSiteId, COUNT(*)
FROM Notifications
WHERE Status = 'Delivered' AND ResolvedAt >= ?1
GROUP BY SourceSiteId
