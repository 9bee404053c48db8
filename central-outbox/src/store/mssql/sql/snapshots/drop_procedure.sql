SET XACT_ABORT ON;
SET NOCOUNT ON;
IF OBJECT_ID(N'dbo.SubmitNotification', N'P') IS NOT NULL
    DROP PROCEDURE dbo.SubmitNotification;
