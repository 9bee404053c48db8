-- The second read of `serve_turn`: one seek in the partial index of waiting rows
-- (IX_Notifications_Site_Turn).
SELECT MAX(ServeTurn) FROM Notifications
WHERE Status IN ('Pending', 'Retrying') AND Type = ?1 AND Priority = ?2
  AND SourceSiteId = ?3
