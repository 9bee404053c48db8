SELECT Name FROM NotificationLists ORDER BY Name
