SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
BEGIN TRANSACTION;
EXEC dbo.SubmitNotification @NotificationId = @P1, @Type = @P2, @ListName = @P3, @Subject = @P4, @Body = @P5, @TypeData = @P6, @ContentHash = @P7, @SourceSiteId = @P8, @SourceInstanceId = @P9, @SourceScript = @P10, @OriginExecutionId = @P11, @OriginParentExecutionId = @P12, @SiteEnqueuedAt = @P13, @Priority = @P14, @ConditionKey = @P15, @ClearedAtSite = @P16, @ClearedBy = @P17, @DeliverAfter = @P18, @SubmittedAt = @now;
EXEC dbo.SubmitNotification @NotificationId = @P19, @Type = @P20, @ListName = @P21, @Subject = @P22, @Body = @P23, @TypeData = @P24, @ContentHash = @P25, @SourceSiteId = @P26, @SourceInstanceId = @P27, @SourceScript = @P28, @OriginExecutionId = @P29, @OriginParentExecutionId = @P30, @SiteEnqueuedAt = @P31, @Priority = @P32, @ConditionKey = @P33, @ClearedAtSite = @P34, @ClearedBy = @P35, @DeliverAfter = @P36, @SubmittedAt = @now;
COMMIT TRANSACTION;
