-- The earliest due time after ?2 of the waiting rows of type ?1 (a scheduled row's time, a
-- retry's): one seek in IX_Notifications_Type_Due (Type, NextAttemptAt), whose filter the
-- statement states. A claimed row is due again only when its claim runs out, which the poll
-- catches; its NextAttemptAt has passed, so it is not among these.
SELECT MIN(NextAttemptAt) FROM Notifications
WHERE Status IN ('Pending', 'Retrying') AND Type = ?1 AND NextAttemptAt > ?2
