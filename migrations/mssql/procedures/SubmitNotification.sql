-- dbo.SubmitNotification, revision 7
--
-- Stores one submitted notification, as the SQLite backend stores a row, and answers the id's
-- stored content hash and whether this call inserted it, from which the caller tells Accepted,
-- Duplicate and Conflict apart. A stored row is never changed. Two calls inserting the same
-- new id at once make one fail with a duplicate key (2627/2601); the caller then inserts that
-- row again on its own. Called for a submit of a single row, and for each keyed row, each row
-- of a consolidating list and each short run of plain rows of a larger submit (see below);
-- long runs of plain rows go in one INSERT of many rows (sql::ingest). Why a procedure: on
-- Babelfish, which parses every batch on every call, one row took ~2.5-4 ms as the insert batch
-- and ~0.9 ms as this procedure; from about ten rows on, the one INSERT is as cheap or cheaper.
--
-- In one transaction, an accepted row:
-- - gets its priority and serve turn (domain::serve_order::serve_turn): one past the later of
--   the head turn (the smallest turn waiting at that type and priority, in flight or not: the
--   first entry of IX_Notifications_Serve there) and the newest turn its site has waiting there
--   (the last entry of IX_Notifications_Site_Turn, which leaves turn 0 out, changing no turn),
--   0 standing for nothing waiting. Both reads are one seek each, in the INSERT itself. No hint
--   or stricter isolation serialises two submits at once: both may read the same turns and
--   store the same turn, a tie the claim gives to the older row (Id), as the rule does for rows
--   stored together.
-- - if it has a condition key and its site, key and list already have a row enqueued at the
--   site after it (in any status: IX_Notifications_ConditionLatest), is stale on arrival: it is
--   stored Superseded, resolved now, never due, with one history entry (number 1) naming the
--   newest such row (the latest state; ties by arrival). It supersedes nothing and is counted
--   in no window. Between rows of one site time the later arrival wins (below).
-- - if cleared at the site (@ClearedAtSite, by @ClearedBy), is stored Cleared, resolved now,
--   never due (NextAttemptAt NULL), with one history entry (number 1, at the site's time of the
--   clear, by the site). It supersedes nothing and is counted in no window: the site's own
--   clear reaches central too.
-- - if scheduled (@DeliverAfter, central's domain::schedule: its time still ahead of @now), is
--   stored Pending, due at that time (NextAttemptAt @DeliverAfter, which the claims' due scan
--   does not take before), and takes part in neither consolidation nor escalation (below): it
--   is delivered on its own when due. A @DeliverAfter that has passed makes it due now, as any
--   row. Either way DeliverAfter keeps the time for the views. Its condition key supersedes as
--   any keyed row's does (below), and it is superseded and cleared as any waiting row.
-- - otherwise, if its list consolidates (domain::consolidation), counts as an arrival of the
--   list's current window in dbo.ConsolidationWindows, and is stored Held, due at the window's
--   end, when it is over the list's threshold and not critical (priority rank 0); its turn is
--   the one it would have had (a Held row is never served in turn). Windows are aligned to the
--   Unix epoch (domain::consolidation::Consolidation::window_of): the window of @now starts @now
--   less its milliseconds since 1970-01-01 modulo the window's length.
-- - otherwise, if it has a condition key, ends as Superseded the waiting rows (Pending, Retrying
--   or Held) and the Parked rows of its site, list and key enqueued at the site no later than it
--   and not claimed (or whose claim ran out): each one's history count goes up by one and its
--   entry, numbered that count, names this row. Those being delivered (claimed) are marked
--   instead (PendingEnd): they end Superseded when their attempt does not deliver them
--   (dbo.RecordAttemptOutcomes) or their claim expires (the claims). No OUTPUT and no table variable (migrations/mssql/README.md): the
--   UPDATE stamps the rows it ends with this row's id in ClaimToken (which only a claim of a
--   waiting row reads), so the history INSERT finds exactly those rows (Status Superseded,
--   resolved at @now, this token) through IX_Notifications_Status_Resolved.
-- - if its list has an escalation policy (NotificationLists.Escalation, store/mssql/escalation.rs)
--   that applies to its priority and it was neither stored ended (cleared at the site, stale on
--   arrival) nor scheduled: a keyed row joins the incident of its site, key and list that is not
--   final (it becomes the state the incident's later pages quote, with a Joined history row),
--   and any other row opens an incident, of which it is page 1 (its page row, and an Opened
--   history row), its next page due after the policy's first wait. The list's columns beside
--   its policy say all that needs (the procedure reads no JSON). Two submits of one condition at
--   once on two replicas: UX_Incidents_Condition fails the second (2601), and its caller stores
--   it again, then joining.
--
-- A submit of many rows calls this procedure for its keyed rows and the rows of consolidating
-- lists, in batch order, inside one transaction of its own (sql::ingest::insert_in_order):
-- there the BEGIN and COMMIT below only nest, each call sees the rows the calls before it stored
-- and ended, as SQLite's row-by-row inserts do, and @SubmittedAt gives every row of the submit
-- the same time, as SQLite gives them (the database's clock, read once by the batch), so the
-- rows of one submit arrive in one window whatever the clock says. The parameters after
-- @SiteEnqueuedAt have defaults, so a replica still running an earlier release during an
-- upgrade keeps submitting (and its rows are counted and held).
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
    @SubmittedAt datetime2(3) = NULL,
    @DeliverAfter datetime2(3) = NULL
AS
BEGIN
SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @inserted int = 0;
DECLARE @now datetime2(3) = COALESCE(@SubmittedAt, SYSUTCDATETIME());
DECLARE @threshold int;
DECLARE @window int;
DECLARE @start datetime2(3);
DECLARE @arrived int;
DECLARE @heldUntil datetime2(3);
DECLARE @newer uniqueidentifier;
DECLARE @policy nvarchar(max);
DECLARE @priorities int;
DECLARE @firstWaitMs bigint;
DECLARE @firstRound int;
DECLARE @firstStep int;
DECLARE @onPark int;
DECLARE @openedNote nvarchar(400);
DECLARE @incident bigint;
DECLARE @incidentPage int;
DECLARE @due datetime2(3);
-- Due at its time when scheduled, otherwise now.
DECLARE @dueAt datetime2(3) = CASE WHEN @DeliverAfter > @now THEN @DeliverAfter ELSE @now END;
IF NOT EXISTS (SELECT 1 FROM dbo.Notifications AS e WHERE e.NotificationId = @NotificationId)
BEGIN
    BEGIN TRANSACTION;
    IF @ClearedAtSite IS NULL AND @ConditionKey IS NOT NULL
        SELECT TOP (1) @newer = k.NotificationId
        FROM dbo.Notifications AS k
        WHERE k.ConditionKey IS NOT NULL AND k.SourceSiteId = @SourceSiteId
          AND k.ConditionKey = @ConditionKey AND k.ListName = @ListName
          AND k.SiteEnqueuedAt > @SiteEnqueuedAt
        ORDER BY k.SiteEnqueuedAt DESC, k.Id DESC;
    IF @ClearedAtSite IS NULL AND @newer IS NULL AND @dueAt = @now
        SELECT @threshold = l.ConsolidateThreshold, @window = l.ConsolidateWindowSeconds
        FROM dbo.NotificationLists AS l
        WHERE l.Name = @ListName;
    IF @threshold IS NOT NULL
    BEGIN
        SET @start = DATEADD(millisecond,
            -CAST(DATEDIFF_BIG(millisecond, CAST('19700101' AS datetime2(3)), @now) % (CAST(@window AS bigint) * 1000) AS int),
            @now);
        UPDATE dbo.ConsolidationWindows
        SET Arrived = CASE WHEN WindowStart < @start THEN 1 ELSE Arrived + 1 END,
            WindowStart = CASE WHEN WindowStart < @start THEN @start ELSE WindowStart END
        WHERE ListName = @ListName;
        IF @@ROWCOUNT = 0
            INSERT INTO dbo.ConsolidationWindows (ListName, WindowStart, Arrived)
            VALUES (@ListName, @start, 1);
        SELECT @arrived = w.Arrived
        FROM dbo.ConsolidationWindows AS w
        WHERE w.ListName = @ListName;
        IF @arrived > @threshold AND @Priority <> 0
            -- Due two seconds after the window's end (domain::consolidation::SETTLE), so a row
            -- of the window still being committed by another session joins the same digest.
            SET @heldUntil = DATEADD(second, @window + 2, @start);
    END;
    IF @ClearedAtSite IS NULL AND @newer IS NULL AND @dueAt = @now
        SELECT @policy = l.Escalation, @priorities = l.EscalationPriorities,
            @firstWaitMs = l.EscalationFirstWaitMs, @firstRound = l.EscalationFirstRound,
            @firstStep = l.EscalationFirstStep, @onPark = l.EscalateOnPark,
            @openedNote = l.EscalationOpenedNote
        FROM dbo.NotificationLists AS l
        WHERE l.Name = @ListName AND l.Escalation IS NOT NULL;
    IF @policy IS NOT NULL AND (@priorities & POWER(2, @Priority)) <> 0
    BEGIN
        IF @ConditionKey IS NOT NULL
            SELECT @incident = i.Id
            FROM dbo.Incidents AS i WITH (UPDLOCK)
            WHERE i.ConditionKey IS NOT NULL AND i.SourceSiteId = @SourceSiteId
              AND i.ConditionKey = @ConditionKey AND i.ListName = @ListName
              AND i.Status IN (N'Open', N'Acknowledged', N'Exhausted');
        IF @incident IS NOT NULL
        BEGIN
            UPDATE dbo.Incidents
            SET LatestId = @NotificationId, Subject = @Subject, HistoryCount = HistoryCount + 1
            WHERE Id = @incident;
            INSERT INTO dbo.IncidentHistory (IncidentId, Sequence, At, Kind, Actor, Detail)
            SELECT i.Id, i.HistoryCount, @now, N'Joined', N'site ' + @SourceSiteId,
                N'notification ' + LOWER(CONVERT(nvarchar(36), @NotificationId)) + N', a newer state of its condition, joined it'
            FROM dbo.Incidents AS i
            WHERE i.Id = @incident;
        END;
        IF @incident IS NULL
        BEGIN
            SET @due = DATEADD(millisecond, CAST(@firstWaitMs % 1000 AS int),
                DATEADD(second, CAST(@firstWaitMs / 1000 AS int), @now));
            INSERT INTO dbo.Incidents (ListName, SourceSiteId, ConditionKey, Priority, AlarmId, LatestId, Subject, Policy, EscalateOnPark, Status, OpenedAt, NextDueAt, NextRound, NextStep, HistoryCount)
            VALUES (@ListName, @SourceSiteId, @ConditionKey, @Priority, @NotificationId, @NotificationId, @Subject, @policy, @onPark, N'Open', @now, @due, @firstRound, @firstStep, 1);
            SET @incident = SCOPE_IDENTITY();
            SET @incidentPage = 1;
            INSERT INTO dbo.IncidentPages (IncidentId, Cycle, Round, Step, PageNo, DueAt, FiredAt, LateMs, LeaseEpoch)
            VALUES (@incident, 0, 0, 1, 1, @now, @now, NULL, 0);
            INSERT INTO dbo.IncidentHistory (IncidentId, Sequence, At, Kind, Actor, Detail)
            VALUES (@incident, 1, @now, N'Opened', N'site ' + @SourceSiteId,
                N'notification ' + LOWER(CONVERT(nvarchar(36), @NotificationId)) + N' to list ' + @ListName + N' ('
                + CASE @Priority WHEN 0 THEN N'critical' WHEN 1 THEN N'high' WHEN 2 THEN N'normal' ELSE N'low' END
                + N') ' + REPLACE(@openedNote, N'{due}', CONVERT(nvarchar(23), @due, 126) + N'+00:00'));
        END;
    END;
    INSERT INTO dbo.Notifications (NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, Status, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, CreatedAt, NextAttemptAt, ResolvedAt, AttemptCount, Priority, ServeTurn, ConditionKey, IncidentId, IncidentPage, DeliverAfter)
    SELECT @NotificationId, @Type, @ListName, @Subject, @Body, @TypeData, @ContentHash,
        CASE WHEN @ClearedAtSite IS NOT NULL THEN N'Cleared' WHEN @newer IS NOT NULL THEN N'Superseded' WHEN @heldUntil IS NOT NULL THEN N'Held' ELSE N'Pending' END,
        @SourceSiteId, @SourceInstanceId, @SourceScript, @OriginExecutionId, @OriginParentExecutionId, @SiteEnqueuedAt, @now,
        CASE WHEN @ClearedAtSite IS NULL AND @newer IS NULL THEN COALESCE(@heldUntil, @dueAt) END,
        CASE WHEN @ClearedAtSite IS NOT NULL OR @newer IS NOT NULL THEN @now END,
        CASE WHEN @ClearedAtSite IS NULL AND @newer IS NULL THEN 0 ELSE 1 END,
        @Priority,
        1 + CASE WHEN t.SiteLast > t.Head THEN t.SiteLast ELSE t.Head END,
        @ConditionKey, @incident, @incidentPage, @DeliverAfter
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
    ELSE IF @newer IS NOT NULL
        INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
        VALUES (@NotificationId, 1, @now, N'Superseded', LOWER(CONVERT(nvarchar(36), @newer)));
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
        WHERE Status IN (N'Pending', N'Retrying', N'Held', N'Parked') AND ConditionKey IS NOT NULL
          AND SourceSiteId = @SourceSiteId AND ConditionKey = @ConditionKey AND ListName = @ListName
          AND SiteEnqueuedAt <= @SiteEnqueuedAt AND NotificationId <> @NotificationId
          AND (ClaimedUntil IS NULL OR ClaimedUntil <= @now);
        IF @@ROWCOUNT > 0
            INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
            SELECT n.NotificationId, n.AttemptCount, @now, N'Superseded', LOWER(CONVERT(nvarchar(36), @NotificationId))
            FROM dbo.Notifications AS n
            WHERE n.Status = N'Superseded' AND n.ResolvedAt = @now AND n.ClaimToken = @NotificationId;
        UPDATE dbo.Notifications
        SET PendingEnd = N'Superseded', PendingEndBy = LOWER(CONVERT(nvarchar(36), @NotificationId))
        WHERE Status IN (N'Pending', N'Retrying', N'Held') AND ConditionKey IS NOT NULL
          AND SourceSiteId = @SourceSiteId AND ConditionKey = @ConditionKey AND ListName = @ListName
          AND SiteEnqueuedAt <= @SiteEnqueuedAt AND NotificationId <> @NotificationId
          AND ClaimedUntil > @now;
    END;
    COMMIT TRANSACTION;
END;
SELECT n.NotificationId, n.ContentHash, @inserted AS Inserted
FROM dbo.Notifications AS n
WHERE n.NotificationId = @NotificationId;
END;
