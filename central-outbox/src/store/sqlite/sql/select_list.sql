SELECT Type, WebhookFormat, WebhookSecret, UpdatedAt, ConsolidateThreshold,
       ConsolidateWindowSeconds, ConsolidateMaxPerDigest, Escalation, WebhookFallbacks
FROM NotificationLists WHERE Name = ?1
