SELECT ContentHash FROM Notifications WHERE NotificationId = ?1
