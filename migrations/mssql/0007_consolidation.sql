-- Flood consolidation, opt-in per list (central's domain::consolidation, as SQLite's migration
-- 0006). A list that sets it holds the notifications that arrive over its threshold within one
-- window (status Held, due at the window's end) and sends them as digests; each keeps its own row
-- and history. This migration also created dbo.SubmitNotification and
-- dbo.RecordAttemptOutcomes again (to count and hold, and to keep a Held row Held on a retry)
-- and created dbo.ClaimDigestNotifications; each now lives in its file under procedures/
-- (README.md here). Batches are separated by GO lines as in migrations 0005 and 0006 (a column
-- added by ALTER TABLE can only be named by a later batch).

-- The list's settings: all three set, or none (no consolidation). The constraint keeps them
-- within domain::consolidation::limits, so every reader can use them as stored; SQLite, which
-- cannot add such a constraint to an existing table, skips settings out of those limits
-- instead, which comes to the same for every value the service writes.
-- One column per statement: Babelfish 4.4 rejects an ADD of several columns.
IF COL_LENGTH(N'dbo.NotificationLists', N'ConsolidateThreshold') IS NULL
    ALTER TABLE dbo.NotificationLists ADD ConsolidateThreshold int NULL;
IF COL_LENGTH(N'dbo.NotificationLists', N'ConsolidateWindowSeconds') IS NULL
    ALTER TABLE dbo.NotificationLists ADD ConsolidateWindowSeconds int NULL;
IF COL_LENGTH(N'dbo.NotificationLists', N'ConsolidateMaxPerDigest') IS NULL
    ALTER TABLE dbo.NotificationLists ADD ConsolidateMaxPerDigest int NULL;
GO

IF OBJECT_ID(N'dbo.CK_NotificationLists_Consolidation', N'C') IS NULL
    ALTER TABLE dbo.NotificationLists ADD CONSTRAINT CK_NotificationLists_Consolidation
        CHECK ((ConsolidateThreshold IS NULL AND ConsolidateWindowSeconds IS NULL AND ConsolidateMaxPerDigest IS NULL)
            OR (ConsolidateThreshold BETWEEN 1 AND 100000 AND ConsolidateWindowSeconds BETWEEN 1 AND 43200
                AND ConsolidateMaxPerDigest BETWEEN 2 AND 500));
GO

-- How many notifications arrived for a list in its current window (one row per list: an arrival
-- in a later window starts again at 1, one in an earlier window, from a replica whose clock
-- lags, counts into the later one), counted in the submit's transaction, so every replica counts
-- the same arrivals once. The UPDATE of a list's row is the lock that serialises the counts of
-- its submits. No foreign key to NotificationLists (see migration 0003 for Babelfish's), and a
-- list's row outlives the list, as on SQLite: a list deleted and created again within a window
-- goes on counting. The service writes a list's row when it turns consolidation on
-- (sql::replace_list), so a submit only ever updates it, and two first arrivals never race to
-- insert it.
IF OBJECT_ID(N'dbo.ConsolidationWindows', N'U') IS NULL
BEGIN
CREATE TABLE dbo.ConsolidationWindows (
    ListName    nvarchar(256) COLLATE Latin1_General_BIN2 NOT NULL,
    WindowStart datetime2(3) NOT NULL,
    Arrived     int NOT NULL,
    CONSTRAINT PK_ConsolidationWindows PRIMARY KEY CLUSTERED (ListName)
);
END;
GO

-- The attempt of a notification sent in a digest names the digest (its id: the mail's
-- Message-ID, the webhook's Idempotency-Key). A uniqueidentifier like NotificationId, which the
-- digest's id is: 16 bytes rather than 72, read back as every other id is.
IF COL_LENGTH(N'dbo.NotificationAttempts', N'DigestId') IS NULL
    ALTER TABLE dbo.NotificationAttempts ADD DigestId uniqueidentifier NULL;
GO

-- Held joins the statuses: the constraint is dropped and created again with it.
IF OBJECT_ID(N'dbo.CK_Notifications_Status', N'C') IS NOT NULL
    ALTER TABLE dbo.Notifications DROP CONSTRAINT CK_Notifications_Status;
GO

IF OBJECT_ID(N'dbo.CK_Notifications_Status', N'C') IS NULL
    ALTER TABLE dbo.Notifications ADD CONSTRAINT CK_Notifications_Status
        CHECK (Status IN (N'Pending', N'Retrying', N'Delivered', N'Parked', N'Discarded', N'Superseded', N'Cleared', N'Held'));
GO

-- The digest claim's two reads, as SQLite's: the held rows of one channel by due time (the end
-- of their window, or the retry time after a failed digest), whose first names the list; then
-- those of that list. Only Held rows are in them, so they stay as small as what is held. The
-- second's filter also says `ListName > N''` (true of every list name, which is never empty):
-- only the claim, which says it too, can use that index, so the first read, whose filter both
-- indexes' `Status = N'Held'` would imply, is never planned on the per-list one (Babelfish's
-- planner rates alike every index whose filter a statement implies: see migration 0005).
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Held', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Held
    ON dbo.Notifications (Type, NextAttemptAt, Id)
    INCLUDE (ListName, ClaimedUntil)
    WHERE Status = N'Held';
END;

IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Held_List', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Held_List
    ON dbo.Notifications (Type, ListName, NextAttemptAt, Id)
    INCLUDE (ClaimedUntil)
    WHERE Status = N'Held' AND ListName > N'';
END;
GO

-- A held row can be superseded and cleared like the other waiting ones: the index of migration
-- 0006 is created again with Held in its filter. DROP INDEX IF EXISTS rather than an
-- INDEXPROPERTY guard, which never finds the index on Babelfish (see migration 0005).
DROP INDEX IF EXISTS IX_Notifications_Condition ON dbo.Notifications;
GO

IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Condition', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Condition
    ON dbo.Notifications (SourceSiteId, ConditionKey, ListName, SiteEnqueuedAt)
    WHERE Status IN (N'Pending', N'Retrying', N'Held') AND ConditionKey IS NOT NULL;
END;
GO
