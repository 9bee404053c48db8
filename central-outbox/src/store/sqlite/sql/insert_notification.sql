-- ON CONFLICT DO NOTHING leaves an existing row untouched; the caller then compares content
-- hashes to tell a duplicate from a conflict. A row cleared at the site (?19 set) arrives
-- resolved: not due, and its clear counts as history entry 1. A scheduled row (?20, its
-- deliver_after) is due at that time, or now if that has passed already (a row buffered at the
-- site past its time is due like any other arriving row).
INSERT INTO Notifications (
    NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash,
    SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId,
    OriginParentExecutionId, SiteEnqueuedAt, CreatedAt, NextAttemptAt, Priority,
    ServeTurn, ConditionKey, Status, ResolvedAt, AttemptCount, DeliverAfter)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,
        CASE WHEN ?19 IS NULL THEN MAX(?14, COALESCE(?20, ?14)) END, ?15, ?16, ?17, ?18, ?19,
        CASE WHEN ?19 IS NULL THEN 0 ELSE 1 END, ?20)
ON CONFLICT (NotificationId) DO NOTHING
