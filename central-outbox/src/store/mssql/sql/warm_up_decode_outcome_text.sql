SET XACT_ABORT ON;
SET NOCOUNT ON;
SELECT dbo.DecodeOutcomeText(N'%22warm-up%22') AS Decoded;
