SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @doomed TABLE (Id bigint NOT NULL PRIMARY KEY);
DECLARE @gone TABLE (NotificationId uniqueidentifier NOT NULL PRIMARY KEY, Status nvarchar(16) NOT NULL);
DECLARE @history bigint;
DECLARE @incidents TABLE (Id bigint NOT NULL PRIMARY KEY);
DECLARE @incidentsGone bigint;
BEGIN TRANSACTION;
INSERT INTO @doomed (Id)
SELECT TOP (@P2) n.Id
FROM dbo.Notifications AS n WITH (UPDLOCK, ROWLOCK)
WHERE n.Status IN (N'Delivered', N'Parked', N'Discarded', N'Superseded', N'Cleared', N'Acknowledged') AND n.ResolvedAt < @P1;
DELETE n
OUTPUT deleted.NotificationId, deleted.Status INTO @gone
FROM dbo.Notifications AS n
JOIN @doomed AS d ON d.Id = n.Id
WHERE n.Status IN (N'Delivered', N'Parked', N'Discarded', N'Superseded', N'Cleared', N'Acknowledged') AND n.ResolvedAt < @P1;
DELETE a
FROM dbo.NotificationAttempts AS a
JOIN @gone AS g ON g.NotificationId = a.NotificationId;
SET @history = @@ROWCOUNT;
DELETE k
FROM dbo.StatusCallbackCalls AS k
JOIN @gone AS g ON g.NotificationId = k.NotificationId;
SET @history = @history + @@ROWCOUNT;
DELETE c
FROM dbo.StatusCallbacks AS c
JOIN @gone AS g ON g.NotificationId = c.NotificationId;
INSERT INTO @incidents (Id)
SELECT TOP (@P2) i.Id
FROM dbo.Incidents AS i
WHERE i.NextDueAt IS NULL AND i.Status IN (N'Acknowledged', N'Exhausted', N'Cleared', N'Discarded')
  AND COALESCE(i.EndedAt, i.AcknowledgedAt, i.OpenedAt) < @P1
ORDER BY i.Id;
DELETE p FROM dbo.IncidentPages AS p JOIN @incidents AS x ON x.Id = p.IncidentId;
DELETE h FROM dbo.IncidentHistory AS h JOIN @incidents AS x ON x.Id = h.IncidentId;
DELETE i FROM dbo.Incidents AS i JOIN @incidents AS x ON x.Id = i.Id;
SET @incidentsGone = @@ROWCOUNT;
COMMIT TRANSACTION;
SELECT COUNT_BIG(*) AS Notifications, COUNT_BIG(CASE WHEN g.Status = N'Parked' THEN 1 END) AS Parked, @history AS HistoryEntries, @incidentsGone AS Incidents FROM @gone AS g;
