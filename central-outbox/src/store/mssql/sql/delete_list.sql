SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @deleted int;
BEGIN TRANSACTION;
DELETE l
FROM dbo.NotificationLists AS l
WHERE l.Name = @P1;
SET @deleted = @@ROWCOUNT;
DELETE r
FROM dbo.NotificationListRecipients AS r
WHERE r.ListName = @P1;
COMMIT TRANSACTION;
SELECT @deleted AS Deleted;
