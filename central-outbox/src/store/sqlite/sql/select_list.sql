SELECT Type, WebhookFormat, WebhookSecret, UpdatedAt, ConsolidateThreshold,
       ConsolidateWindowSeconds, ConsolidateMaxPerDigest
FROM NotificationLists WHERE Name = ?1
