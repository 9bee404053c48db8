SELECT Holder, Epoch, ExpiresAt FROM Leases WHERE Name = ?1
