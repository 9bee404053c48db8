SELECT COUNT(*), MIN(QueuedAt) FROM StatusCallbacks
