-- Scheduled delivery (NotificationSubmit.deliver_after), the schema of SQLite's migration 0013:
-- a notification may say when it is to be delivered at the earliest. procedures/
-- SubmitNotification.sql stores it Pending with NextAttemptAt at that time (the claims' due scan,
-- IX_Notifications_Due, does not take it before), and keeps the time here too: an attempt moves
-- NextAttemptAt, but the views and the "scheduled" filter still show when it was planned for.
-- NULL: not scheduled (rows stored before this migration were not).
--
-- No index of its own: the filter reads it with the rows its status narrows to the queue, and
-- the dispatcher's wake-up (sql::dispatch::select_next_due, the earliest due time ahead) seeks
-- IX_Notifications_Due, which this column does not change.
IF COL_LENGTH(N'dbo.Notifications', N'DeliverAfter') IS NULL
    ALTER TABLE dbo.Notifications ADD DeliverAfter datetime2(3) NULL;
