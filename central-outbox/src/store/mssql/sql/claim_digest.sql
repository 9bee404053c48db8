SET XACT_ABORT ON;
SET NOCOUNT ON;
EXEC dbo.ClaimDigestNotifications @Epoch = @P1, @ClaimMs = @P2, @Type = @P3, @Lease = @P4, @DigestId = @P5;
