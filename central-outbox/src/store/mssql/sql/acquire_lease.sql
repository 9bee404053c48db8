SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @held TABLE (Epoch bigint NOT NULL);
BEGIN TRANSACTION;
UPDATE l
SET l.Epoch = CASE WHEN l.Holder = @P2 THEN l.Epoch ELSE l.Epoch + 1 END,
    l.Holder = @P2,
    l.ExpiresAt = DATEADD(millisecond, @P3, @now)
OUTPUT inserted.Epoch INTO @held
FROM dbo.Leases AS l
WHERE l.Name = @P1 AND (l.Holder = @P2 OR l.ExpiresAt <= @now);
INSERT INTO dbo.Leases (Name, Holder, Epoch, ExpiresAt)
OUTPUT inserted.Epoch INTO @held
SELECT @P1, @P2, 1, DATEADD(millisecond, @P3, @now)
WHERE NOT EXISTS (SELECT 1 FROM dbo.Leases AS x WHERE x.Name = @P1);
COMMIT TRANSACTION;
SELECT h.Epoch FROM @held AS h;
