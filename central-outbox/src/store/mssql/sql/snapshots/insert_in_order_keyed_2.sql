SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
BEGIN TRANSACTION;
EXEC dbo.SubmitNotification @NotificationId = @P1, @Type = @P2, @ListName = @P3, @Subject = @P4, @Body = @P5, @TypeData = @P6, @ContentHash = @P7, @SourceSiteId = @P8, @SourceInstanceId = @P9, @SourceScript = @P10, @OriginExecutionId = @P11, @OriginParentExecutionId = @P12, @SiteEnqueuedAt = @P13, @Priority = @P14, @ConditionKey = @P15, @ClearedAtSite = @P16, @ClearedBy = @P17, @SubmittedAt = @now;
EXEC dbo.SubmitNotification @NotificationId = @P18, @Type = @P19, @ListName = @P20, @Subject = @P21, @Body = @P22, @TypeData = @P23, @ContentHash = @P24, @SourceSiteId = @P25, @SourceInstanceId = @P26, @SourceScript = @P27, @OriginExecutionId = @P28, @OriginParentExecutionId = @P29, @SiteEnqueuedAt = @P30, @Priority = @P31, @ConditionKey = @P32, @ClearedAtSite = @P33, @ClearedBy = @P34, @SubmittedAt = @now;
COMMIT TRANSACTION;
