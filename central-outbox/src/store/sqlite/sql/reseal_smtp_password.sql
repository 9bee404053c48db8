-- UpdatedAt is left alone: the settings did not change, only how the secret is kept.
UPDATE ChannelConfig SET Password = ?2 WHERE Channel = ?1
