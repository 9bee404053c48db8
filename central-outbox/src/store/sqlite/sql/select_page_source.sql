-- The notification a page quotes (the incident's latest of its condition): its content and
-- provenance, copied into each list's message.
SELECT Type, Subject, Body, TypeData, SourceSiteId, SourceInstanceId, SourceScript,
       OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt
FROM Notifications WHERE NotificationId = ?1
