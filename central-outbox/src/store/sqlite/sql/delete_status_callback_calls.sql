DELETE FROM StatusCallbackCalls WHERE NotificationId = ?1
