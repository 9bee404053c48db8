-- A notification of an incident: its alarm (page 1), a page's message (2, 3, ...) or a joined
-- notification of its condition (NULL).
UPDATE Notifications SET IncidentId = ?2, IncidentPage = ?3 WHERE NotificationId = ?1
