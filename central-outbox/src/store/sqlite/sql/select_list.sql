SELECT Type, WebhookFormat, WebhookSecret, UpdatedAt, ConsolidateThreshold,
       ConsolidateWindowSeconds, ConsolidateMaxPerDigest, Escalation, WebhookFallbacks,
       StatusCallbackUrl
FROM NotificationLists WHERE Name = ?1
