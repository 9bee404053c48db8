UPDATE StatusCallbacks SET Calls = Calls + 1, NextCallAt = ?2 WHERE Seq = ?1
