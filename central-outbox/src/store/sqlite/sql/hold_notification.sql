UPDATE Notifications SET Status = 'Held', NextAttemptAt = ?2 WHERE NotificationId = ?1
