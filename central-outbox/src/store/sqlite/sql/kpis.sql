-- One pass, grouped by site (?1 now, ?2 the stuck cutoff, ?3 the start of the delivered
-- window). The WHERE keeps the scan to the live, parked and recently delivered rows. A Held row
-- waits by design until its window's end (NextAttemptAt); still Held a stuck threshold after
-- it, nothing is taking it out: it counts as stuck, and from its due time on as due. A
-- scheduled row (DeliverAfter) waits by design until its time: before it, it counts in the
-- queue depth only, and from it on, its ages count from then, not from its arrival
-- (domain::schedule, rule 5).
SELECT SourceSiteId,
       SUM(Status IN ('Pending', 'Retrying', 'Held')),
       SUM((Status IN ('Pending', 'Retrying') AND CreatedAt < ?2
            AND COALESCE(DeliverAfter, 0) < ?2)
           OR (Status = 'Held' AND COALESCE(NextAttemptAt, 0) < ?2)),
       SUM(Status = 'Parked'),
       SUM(Status = 'Delivered' AND ResolvedAt >= ?3),
       MIN(CASE WHEN (Status = 'Pending' AND COALESCE(DeliverAfter, 0) <= ?1)
                 OR (Status IN ('Retrying', 'Held') AND COALESCE(NextAttemptAt, 0) <= ?1)
                THEN MAX(CreatedAt, COALESCE(DeliverAfter, 0)) END),
       MIN(CASE WHEN Status IN ('Retrying', 'Held') AND NextAttemptAt > ?1
                THEN MAX(CreatedAt, COALESCE(DeliverAfter, 0)) END)
FROM Notifications
WHERE Status IN ('Pending', 'Retrying', 'Held', 'Parked')
   OR (Status = 'Delivered' AND ResolvedAt >= ?3)
GROUP BY SourceSiteId
ORDER BY SourceSiteId
