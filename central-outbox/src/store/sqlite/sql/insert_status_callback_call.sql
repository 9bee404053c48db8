-- The next entry of the notification's call history.
INSERT INTO StatusCallbackCalls (NotificationId, CallNo, CalledAt, DurationMs, Status, Outcome,
    Error, Endpoint)
SELECT ?1, COALESCE(MAX(CallNo), 0) + 1, ?2, ?3, ?4, ?5, ?6, ?7
FROM StatusCallbackCalls WHERE NotificationId = ?1
