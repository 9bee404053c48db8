-- The columns `admin::read_state` reads, in its order (the same as query_states.sql's).
SELECT Id, NotificationId, Status, Type, ListName, Subject, SourceSiteId,
       RetryCount, LastError, SiteEnqueuedAt, CreatedAt, LastAttemptAt, NextAttemptAt,
       DeliveredAt, ResolvedAt, Priority, ConditionKey, DeliverAfter
FROM Notifications WHERE NotificationId = ?1
