-- Who goes first (central's domain::serve_order): each row's priority and serve turn.

-- Priority rank: 0 critical, 1 high, 2 normal, 3 low, so ascending order is most urgent first.
-- Rows stored before priorities existed are normal.
ALTER TABLE Notifications ADD COLUMN Priority INTEGER NOT NULL DEFAULT 2;
-- The row's turn among the sites with work at its priority (domain::serve_order::serve_turn).
ALTER TABLE Notifications ADD COLUMN ServeTurn INTEGER NOT NULL DEFAULT 0;
-- Rows waiting at the upgrade get the turns they would have been given: each site's rows
-- numbered from 1 in due order, so a site with a backlog queued at the upgrade does not hold
-- every other site's next notification behind all of it.
UPDATE Notifications
SET ServeTurn = Numbered.Turn
FROM (
    SELECT Id, ROW_NUMBER() OVER (
               PARTITION BY Type, SourceSiteId ORDER BY NextAttemptAt, Id) AS Turn
    FROM Notifications
    WHERE Status IN ('Pending', 'Retrying')) AS Numbered
WHERE Numbered.Id = Notifications.Id;

-- The claim in turn: a channel's waiting rows by priority, then turn. Its first entry at a
-- priority is also the head turn an insert reads. The longest-waiting share is served by
-- IX_Notifications_Type_Due (due time).
CREATE INDEX IX_Notifications_Serve ON Notifications (Type, Priority, ServeTurn, Id)
    WHERE Status IN ('Pending', 'Retrying');
-- An insert's other read: the newest turn its site has waiting at that priority.
CREATE INDEX IX_Notifications_Site_Turn ON Notifications (Type, Priority, SourceSiteId, ServeTurn)
    WHERE Status IN ('Pending', 'Retrying');
