-- Who goes first (central's domain::serve_order): each row's priority and serve turn, and the
-- indexes that serve the two claim orders and a submit's two reads of the turns. This migration
-- also created dbo.ClaimDueNotifications and dbo.SubmitNotification again to claim and store by
-- them; both now live in procedures/ (README.md here). Batches are separated by GO lines,
-- because a column added by ALTER TABLE can only be named by a later batch.
--
-- Guards as in 0001. On Babelfish 4.4 INDEXPROPERTY does not find an index by its T-SQL name
-- (it stores it under a longer, hashed one), so there a second run of this file (or of 0001)
-- stops at the first CREATE INDEX; the migration runner never runs a file twice.

-- Priority rank: 0 critical, 1 high, 2 normal, 3 low (Priority::rank), so ascending order is
-- most urgent first. Rows stored before priorities existed are normal. An int, not a tinyint:
-- Babelfish 4.4 fails to add a NOT NULL tinyint column with a default to a table ("tuple
-- already updated by self").
IF COL_LENGTH(N'dbo.Notifications', N'Priority') IS NULL
    ALTER TABLE dbo.Notifications ADD Priority int NOT NULL CONSTRAINT DF_Notifications_Priority DEFAULT (2);
GO

-- The row's turn among the sites with work at its priority (domain::serve_order::serve_turn).
-- Rows stored before turns existed share turn 0: they go first, oldest first, as before.
IF COL_LENGTH(N'dbo.Notifications', N'ServeTurn') IS NULL
    ALTER TABLE dbo.Notifications ADD ServeTurn bigint NOT NULL CONSTRAINT DF_Notifications_ServeTurn DEFAULT (0);
GO

-- The claim in turn (rules 1 and 2): a channel's waiting rows by priority, then turn, like
-- SQLite's IX_Notifications_Serve. Rows in flight stay in it (a row is Pending or Retrying
-- until its outcome, and it still counts for the head turn, as on SQLite), so its first entry
-- at a priority is the head turn a submit reads, and the claim passes over the rows in flight
-- and those not due yet (retries waiting out their delay) by the included columns, without
-- looking each one up: the claim's rescue of claims that ran out is then the same scan.
-- `Priority >= 0` holds for every row: it is in the filter so that only the statements that
-- say it (the claim in turn and the head read) can use the index. Every statement on waiting
-- rows implies `Status IN (...)`, and without statistics (a new database, before its first
-- analyze) Babelfish's planner (PostgreSQL's) rates every index whose filter a statement
-- implies alike and took the wrong one: the claims re-checked their rows, and a submit read
-- the head, by scanning a channel's whole queue (3.3 ms instead of 0.3 ms per submit with 20,000
-- waiting).
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Serve', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Serve
    ON dbo.Notifications (Type, Priority, ServeTurn, Id)
    INCLUDE (ClaimedUntil, NextAttemptAt)
    WHERE Status IN (N'Pending', N'Retrying') AND Priority >= 0;
END;

-- A submit's other read: the newest turn the row's site has waiting at its priority (claimed
-- or not), the last entry of one seek. Rows of turn 0 (stored before turns existed) are left
-- out, which changes no turn: while one waits, the head is 0 and a site's newest turn counts
-- only when above it. As for IX_Notifications_Serve, that filter also keeps every other
-- statement on waiting rows away from this index.
IF INDEXPROPERTY(OBJECT_ID(N'dbo.Notifications'), N'IX_Notifications_Site_Turn', N'IndexID') IS NULL
BEGIN
CREATE NONCLUSTERED INDEX IX_Notifications_Site_Turn
    ON dbo.Notifications (Type, Priority, SourceSiteId, ServeTurn)
    WHERE Status IN (N'Pending', N'Retrying') AND ServeTurn > 0;
END;
GO
