-- UpdatedAt is left alone: the settings did not change, only how the secret is kept.
UPDATE NotificationLists SET WebhookSecret = ?2 WHERE Name = ?1
