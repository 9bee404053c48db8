-- One way for every outcome text (LastError, ResolvedTargets, Error) into
-- dbo.RecordAttemptOutcomes, whatever it holds. Babelfish's OPENJSON (and JSON_VALUE) hands a
-- string back still JSON-escaped (`\"`, `\\`, `\n`, `\u0001` ...), where SQL Server unescapes it,
-- and Babelfish's varbinary-to-nvarchar conversion goes through its varchar code page, so a
-- text can travel neither as a plain JSON string nor as hex. So the dispatcher
-- (sql::dispatch::record_outcomes) writes each text with no character JSON escapes: it
-- percent-encodes `%` itself, `"`, `\` and every control character below U+0020 as `%` and two
-- upper-case hex digits (`%25`, `%22`, `%5C`, `%0A` ...); every other character, non-ASCII
-- included, goes as it is. dbo.DecodeOutcomeText turns such a text back, and the procedure is
-- that of migration 0007 with its three texts decoded. Texts without a `%` (most) skip the call.

IF OBJECT_ID(N'dbo.DecodeOutcomeText', N'FN') IS NOT NULL
    DROP FUNCTION dbo.DecodeOutcomeText;
GO

-- The text @Encoded stands for (NULL for NULL): each `%XX` (two hex digits) becomes the
-- character XX names. Built left to right into a new string, so a decoded `%` is never read as
-- a code. A `%` not followed by two hex digits stays as it is, so no text makes the call fail:
-- not even one from a replica still running the previous binary during an upgrade, which sends
-- its texts unencoded (only its texts that hold `%XX` itself would change). NCHAR(0) is NULL on
-- Babelfish (PostgreSQL text cannot hold U+0000): there a NUL is dropped, not an error.
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
GO

IF OBJECT_ID(N'dbo.RecordAttemptOutcomes', N'P') IS NOT NULL
    DROP PROCEDURE dbo.RecordAttemptOutcomes;
GO

-- The outcomes of migration 0007 (Held rows stay Held on a retry), with LastError,
-- ResolvedTargets and Error percent-encoded as above.
CREATE PROCEDURE dbo.RecordAttemptOutcomes
    @Lease nvarchar(64),
    @Outcomes nvarchar(max)
AS
BEGIN
SET XACT_ABORT ON;
SET NOCOUNT ON;
BEGIN TRANSACTION;
UPDATE n
SET n.Status = CASE WHEN n.Status = N'Held' AND o.Status = N'Retrying' THEN N'Held' ELSE o.Status END,
    n.RetryCount = o.RetryCount,
    n.LastError = COALESCE(CASE WHEN CHARINDEX(N'%', o.LastError) > 0 THEN dbo.DecodeOutcomeText(o.LastError) ELSE o.LastError END, n.LastError),
    n.NextAttemptAt = o.NextAttemptAt,
    n.DeliveredAt = COALESCE(o.DeliveredAt, n.DeliveredAt),
    n.ResolvedAt = o.ResolvedAt,
    n.ResolvedTargets = COALESCE(CASE WHEN CHARINDEX(N'%', o.ResolvedTargets) > 0 THEN dbo.DecodeOutcomeText(o.ResolvedTargets) ELSE o.ResolvedTargets END, n.ResolvedTargets),
    n.ClaimedUntil = NULL,
    n.ClaimEpoch = NULL
FROM dbo.Notifications AS n
JOIN OPENJSON(@Outcomes) WITH (
    Id bigint '$.Id',
    Epoch bigint '$.Epoch',
    AttemptNo int '$.AttemptNo',
    NotificationId uniqueidentifier '$.NotificationId',
    Status nvarchar(16) '$.Status',
    RetryCount int '$.RetryCount',
    LastError nvarchar(max) '$.LastError',
    NextAttemptAt datetime2(7) '$.NextAttemptAt',
    DeliveredAt datetime2(7) '$.DeliveredAt',
    ResolvedAt datetime2(7) '$.ResolvedAt',
    ResolvedTargets nvarchar(max) '$.ResolvedTargets',
    Outcome nvarchar(32) '$.Outcome',
    DurationMs bigint '$.DurationMs',
    Error nvarchar(max) '$.Error'
) AS o ON o.Id = n.Id
WHERE n.ClaimEpoch = o.Epoch AND n.AttemptCount = o.AttemptNo
  AND EXISTS (SELECT 1 FROM dbo.Leases AS l WHERE l.Name = @Lease AND l.Epoch = o.Epoch);
SELECT n.Id
FROM dbo.Notifications AS n
JOIN OPENJSON(@Outcomes) WITH (Id bigint '$.Id', NotificationId uniqueidentifier '$.NotificationId', AttemptNo int '$.AttemptNo') AS o
  ON o.Id = n.Id
JOIN dbo.NotificationAttempts AS a ON a.NotificationId = o.NotificationId AND a.AttemptNo = o.AttemptNo
WHERE n.ClaimEpoch IS NULL AND n.AttemptCount = o.AttemptNo AND a.Outcome = N'InFlight';
UPDATE a
SET a.Outcome = o.Outcome, a.DurationMs = o.DurationMs,
    a.Error = CASE WHEN CHARINDEX(N'%', o.Error) > 0 THEN dbo.DecodeOutcomeText(o.Error) ELSE o.Error END
FROM dbo.NotificationAttempts AS a
JOIN OPENJSON(@Outcomes) WITH (
    Id bigint '$.Id',
    NotificationId uniqueidentifier '$.NotificationId',
    AttemptNo int '$.AttemptNo',
    Outcome nvarchar(32) '$.Outcome',
    DurationMs bigint '$.DurationMs',
    Error nvarchar(max) '$.Error'
) AS o ON o.NotificationId = a.NotificationId AND o.AttemptNo = a.AttemptNo
JOIN dbo.Notifications AS n ON n.Id = o.Id
WHERE n.ClaimEpoch IS NULL AND n.AttemptCount = o.AttemptNo AND a.Outcome = N'InFlight';
COMMIT TRANSACTION;
END;
GO
