-- OR IGNORE: a target named twice in one list is stored once.
INSERT OR IGNORE INTO NotificationListRecipients (ListName, Address) VALUES (?1, ?2)
