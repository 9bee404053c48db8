DELETE FROM NotificationAttempts WHERE NotificationId = ?1
