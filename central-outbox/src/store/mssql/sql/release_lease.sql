SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
UPDATE l
SET l.ExpiresAt = @now, l.Epoch = l.Epoch + 1
FROM dbo.Leases AS l
WHERE l.Name = @P1 AND l.Holder = @P2 AND l.Epoch = @P3 AND l.ExpiresAt > @now;
SELECT @@ROWCOUNT AS Released;
