SET XACT_ABORT ON;
SET NOCOUNT ON;
EXEC dbo.AcquireLease @Name = @P1, @Holder = @P2, @TtlMs = @P3;
