DELETE FROM NotificationLists WHERE Name = ?1
