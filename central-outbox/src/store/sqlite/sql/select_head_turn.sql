-- The first read of `serve_turn`: one seek in the partial index of waiting rows
-- (IX_Notifications_Serve).
SELECT MIN(ServeTurn) FROM Notifications
WHERE Status IN ('Pending', 'Retrying') AND Type = ?1 AND Priority = ?2
