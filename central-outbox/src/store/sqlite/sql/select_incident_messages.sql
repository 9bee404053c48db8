-- An incident's notifications, in the order they were stored (IX_Notifications_Incident).
SELECT NotificationId, ListName, IncidentPage, Status
FROM Notifications WHERE IncidentId = ?1 ORDER BY Id
