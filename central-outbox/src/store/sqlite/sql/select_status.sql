SELECT Status FROM Notifications WHERE NotificationId = ?1
