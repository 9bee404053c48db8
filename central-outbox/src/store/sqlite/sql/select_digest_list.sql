-- The list of the longest-due held row of type ?1: the one whose digest goes first.
SELECT ListName FROM Notifications
WHERE Status = 'Held' AND Type = ?1 AND NextAttemptAt <= ?2
  AND (ClaimedUntil IS NULL OR ClaimedUntil <= ?2)
ORDER BY NextAttemptAt, Id LIMIT 1
