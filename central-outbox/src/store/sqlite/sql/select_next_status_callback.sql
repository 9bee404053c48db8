SELECT MIN(NextCallAt) FROM StatusCallbacks
