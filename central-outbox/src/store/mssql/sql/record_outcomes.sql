SET XACT_ABORT ON;
SET NOCOUNT ON;
EXEC dbo.RecordAttemptOutcomes @Lease = @P1, @Outcomes = @P2;
