DELETE FROM StatusCallbacks WHERE NotificationId = ?1
