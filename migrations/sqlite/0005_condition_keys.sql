-- Condition keys (central's domain: supersede and clear). A notification may name the condition
-- it is about; a newer one with the same key, list and site supersedes the older waiting ones,
-- and clearing the key ends them (statuses Superseded and Cleared, both final).
ALTER TABLE Notifications ADD COLUMN ConditionKey TEXT;

-- Serves both: the waiting rows of one site and key (and list, for a supersede), found as each
-- keyed row is stored or a clear arrives. Only waiting keyed rows are in it, so it stays as
-- small as the keyed part of the queue.
CREATE INDEX IX_Notifications_Condition
    ON Notifications (SourceSiteId, ConditionKey, ListName, SiteEnqueuedAt)
    WHERE Status IN ('Pending', 'Retrying') AND ConditionKey IS NOT NULL;
