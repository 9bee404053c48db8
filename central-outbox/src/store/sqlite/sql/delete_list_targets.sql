DELETE FROM NotificationListRecipients WHERE ListName = ?1
