-- One pass over the live and parked rows, grouped by site (?1 now, ?2 the stuck cutoff); the
-- recently delivered are counted by kpis_delivered.sql, from an index alone. A Held row
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
       MIN(CASE WHEN (Status = 'Pending' AND COALESCE(DeliverAfter, 0) <= ?1)
                 OR (Status IN ('Retrying', 'Held') AND COALESCE(NextAttemptAt, 0) <= ?1)
                THEN MAX(CreatedAt, COALESCE(DeliverAfter, 0)) END),
       MIN(CASE WHEN Status IN ('Retrying', 'Held') AND NextAttemptAt > ?1
                THEN MAX(CreatedAt, COALESCE(DeliverAfter, 0)) END)
FROM Notifications
WHERE Status IN ('Pending', 'Retrying', 'Held', 'Parked')
GROUP BY SourceSiteId
ORDER BY SourceSiteId
