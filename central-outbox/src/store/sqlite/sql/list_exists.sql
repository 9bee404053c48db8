SELECT EXISTS (SELECT 1 FROM NotificationLists WHERE Name = ?1)
