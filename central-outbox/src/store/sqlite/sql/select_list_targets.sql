-- Ordered so that a list reads the same every time.
SELECT Address FROM NotificationListRecipients WHERE ListName = ?1 ORDER BY Address
