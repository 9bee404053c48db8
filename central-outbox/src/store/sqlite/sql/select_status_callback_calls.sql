SELECT CallNo, CalledAt, DurationMs, Status, Outcome, Error, Endpoint
FROM StatusCallbackCalls WHERE NotificationId = ?1 ORDER BY CallNo
