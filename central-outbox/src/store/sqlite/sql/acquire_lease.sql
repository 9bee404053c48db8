-- Upsert expressions see the row's old values, so the CASE compares against the previous
-- holder: the epoch moves on only when the holder changes.
INSERT INTO Leases (Name, Holder, Epoch, ExpiresAt) VALUES (?1, ?2, 1, ?4)
ON CONFLICT (Name) DO UPDATE SET
    Epoch = CASE WHEN Leases.Holder = excluded.Holder
                 THEN Leases.Epoch ELSE Leases.Epoch + 1 END,
    Holder = excluded.Holder,
    ExpiresAt = excluded.ExpiresAt
WHERE Leases.Holder = excluded.Holder OR Leases.ExpiresAt <= ?3
RETURNING Epoch
