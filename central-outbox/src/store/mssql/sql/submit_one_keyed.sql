SET XACT_ABORT ON;
SET NOCOUNT ON;
EXEC dbo.SubmitNotification @NotificationId = @P1, @Type = @P2, @ListName = @P3, @Subject = @P4, @Body = @P5, @TypeData = @P6, @ContentHash = @P7, @SourceSiteId = @P8, @SourceInstanceId = @P9, @SourceScript = @P10, @OriginExecutionId = @P11, @OriginParentExecutionId = @P12, @SiteEnqueuedAt = @P13, @Priority = @P14, @ConditionKey = @P15, @ClearedAtSite = @P16, @ClearedBy = @P17, @DeliverAfter = @P18;
