SET XACT_ABORT ON;
SET NOCOUNT ON;
IF OBJECT_ID(N'dbo.DecodeOutcomeText', N'FN') IS NOT NULL
    DROP FUNCTION dbo.DecodeOutcomeText;
