SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
SELECT @now AS ReadAt;
SELECT l.Holder, l.Epoch, l.ExpiresAt FROM dbo.Leases AS l WHERE l.Name = @P1;
