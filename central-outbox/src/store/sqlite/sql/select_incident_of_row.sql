-- The incident of the notification a Discard ended, when it is the incident's alarm or a
-- joined notification of its condition (not a page's message).
SELECT IncidentId FROM Notifications
WHERE NotificationId = ?1 AND IncidentId IS NOT NULL
  AND (IncidentPage IS NULL OR IncidentPage = 1)
