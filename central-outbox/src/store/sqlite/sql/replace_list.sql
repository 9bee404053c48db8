INSERT INTO NotificationLists (Name, Type, WebhookFormat, WebhookSecret, UpdatedAt,
    ConsolidateThreshold, ConsolidateWindowSeconds, ConsolidateMaxPerDigest, Escalation, WebhookFallbacks,
    StatusCallbackUrl)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
ON CONFLICT (Name) DO UPDATE SET
    Type = excluded.Type, WebhookFormat = excluded.WebhookFormat,
    WebhookSecret = excluded.WebhookSecret, UpdatedAt = excluded.UpdatedAt,
    ConsolidateThreshold = excluded.ConsolidateThreshold,
    ConsolidateWindowSeconds = excluded.ConsolidateWindowSeconds,
    ConsolidateMaxPerDigest = excluded.ConsolidateMaxPerDigest,
    Escalation = excluded.Escalation,
    WebhookFallbacks = excluded.WebhookFallbacks,
    StatusCallbackUrl = excluded.StatusCallbackUrl
