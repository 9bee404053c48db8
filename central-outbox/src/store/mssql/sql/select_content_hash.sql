SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT n.ContentHash FROM dbo.Notifications AS n WHERE n.NotificationId = @P1;
