-- ON CONFLICT DO NOTHING leaves an existing row untouched; the caller then compares content
-- hashes to tell a duplicate from a conflict. A row cleared at the site (?19 set) arrives
-- resolved: not due, and its clear counts as history entry 1.
INSERT INTO Notifications (
    NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash,
    SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId,
    OriginParentExecutionId, SiteEnqueuedAt, CreatedAt, NextAttemptAt, Priority,
    ServeTurn, ConditionKey, Status, ResolvedAt, AttemptCount)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,
        CASE WHEN ?19 IS NULL THEN ?14 END, ?15, ?16, ?17, ?18, ?19,
        CASE WHEN ?19 IS NULL THEN 0 ELSE 1 END)
ON CONFLICT (NotificationId) DO NOTHING
