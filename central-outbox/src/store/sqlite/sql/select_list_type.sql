SELECT Type FROM NotificationLists WHERE Name = ?1
