-- dbo.DecodeOutcomeText, revision 1
--
-- The text @Encoded stands for (NULL for NULL): each `%XX` (two hex digits) becomes the
-- character XX names. Built left to right into a new string, so a decoded `%` is never read as
-- a code. A `%` not followed by two hex digits stays as it is, so no text makes the call fail:
-- not even one from a replica still running a release from before the encoding, which sends
-- its texts unencoded (only its texts that hold `%XX` itself would change). NCHAR(0) is NULL on
-- Babelfish (PostgreSQL text cannot hold U+0000): there a NUL is dropped, not an error.
--
-- Why: dbo.RecordAttemptOutcomes takes every outcome text (LastError, ResolvedTargets, Error)
-- this one way, whatever it holds. Babelfish's OPENJSON (and JSON_VALUE) hands a string back
-- still JSON-escaped (`\"`, `\\`, `\n`, `\u0001` ...), where SQL Server unescapes it, and
-- Babelfish's varbinary-to-nvarchar conversion goes through its varchar code page, so a text
-- can travel neither as a plain JSON string nor as hex. So the dispatcher
-- (sql::dispatch::record_outcomes) writes each text with no character JSON escapes: it
-- percent-encodes `%` itself, `"`, `\` and every control character below U+0020 as `%` and two
-- upper-case hex digits (`%25`, `%22`, `%5C`, `%0A` ...); every other character, non-ASCII
-- included, goes as it is. Texts without a `%` (most) skip the call.
CREATE FUNCTION dbo.DecodeOutcomeText (@Encoded nvarchar(max))
RETURNS nvarchar(max)
AS
BEGIN
    DECLARE @decoded nvarchar(max) = N'';
    DECLARE @from int = 1;
    DECLARE @code nvarchar(2);
    DECLARE @hex int;
    DECLARE @at int = CHARINDEX(N'%', @Encoded);
    WHILE @at > 0
    BEGIN
        SET @code = SUBSTRING(@Encoded, @at + 1, 2);
        -- A binary collation: under others a range such as A-F holds accented letters too.
        SET @hex = CASE WHEN @code COLLATE Latin1_General_BIN2 LIKE N'[0-9A-Fa-f][0-9A-Fa-f]' THEN 1 ELSE 0 END;
        SET @decoded = @decoded + SUBSTRING(@Encoded, @from, @at - @from)
            + CASE WHEN @hex = 1 THEN COALESCE(NCHAR(CONVERT(int, CONVERT(varbinary(1), @code, 2))), N'') ELSE N'%' END;
        SET @from = @at + 1 + 2 * @hex;
        SET @at = CHARINDEX(N'%', @Encoded, @from);
    END;
    SET @decoded = @decoded + SUBSTRING(@Encoded, @from, 2147483647);
    RETURN @decoded;
END;
