DELETE FROM StatusCallbacks WHERE Seq = ?1
