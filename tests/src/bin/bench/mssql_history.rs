//! The `history` group's year of terminal rows on MS SQL: Delivered rows of the fixtures' site
//! and list spread evenly over the last 365 days, each with its attempt row, as
//! `fixtures::add_central_rows(.., YearOfHistory)` writes them into SQLite. The server makes
//! the rows itself (one `INSERT .. SELECT` over a tally per batch), so writing them costs no
//! round trip per row; there is no file to copy on a server, so every database that starts
//! with the history gets it written afresh before central starts.

use anyhow::{Context, Result};
use central_outbox::store::mssql::ScratchDatabase;
use tokio_util::compat::TokioAsyncWriteCompatExt;

use crate::services::{LIST, RECIPIENTS, SITE_ID};

/// Rows per statement: a batch is one transaction on the server, and its log stays small.
const BATCH: u64 = 20_000;

/// One batch: rows @P1 ..< @P1 + @P2 of @P3, the newest resolved just before now. The tally is
/// 0 ..< 100,000 from five cross joins of ten digits. Times are spread in seconds (365 days of
/// milliseconds overflow DATEADD's int).
const INSERT_BATCH: &str = "
WITH d AS (SELECT v FROM (VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)) AS t(v)),
tally AS (
    SELECT a.v + 10 * b.v + 100 * c.v + 1000 * e.v + 10000 * f.v AS i
    FROM d AS a CROSS JOIN d AS b CROSS JOIN d AS c CROSS JOIN d AS e CROSS JOIN d AS f),
rows AS (
    SELECT CAST(@P1 AS bigint) + i AS k,
           DATEADD(second, -CAST((CAST(@P3 AS bigint) - @P1 - i) * 31536000 / @P3 AS int),
                   SYSUTCDATETIME()) AS created
    FROM tally WHERE i < @P2)
INSERT INTO dbo.Notifications (NotificationId, Type, ListName, Subject, Body, ContentHash,
    Status, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, SiteEnqueuedAt,
    CreatedAt, AttemptCount, ResolvedTargets, LastAttemptAt, DeliveredAt, ResolvedAt, Priority,
    ServeTurn)
SELECT NEWID(), N'Email', @P4, CONCAT(N'Tank ', k % 64, N' high level'),
       CONCAT(N'Level 97% at LT-', RIGHT(CONCAT(N'0000000', k), 7),
              N'; high-high alarm since 10:42, operator action required.'),
       HASHBYTES('SHA2_256', CONCAT(N'history ', k)), N'Delivered', @P5, N'tank-farm-1',
       N'level_alarm.py', NEWID(), DATEADD(millisecond, -5, created), created, 1, @P6,
       DATEADD(millisecond, 1, created), DATEADD(millisecond, 5, created),
       DATEADD(millisecond, 5, created), 2, 1
FROM rows;
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, DurationMs, Outcome,
    LeaseEpoch)
SELECT NotificationId, 1, LastAttemptAt, 4, N'Delivered', 1
FROM dbo.Notifications WHERE Id > @P7;";

/// Writes `rows` history rows into `scratch` (migrated, and empty of notifications).
pub(crate) async fn write(scratch: &ScratchDatabase, rows: u64) -> Result<()> {
    let options = scratch.options();
    let tcp = tokio::net::TcpStream::connect((options.host.as_str(), options.port))
        .await
        .context("connecting to the MS SQL server")?;
    tcp.set_nodelay(true)?;
    let mut client = tiberius::Client::connect(options.tiberius_config(), tcp.compat_write())
        .await
        .context("logging in to the MS SQL server")?;
    let targets = RECIPIENTS.join(", ");
    let mut written = 0u64;
    while written < rows {
        let count = BATCH.min(rows - written);
        let before: i64 = client
            .query("SELECT COALESCE(MAX(Id), 0) FROM dbo.Notifications", &[])
            .await?
            .into_row()
            .await?
            .and_then(|row| row.get::<i64, _>(0))
            .unwrap_or(0);
        client
            .execute(
                INSERT_BATCH,
                &[
                    &(written as i64),
                    &(count as i64),
                    &(rows as i64),
                    &LIST,
                    &SITE_ID,
                    &targets.as_str(),
                    &before,
                ],
            )
            .await
            .with_context(|| format!("writing history rows {written} ..< {}", written + count))?;
        written += count;
    }
    Ok(())
}
