-- Incidents nothing is due for any more (ended, exhausted, or acknowledged without a reminder)
-- whose last change is older than the cutoff ?1: purged with their pages and history, at most ?2
-- per batch. Their notifications go by their own resolution time (select_purgeable.sql).
SELECT Id FROM Incidents
WHERE NextDueAt IS NULL
  AND Status IN ('Acknowledged', 'Exhausted', 'Cleared', 'Discarded')
  AND COALESCE(EndedAt, AcknowledgedAt, OpenedAt) < ?1
ORDER BY Id LIMIT ?2
