-- The lists incident ?1 reached: those of its notifications delivered, or being delivered at ?2
-- (a claim under way; the acknowledgement that asks has just ended the unclaimed pages).
SELECT DISTINCT ListName FROM Notifications
WHERE IncidentId = ?1 AND (Status = 'Delivered' OR ClaimedUntil > ?2)
ORDER BY ListName
