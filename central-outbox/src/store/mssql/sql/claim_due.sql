SET XACT_ABORT ON;
SET NOCOUNT ON;
EXEC dbo.ClaimDueNotifications @Epoch = @P1, @ClaimMs = @P2, @Limit = @P3, @Type = @P4, @Lease = @P5;
