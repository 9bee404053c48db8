-- A replica whose clock lags may count into a window already ended elsewhere: it counts into
-- the newer one instead of starting the count again.
INSERT INTO ConsolidationWindows (ListName, WindowStart, Arrived) VALUES (?1, ?2, 1)
ON CONFLICT (ListName) DO UPDATE SET
    Arrived = CASE WHEN excluded.WindowStart > WindowStart THEN 1
                   ELSE Arrived + 1 END,
    WindowStart = MAX(WindowStart, excluded.WindowStart)
RETURNING Arrived
