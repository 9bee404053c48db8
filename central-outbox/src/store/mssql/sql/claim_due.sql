SET XACT_ABORT ON;
SET NOCOUNT ON;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @claimed TABLE (
    Id bigint NOT NULL PRIMARY KEY,
    NotificationId uniqueidentifier NOT NULL,
    Type nvarchar(16) NOT NULL,
    ListName nvarchar(256) NOT NULL,
    Subject nvarchar(1000) NOT NULL,
    Body nvarchar(max) NOT NULL,
    TypeData nvarchar(max) NOT NULL,
    RetryCount int NOT NULL,
    AttemptCount int NOT NULL,
    SourceSiteId nvarchar(64) NOT NULL,
    SourceInstanceId nvarchar(512) NOT NULL,
    SourceScript nvarchar(512) NOT NULL,
    OriginExecutionId uniqueidentifier NULL,
    OriginParentExecutionId uniqueidentifier NULL,
    SiteEnqueuedAt datetime2(3) NOT NULL,
    NextAttemptAt datetime2(3) NULL
);
DECLARE @ids TABLE (Id bigint NOT NULL PRIMARY KEY);
BEGIN TRANSACTION;
INSERT INTO @ids (Id)
SELECT TOP (@P3) due.Id
FROM (
    SELECT c.Id, c.NextAttemptAt
    FROM dbo.Notifications AS c WITH (ROWLOCK, READPAST, UPDLOCK)
    WHERE c.Status IN (N'Pending', N'Retrying') AND c.ClaimedUntil IS NULL
      AND c.Type = @P4 AND (c.NextAttemptAt IS NULL OR c.NextAttemptAt <= @now)
    UNION ALL
    SELECT r.Id, r.NextAttemptAt
    FROM dbo.Notifications AS r WITH (ROWLOCK, READPAST, UPDLOCK)
    WHERE r.ClaimedUntil IS NOT NULL AND r.ClaimedUntil <= @now
      AND r.Type = @P4 AND r.Status IN (N'Pending', N'Retrying')
      AND (r.NextAttemptAt IS NULL OR r.NextAttemptAt <= @now)
) AS due
ORDER BY due.NextAttemptAt, due.Id;
UPDATE n
SET n.ClaimedUntil = DATEADD(millisecond, @P2, @now),
    n.ClaimEpoch = @P1,
    n.LastAttemptAt = @now,
    n.AttemptCount = n.AttemptCount + 1
OUTPUT inserted.Id, inserted.NotificationId, inserted.Type, inserted.ListName, inserted.Subject, inserted.Body, inserted.TypeData, inserted.RetryCount, inserted.AttemptCount, inserted.SourceSiteId, inserted.SourceInstanceId, inserted.SourceScript, inserted.OriginExecutionId, inserted.OriginParentExecutionId, inserted.SiteEnqueuedAt, inserted.NextAttemptAt INTO @claimed
FROM dbo.Notifications AS n
JOIN @ids AS d ON d.Id = n.Id
WHERE n.Status IN (N'Pending', N'Retrying')
  AND n.Type = @P4
  AND (n.NextAttemptAt IS NULL OR n.NextAttemptAt <= @now)
  AND (n.ClaimedUntil IS NULL OR n.ClaimedUntil <= @now)
  AND EXISTS (SELECT 1 FROM dbo.Leases AS l WHERE l.Name = @P5 AND l.Epoch = @P1 AND l.ExpiresAt > @now);
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, LeaseEpoch)
SELECT c.NotificationId, c.AttemptCount, @now, N'InFlight', @P1
FROM @claimed AS c;
COMMIT TRANSACTION;
SELECT c.Id, c.NotificationId, c.Type, c.ListName, c.Subject, c.Body, c.TypeData, c.RetryCount, c.AttemptCount, c.SourceSiteId, c.SourceInstanceId, c.SourceScript, c.OriginExecutionId, c.OriginParentExecutionId, c.SiteEnqueuedAt
FROM @claimed AS c
ORDER BY c.NextAttemptAt, c.Id;
