-- Condition keys (central's domain: supersede and clear, as SQLite's migration 0005). A
-- notification may name the condition it is about; a newer one with the same key, list and site
-- supersedes the older waiting ones, and clearing the key ends a site's waiting ones (statuses
-- Superseded and Cleared, both final, each with a history entry: Outcome 'Superseded' with the
-- replacing notification's id in Actor, or 'Cleared' with who cleared it). This migration also
-- created dbo.SubmitNotification again to store the key and supersede by it; it now lives in
-- procedures/SubmitNotification.sql (README.md here). Batches are separated by GO lines as in
-- migration 0005 (a column added by ALTER TABLE can only be named by a later batch).

-- 1 to 128 ASCII characters (domain::ConditionKey), compared byte-wise as SQLite compares them.
IF COL_LENGTH(N'dbo.Notifications', N'ConditionKey') IS NULL
    ALTER TABLE dbo.Notifications ADD ConditionKey nvarchar(128) COLLATE Latin1_General_BIN2 NULL;
GO

-- The two final statuses join the others: the constraint is dropped and created again with them.
IF OBJECT_ID(N'dbo.CK_Notifications_Status', N'C') IS NOT NULL
    ALTER TABLE dbo.Notifications DROP CONSTRAINT CK_Notifications_Status;
GO

IF OBJECT_ID(N'dbo.CK_Notifications_Status', N'C') IS NULL
    ALTER TABLE dbo.Notifications ADD CONSTRAINT CK_Notifications_Status
        CHECK (Status IN (N'Pending', N'Retrying', N'Delivered', N'Parked', N'Discarded', N'Superseded', N'Cleared'));
GO

-- Serves both lookups, as SQLite's IX_Notifications_Condition: the waiting rows of one site and
-- key (and list, for a supersede, enqueued at the site no later than the new row), found as each
-- keyed row is stored or a clear arrives. Only waiting keyed rows are in it, so it stays as small
-- as the keyed part of the queue. Its filter's `ConditionKey IS NOT NULL` also keeps every other
-- statement on waiting rows away from it: only the statements that say it (the supersedes and
-- the clear) imply the filter, which Babelfish's planner (PostgreSQL's) requires before it
-- considers an index, and without statistics it rates alike every index whose filter a
-- statement implies (see migration 0005).
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Condition', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Condition
    ON dbo.Notifications (SourceSiteId, ConditionKey, ListName, SiteEnqueuedAt)
    WHERE Status IN (N'Pending', N'Retrying') AND ConditionKey IS NOT NULL;
END;
GO
