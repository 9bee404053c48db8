SET XACT_ABORT ON;
SET NOCOUNT ON;
EXEC dbo.ClaimDueNotifications @Epoch = @P1, @ClaimMs = @P2, @LongestWaiting = @P3, @InTurn = @P4, @Type = @P5, @Lease = @P6;
