-- Up to ?2 terminal rows resolved before ?1: a range of IX_Notifications_Status_Resolved per
-- status, oldest first within each. No ORDER BY across the statuses: every row before the
-- cutoff goes, so the order between them does not matter, and sorting them would read every
-- purgeable row for each batch (a million of them after a retention change) to take the first
-- thousand.
SELECT Id, NotificationId, Status = 'Parked' FROM Notifications
WHERE Status IN ('Delivered', 'Parked', 'Discarded', 'Superseded', 'Cleared', 'Acknowledged')
  AND ResolvedAt < ?1
LIMIT ?2
