-- Scheduled delivery (NotificationSubmit.deliver_after): a notification may say when it is to be
-- delivered at the earliest. It is stored Pending with NextAttemptAt at that time (the due scan,
-- IX_Notifications_Type_Due, does not claim it before), and its time is kept here too: an
-- attempt moves NextAttemptAt, but the views and the "scheduled" filter still show when it was
-- planned for. NULL: not scheduled (rows stored before this migration were not).
ALTER TABLE Notifications ADD COLUMN DeliverAfter INTEGER;

-- The "scheduled" filter and the KPIs read it with the row; the dispatcher's wake-up (the
-- earliest due time ahead, select_next_due.sql) reads IX_Notifications_Type_Due, which the
-- column does not change. No index of its own: the rows still waiting for their time are the
-- Pending ones, which the filter's status already narrows to the queue.
