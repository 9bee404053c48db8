-- dbo.AcquireLease, revision 1
--
-- Takes or renews lease @Name for @Holder for @TtlMs milliseconds: renews (same epoch) if the
-- holder was the last to hold it, even if it lapsed (nobody held it in between, so its claims
-- are still its own); takes it with the next epoch if another holder's lease has lapsed; creates
-- it at epoch 1 if it never existed. Returns the epoch held, or no row. Two nodes creating a
-- never-held lease at once: one insert fails on the key (the caller runs it again). The lease
-- row this call wrote is the one with its holder and its new expiry (the UPDATE keeps the row
-- locked until the commit). A procedure, so that a renewal stays quick however busy the server
-- is (migrations/mssql/README.md: why procedures, and the rules they keep).
CREATE PROCEDURE dbo.AcquireLease
    @Name nvarchar(64),
    @Holder nvarchar(1024),
    @TtlMs int
AS
BEGIN
SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @until datetime2(3) = DATEADD(millisecond, @TtlMs, @now);
BEGIN TRANSACTION;
UPDATE dbo.Leases
SET Epoch = CASE WHEN Holder = @Holder THEN Epoch ELSE Epoch + 1 END,
    Holder = @Holder,
    ExpiresAt = @until
WHERE Name = @Name AND (Holder = @Holder OR ExpiresAt <= @now);
INSERT INTO dbo.Leases (Name, Holder, Epoch, ExpiresAt)
SELECT @Name, @Holder, 1, @until
WHERE NOT EXISTS (SELECT 1 FROM dbo.Leases AS x WHERE x.Name = @Name);
SELECT l.Epoch
FROM dbo.Leases AS l
WHERE l.Name = @Name AND l.Holder = @Holder AND l.ExpiresAt = @until;
COMMIT TRANSACTION;
END;
