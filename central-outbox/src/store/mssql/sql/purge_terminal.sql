SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @doomed TABLE (Id bigint NOT NULL PRIMARY KEY);
DECLARE @gone TABLE (NotificationId uniqueidentifier NOT NULL PRIMARY KEY, Status nvarchar(16) NOT NULL);
DECLARE @history bigint;
BEGIN TRANSACTION;
INSERT INTO @doomed (Id)
SELECT TOP (@P2) n.Id
FROM dbo.Notifications AS n WITH (UPDLOCK, ROWLOCK)
WHERE n.Status IN (N'Delivered', N'Parked', N'Discarded', N'Superseded', N'Cleared') AND n.ResolvedAt < @P1
ORDER BY n.ResolvedAt;
DELETE n
OUTPUT deleted.NotificationId, deleted.Status INTO @gone
FROM dbo.Notifications AS n
JOIN @doomed AS d ON d.Id = n.Id
WHERE n.Status IN (N'Delivered', N'Parked', N'Discarded', N'Superseded', N'Cleared') AND n.ResolvedAt < @P1;
DELETE a
FROM dbo.NotificationAttempts AS a
JOIN @gone AS g ON g.NotificationId = a.NotificationId;
SET @history = @@ROWCOUNT;
COMMIT TRANSACTION;
SELECT COUNT_BIG(*) AS Notifications, COUNT_BIG(CASE WHEN g.Status = N'Parked' THEN 1 END) AS Parked, @history AS HistoryEntries FROM @gone AS g;
