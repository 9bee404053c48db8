-- The latest state of a condition wins by the site's time, whatever order rows reach central in
-- (a site pair's hand-over delivers the old active's rows after the new active's); the schema
-- of SQLite's migration 0009, with the procedures that use it (SubmitNotification,
-- RecordAttemptOutcomes, ClaimDueNotifications, ClaimDigestNotifications) and the clear
-- (central-outbox/src/store/mssql/sql/clear_condition.sql).
--
-- A keyed row being delivered when a supersede or a clear arrives is left to its attempt, and
-- the ending is recorded on it: PendingEnd ('Superseded' or 'Cleared') and PendingEndBy (what
-- the history entry names: the newer row's id, or who cleared it). The ending applies when the
-- attempt ends in anything but Delivered, or when its claim expires; both columns stay on a row
-- delivered anyway, as a record that it went out while being ended.
IF COL_LENGTH(N'dbo.Notifications', N'PendingEnd') IS NULL
    ALTER TABLE dbo.Notifications ADD PendingEnd nvarchar(16) NULL;
IF COL_LENGTH(N'dbo.Notifications', N'PendingEndBy') IS NULL
    ALTER TABLE dbo.Notifications ADD PendingEndBy nvarchar(256) NULL;
GO

-- A keyed row that arrives older (by SiteEnqueuedAt) than a row of its site, key and list
-- already stored, in any status, is stored Superseded at once: this index finds the newest row
-- of a key. It holds every keyed row, and none of its columns change after the insert.
-- Both indexes here are dropped if they exist and created, so the migration can run again (a
-- conformance test replays the migrations from 0010): an INDEXPROPERTY guard alone never finds
-- an index on Babelfish (see migration 0005); it stays for the rule every CREATE follows.
DROP INDEX IF EXISTS IX_Notifications_ConditionLatest ON dbo.Notifications;
GO
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_ConditionLatest', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_ConditionLatest
    ON dbo.Notifications (SourceSiteId, ConditionKey, ListName, SiteEnqueuedAt)
    WHERE ConditionKey IS NOT NULL;
END;
GO

-- The rows whose ending waits for their claim, found by each claim once the claim expired.
DROP INDEX IF EXISTS IX_Notifications_PendingEnd ON dbo.Notifications;
GO
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_PendingEnd', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_PendingEnd
    ON dbo.Notifications (ClaimedUntil)
    WHERE PendingEnd IS NOT NULL AND Status IN (N'Pending', N'Retrying', N'Held');
END;
GO

-- A supersede or a clear ends Parked rows too (a failure of a state the condition has left is
-- no longer worth an operator's retry, which would mail that stale state): the index of the
-- rows they look at is created again with Parked in its filter. DROP INDEX IF EXISTS rather
-- than an INDEXPROPERTY guard, which never finds the index on Babelfish (see migration 0005).
DROP INDEX IF EXISTS IX_Notifications_Condition ON dbo.Notifications;
GO
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Condition', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Condition
    ON dbo.Notifications (SourceSiteId, ConditionKey, ListName, SiteEnqueuedAt)
    WHERE Status IN (N'Pending', N'Retrying', N'Held', N'Parked') AND ConditionKey IS NOT NULL;
END;
GO
