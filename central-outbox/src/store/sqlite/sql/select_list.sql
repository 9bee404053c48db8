SELECT Type, WebhookFormat, WebhookSecret, UpdatedAt, ConsolidateThreshold,
       ConsolidateWindowSeconds, ConsolidateMaxPerDigest, Escalation
FROM NotificationLists WHERE Name = ?1
