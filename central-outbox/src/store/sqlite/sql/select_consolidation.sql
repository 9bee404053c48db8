SELECT ConsolidateThreshold, ConsolidateWindowSeconds, ConsolidateMaxPerDigest
FROM NotificationLists WHERE Name = ?1
