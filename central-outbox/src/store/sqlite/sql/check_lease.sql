SELECT 1 FROM Leases WHERE Name = ?1 AND Epoch = ?2 AND ExpiresAt > ?3
