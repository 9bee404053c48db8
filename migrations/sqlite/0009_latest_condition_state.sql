-- The latest state of a condition wins by the site's time, whatever order rows reach central in
-- (a site pair's hand-over delivers the old active's rows after the new active's).
--
-- 1. A keyed row that arrives older (by SiteEnqueuedAt) than a row of the same site, key and
--    list already stored, in any status, is stored Superseded at once. This index finds the
--    newest row of a key; it holds every keyed row (not only the waiting ones), and none of its
--    columns change after insert, so a status change never touches it.
CREATE INDEX IX_Notifications_ConditionLatest
    ON Notifications (SourceSiteId, ConditionKey, ListName, SiteEnqueuedAt)
    WHERE ConditionKey IS NOT NULL;

-- 2. A supersede or a clear ends Parked rows too: a failure of a state the condition has left
--    is no longer worth an operator's retry (which would mail that stale state); it stays in
--    the row's history. The index of the rows a supersede or clear looks at takes them in.
DROP INDEX IX_Notifications_Condition;
CREATE INDEX IX_Notifications_Condition
    ON Notifications (SourceSiteId, ConditionKey, ListName, SiteEnqueuedAt)
    WHERE Status IN ('Pending', 'Retrying', 'Held', 'Parked') AND ConditionKey IS NOT NULL;

-- 3. A keyed row being delivered when a supersede or a clear arrives is not touched then (its
--    attempt is under way); the ending is recorded here instead, and applied when its attempt
--    ends in anything but Delivered (or its claim expires): the row ends Superseded or Cleared
--    rather than going back to Retrying and being mailed after the newer state or the clear.
--    PendingEnd is 'Superseded' or 'Cleared'; PendingEndBy is what the history entry names
--    (the newer row's id, or who cleared it). Both stay on a row delivered anyway, as a record
--    that it went out while being ended.
ALTER TABLE Notifications ADD COLUMN PendingEnd TEXT;
ALTER TABLE Notifications ADD COLUMN PendingEndBy TEXT;

-- The rows whose ending waits for their claim: a claim that expires (its node died) ends them
-- before the next claim could deliver them again.
CREATE INDEX IX_Notifications_PendingEnd ON Notifications (ClaimedUntil)
    WHERE PendingEnd IS NOT NULL AND Status IN ('Pending', 'Retrying', 'Held');
