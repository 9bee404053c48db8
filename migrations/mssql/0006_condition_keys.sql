-- Condition keys (central's domain: supersede and clear, as SQLite's migration 0005). A
-- notification may name the condition it is about; a newer one with the same key, list and site
-- supersedes the older waiting ones, and clearing the key ends a site's waiting ones (statuses
-- Superseded and Cleared, both final, each with a history entry: Outcome 'Superseded' with the
-- replacing notification's id in Actor, or 'Cleared' with who cleared it). Batches are separated
-- by GO lines as in migration 0005 (a column added by ALTER TABLE can only be named by a later
-- batch; CREATE PROCEDURE must be alone in its batch).

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

IF OBJECT_ID(N'dbo.SubmitNotification', N'P') IS NOT NULL
    DROP PROCEDURE dbo.SubmitNotification;
GO

-- The submit of a single notification of migration 0005, which now also stores the row's
-- condition key, stores a row cleared at the site (@ClearedAtSite, by @ClearedBy) as Cleared
-- with its history entry, and lets an accepted keyed row supersede the older waiting ones, all
-- in one transaction, as the SQLite backend stores a row:
-- - A row cleared at the site is stored Cleared, resolved now, never due (NextAttemptAt NULL),
--   with one history entry (number 1, at the site's time of the clear, by the site). It
--   supersedes nothing: the site's own clear reaches central too.
-- - Otherwise an accepted row with a key ends, as Superseded, the waiting rows of its site, list
--   and key enqueued at the site no later than it and not claimed (or whose claim ran out): each
--   one's history count goes up by one and its entry, numbered that count, names this row.
-- No OUTPUT and no table variable (see migration 0002): the UPDATE stamps the rows it ends with
-- this row's id in ClaimToken (which only a claim of a waiting row reads), so the history
-- INSERT finds exactly those rows (Status Superseded, resolved at @now, this token) through
-- IX_Notifications_Status_Resolved. The turn, the answer and the rules of migrations 0004 and
-- 0005 are unchanged. A submit of many rows calls this procedure for each keyed row, in batch
-- order, inside one transaction of its own (store/mssql/sql.rs, insert_in_order): there the
-- BEGIN and COMMIT below only nest, each call sees the rows the calls before it stored and
-- ended, as SQLite's row-by-row inserts do, and @SubmittedAt gives every row of the submit the
-- same time, as SQLite gives them (the database's clock, read once by the batch). The new
-- parameters default to none, so a replica still running the previous release during an
-- upgrade keeps submitting.
CREATE PROCEDURE dbo.SubmitNotification
    @NotificationId uniqueidentifier,
    @Type nvarchar(16),
    @ListName nvarchar(256),
    @Subject nvarchar(1000),
    @Body nvarchar(max),
    @TypeData nvarchar(max),
    @ContentHash binary(32),
    @SourceSiteId nvarchar(64),
    @SourceInstanceId nvarchar(512),
    @SourceScript nvarchar(512),
    @OriginExecutionId uniqueidentifier,
    @OriginParentExecutionId uniqueidentifier,
    @SiteEnqueuedAt datetime2(3),
    @Priority int = 2,
    @ConditionKey nvarchar(128) = NULL,
    @ClearedAtSite datetime2(3) = NULL,
    @ClearedBy nvarchar(256) = NULL,
    @SubmittedAt datetime2(3) = NULL
AS
BEGIN
SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @inserted int = 0;
DECLARE @now datetime2(3) = COALESCE(@SubmittedAt, SYSUTCDATETIME());
IF NOT EXISTS (SELECT 1 FROM dbo.Notifications AS e WHERE e.NotificationId = @NotificationId)
BEGIN
    BEGIN TRANSACTION;
    INSERT INTO dbo.Notifications (NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, Status, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, CreatedAt, NextAttemptAt, ResolvedAt, AttemptCount, Priority, ServeTurn, ConditionKey)
    SELECT @NotificationId, @Type, @ListName, @Subject, @Body, @TypeData, @ContentHash,
        CASE WHEN @ClearedAtSite IS NULL THEN N'Pending' ELSE N'Cleared' END,
        @SourceSiteId, @SourceInstanceId, @SourceScript, @OriginExecutionId, @OriginParentExecutionId, @SiteEnqueuedAt, @now,
        CASE WHEN @ClearedAtSite IS NULL THEN @now END,
        CASE WHEN @ClearedAtSite IS NOT NULL THEN @now END,
        CASE WHEN @ClearedAtSite IS NULL THEN 0 ELSE 1 END,
        @Priority,
        1 + CASE WHEN t.SiteLast > t.Head THEN t.SiteLast ELSE t.Head END,
        @ConditionKey
    FROM (
        SELECT COALESCE((
                SELECT MIN(s.ServeTurn)
                FROM dbo.Notifications AS s
                WHERE s.Type = @Type AND s.Priority = @Priority
                  AND s.Status IN (N'Pending', N'Retrying') AND s.Priority >= 0), 0) AS Head,
            COALESCE((
                SELECT MAX(l.ServeTurn)
                FROM dbo.Notifications AS l
                WHERE l.Type = @Type AND l.Priority = @Priority AND l.SourceSiteId = @SourceSiteId
                  AND l.Status IN (N'Pending', N'Retrying') AND l.ServeTurn > 0), 0) AS SiteLast
    ) AS t;
    SET @inserted = @@ROWCOUNT;
    IF @ClearedAtSite IS NOT NULL
        INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
        VALUES (@NotificationId, 1, @ClearedAtSite, N'Cleared', @ClearedBy);
    ELSE IF @ConditionKey IS NOT NULL
    BEGIN
        UPDATE dbo.Notifications
        SET Status = N'Superseded',
            ResolvedAt = @now,
            NextAttemptAt = NULL,
            ClaimedUntil = NULL,
            ClaimEpoch = NULL,
            ClaimToken = @NotificationId,
            AttemptCount = AttemptCount + 1
        WHERE Status IN (N'Pending', N'Retrying') AND ConditionKey IS NOT NULL
          AND SourceSiteId = @SourceSiteId AND ConditionKey = @ConditionKey AND ListName = @ListName
          AND SiteEnqueuedAt <= @SiteEnqueuedAt AND NotificationId <> @NotificationId
          AND (ClaimedUntil IS NULL OR ClaimedUntil <= @now);
        IF @@ROWCOUNT > 0
            INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
            SELECT n.NotificationId, n.AttemptCount, @now, N'Superseded', LOWER(CONVERT(nvarchar(36), @NotificationId))
            FROM dbo.Notifications AS n
            WHERE n.Status = N'Superseded' AND n.ResolvedAt = @now AND n.ClaimToken = @NotificationId;
    END;
    COMMIT TRANSACTION;
END;
SELECT n.NotificationId, n.ContentHash, @inserted AS Inserted
FROM dbo.Notifications AS n
WHERE n.NotificationId = @NotificationId;
END;
