-- dbo.RecordSiteStatusChanges, revision 2
--
-- Records, in the statement's own transaction, every final status a notification of a
-- watching site reaches (dbo.SiteStatusWatchers, migration 0017): a row inserted final (one
-- the site cleared before forwarding it) or updated into a final status it did not have
-- (Parked, then Discarded: both). NotificationIngest.WatchSiteStatus streams the feed to the
-- site, which confirms what it stored.
--
-- Revision 2: it also queues each final status of a notification whose list has a status
-- callback endpoint (dbo.StatusCallbacks, migration 0018), which central's status_callbacks
-- then tell that endpoint. One trigger for both, not two: each trigger a statement fires costs
-- it on every write of the notifications, whether or not it records anything.
--
-- A trigger rather than a line in each statement that ends a notification: there are a dozen
-- of them (RecordAttemptOutcomes, the supersede and clear of SubmitNotification and
-- ClearCondition, an operator's discard, AcknowledgeIncident...), and this way none of them,
-- and none added later, can forget its site. One set-based insert per statement, whatever
-- the number of rows it changed; a statement that leaves no row final (a claim, a retry's
-- schedule) stops at the first check.
--
-- Not `IF UPDATE(Status)`: Babelfish 4.4 answers it false in a statement with an OUTPUT
-- clause (the operator actions and the batch insert have one), so the rows are compared instead.
CREATE TRIGGER dbo.RecordSiteStatusChanges ON dbo.Notifications AFTER INSERT, UPDATE AS
BEGIN
    SET NOCOUNT ON;
    IF NOT EXISTS (
        SELECT 1 FROM inserted AS i
        WHERE i.Status IN (N'Delivered', N'Parked', N'Discarded', N'Superseded', N'Cleared', N'Acknowledged'))
        RETURN;
    INSERT INTO dbo.SiteStatusFeed (SiteId, NotificationId, Status, DecidedAt, LastError)
    SELECT i.SourceSiteId, i.NotificationId, i.Status, COALESCE(i.ResolvedAt, SYSUTCDATETIME()), i.LastError
    FROM inserted AS i
    LEFT JOIN deleted AS d ON d.Id = i.Id
    WHERE i.Status IN (N'Delivered', N'Parked', N'Discarded', N'Superseded', N'Cleared', N'Acknowledged')
      AND (d.Id IS NULL OR d.Status <> i.Status)
      AND EXISTS (SELECT 1 FROM dbo.SiteStatusWatchers AS w WHERE w.SiteId = i.SourceSiteId);
    INSERT INTO dbo.StatusCallbacks (NotificationId, ListName, Status, DecidedAt, LastError, QueuedAt, NextCallAt)
    SELECT i.NotificationId, i.ListName, i.Status, COALESCE(i.ResolvedAt, SYSUTCDATETIME()), i.LastError,
           COALESCE(i.ResolvedAt, SYSUTCDATETIME()), COALESCE(i.ResolvedAt, SYSUTCDATETIME())
    FROM inserted AS i
    LEFT JOIN deleted AS d ON d.Id = i.Id
    JOIN dbo.NotificationLists AS l ON l.Name = i.ListName
    WHERE i.Status IN (N'Delivered', N'Parked', N'Discarded', N'Superseded', N'Cleared', N'Acknowledged')
      AND (d.Id IS NULL OR d.Status <> i.Status)
      AND l.StatusCallbackUrl IS NOT NULL;
END;
