SELECT Id, NotificationId, Status = 'Parked' FROM Notifications
WHERE Status IN ('Delivered', 'Parked', 'Discarded', 'Superseded', 'Cleared', 'Acknowledged')
  AND ResolvedAt < ?1
ORDER BY ResolvedAt LIMIT ?2
