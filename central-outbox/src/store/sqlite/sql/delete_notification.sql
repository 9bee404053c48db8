DELETE FROM Notifications WHERE Id = ?1
