SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT COUNT_BIG(*) AS Waiting, MIN(c.QueuedAt) AS OldestQueuedAt
FROM dbo.StatusCallbacks AS c;
