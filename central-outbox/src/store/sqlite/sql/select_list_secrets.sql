SELECT Name, WebhookSecret FROM NotificationLists WHERE WebhookSecret IS NOT NULL
