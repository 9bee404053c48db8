-- The head of `admin::query`, which appends the filter's conditions, the keyset and the ORDER
-- BY and LIMIT. The columns are those `admin::read_state` reads, in its order (the same as
-- select_state.sql's).
SELECT Id, NotificationId, Status, Type, ListName, Subject, SourceSiteId,
       RetryCount, LastError, SiteEnqueuedAt, CreatedAt, LastAttemptAt, NextAttemptAt,
       DeliveredAt, ResolvedAt, Priority, ConditionKey, DeliverAfter
FROM Notifications WHERE 1 = 1
