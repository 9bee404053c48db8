-- Ends the tenure: the epoch moves on, so nothing more is recorded under it and a re-take
-- starts a new one.
UPDATE Leases SET ExpiresAt = ?4, Epoch = Epoch + 1
WHERE Name = ?1 AND Holder = ?2 AND Epoch = ?3 AND ExpiresAt > ?4
