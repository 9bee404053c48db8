//! Database files prepared before a figure starts, so that what is timed is only what the figure
//! is about.
//!
//! - Templates: an empty database of each service, created by the service itself (started once
//!   and stopped cleanly), so the schema is always the one the binaries under test write.
//! - Bulk rows: a million notifications take minutes through the APIs, so rows are written
//!   directly with rusqlite into a copy of a template, with exactly the columns and values the
//!   services write (central's `insert_idempotently` and outcome update, the site's
//!   `insert_buffered`), the same content hash, UUIDv7 ids as the site generates them, and the
//!   same subjects and bodies the load generators send. That includes each central row's place
//!   in the serve order (`Priority`, `ServeTurn`, due time; central's `domain::serve_order`):
//!   a row left at the column defaults (turn 0) would be served before every turn central
//!   gives, so a notification submitted later would queue behind the whole fixture.
//!
//! Only the fixture writer runs with `synchronous=OFF` and an in-memory journal, on files no
//! service has open; the services open the result with their own durable settings (the writer
//! switches the file back to WAL before closing).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use chrono::Utc;
use rusqlite::{Connection, params};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::services::{LIST, RECIPIENTS, SITE_ID};

/// What every benchmark notification says: a typical alarm, about 120 bytes in all.
pub(crate) fn content(i: u64) -> (String, String) {
    (
        format!("Tank {} high level", i % 64),
        format!("Level 97% at LT-{i:07}; high-high alarm since 10:42, operator action required."),
    )
}

pub(crate) const SOURCE_INSTANCE: &str = "tank-farm-1";
pub(crate) const SOURCE_SCRIPT: &str = "level_alarm.py";

/// Central's content hash (`ContentHash::of`): SHA-256 over the length-prefixed content fields.
fn content_hash(fields: [&str; 5]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for field in fields {
        hasher.update((field.len() as u64).to_le_bytes());
        hasher.update(field.as_bytes());
    }
    hasher.finalize().into()
}

/// Copies a stopped service's database (with its WAL, if one was left) to `to`. The `-shm`
/// index is not copied: the first connection rebuilds it from the WAL.
pub(crate) fn copy_db(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    let wal = with_suffix(from, "-wal");
    if wal.exists() {
        std::fs::copy(&wal, with_suffix(to, "-wal"))?;
    }
    Ok(())
}

pub(crate) fn with_suffix(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// Opens a database file for bulk writing (no service may have it open).
fn open_bulk(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
    conn.busy_timeout(Duration::from_secs(5))?;
    // Rollback journal in memory and no fsync: this is fixture generation, not the service.
    // Leaving WAL mode needs exclusive access, which the caller guarantees.
    conn.pragma_update(None, "journal_mode", "MEMORY")?;
    conn.pragma_update(None, "synchronous", "OFF")?;
    conn.pragma_update(None, "cache_size", -256 * 1024)?;
    Ok(conn)
}

/// Puts the file back in WAL mode (what the services expect) and closes it.
fn close_bulk(conn: Connection) -> Result<()> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.close().map_err(|(_, e)| e)?;
    Ok(())
}

/// Makes another central replica hold the dispatcher lease for a day, so central under test
/// serves ingest but never dispatches: the ingest and forwarding figures then measure ingest
/// alone. (This is how a non-leader replica runs in production.)
pub(crate) fn hold_dispatcher_lease(db: &Path) -> Result<()> {
    let conn = Connection::open(db)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let expires = Utc::now().timestamp_millis() + 24 * 3600 * 1000;
    conn.execute(
        "INSERT INTO Leases (Name, Holder, Epoch, ExpiresAt)
         VALUES ('dispatcher', 'bench-other-replica', 1000, ?1)
         ON CONFLICT (Name) DO UPDATE SET Holder = excluded.Holder,
             Epoch = Leases.Epoch + 1, ExpiresAt = excluded.ExpiresAt",
        [expires],
    )?;
    Ok(())
}

/// Starts `site`'s watch of its final statuses, as its first WatchSiteStatus would.
pub(crate) fn watch_site_status(db: &Path, site: &str) -> Result<()> {
    let conn = Connection::open(db)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.execute(
        "INSERT INTO SiteStatusWatchers (SiteId, WatchedAt) VALUES (?1, ?2)
         ON CONFLICT (SiteId) DO UPDATE SET WatchedAt = excluded.WatchedAt",
        rusqlite::params![site, Utc::now().timestamp_millis()],
    )?;
    Ok(())
}

/// How the bulk central rows look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CentralRows {
    /// Just ingested, due now: what the dispatch figure delivers.
    Pending,
    /// Delivered over the last 30 days, one attempt row each: a central's steady state, for
    /// the memory figure.
    Delivered,
    /// Delivered over the last 365 days (the seeds' retention), one attempt row each: the
    /// terminal rows a busy central carries, for the `history` figures.
    YearOfHistory,
}

/// Central's rank for a normal notification (`Priority` column: 0 critical .. 3 low).
const PRIORITY_NORMAL: i64 = 2;

/// Appends `n` notifications of site [`SITE_ID`], all normal, to central's database at `db`.
///
/// Pending rows get the serve turns central gives one site's rows stored into a channel with
/// nothing else waiting (`insert_idempotently`: one past the site's newest waiting turn), so
/// 1..=n in id order, and are due from when they were stored (`NextAttemptAt = CreatedAt`).
/// Delivered rows are not waiting, so their turn is never read again; they get 1, what each
/// got when it arrived at a central that kept up.
pub(crate) fn add_central_rows(db: &Path, n: u64, kind: CentralRows) -> Result<()> {
    let mut conn = open_bulk(db)?;
    let now = Utc::now().timestamp_millis();
    let days: i64 = if kind == CentralRows::YearOfHistory {
        365
    } else {
        30
    };
    let span_ms: i64 = days * 24 * 3600 * 1000;
    let targets = RECIPIENTS.join(", ");
    {
        let txn = conn.transaction()?;
        let mut insert = txn.prepare(
            "INSERT INTO Notifications (
                 NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, Status,
                 SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId,
                 OriginParentExecutionId, SiteEnqueuedAt, CreatedAt, AttemptCount,
                 ResolvedTargets, LastAttemptAt, DeliveredAt, ResolvedAt, NextAttemptAt,
                 Priority, ServeTurn)
             VALUES (?1, 'Email', ?2, ?3, ?4, '', ?5, ?6, ?7, ?8, ?9, ?10, NULL, ?11, ?12, ?13,
                     ?14, ?15, ?16, ?16, ?17, ?18, ?19)",
        )?;
        let mut attempt = txn.prepare(
            "INSERT INTO NotificationAttempts
                 (NotificationId, AttemptNo, StartedAt, DurationMs, Outcome, LeaseEpoch)
             VALUES (?1, 1, ?2, 4, 'Delivered', 1)",
        )?;
        for i in 0..n {
            let (subject, body) = content(i);
            let hash = content_hash(["Email", LIST, &subject, &body, ""]);
            let id = Uuid::now_v7().to_string();
            let execution = Uuid::new_v4().to_string();
            match kind {
                CentralRows::Pending => {
                    insert.execute(params![
                        id,
                        LIST,
                        subject,
                        body,
                        &hash[..],
                        "Pending",
                        SITE_ID,
                        SOURCE_INSTANCE,
                        SOURCE_SCRIPT,
                        execution,
                        now - 5,
                        now,
                        0,
                        None::<String>,
                        None::<i64>,
                        None::<i64>,
                        now,
                        PRIORITY_NORMAL,
                        i as i64 + 1,
                    ])?;
                }
                CentralRows::Delivered | CentralRows::YearOfHistory => {
                    // Oldest first, spread evenly over the span, as they would have arrived.
                    let created = now - span_ms + (i as i64 * span_ms) / (n.max(1) as i64);
                    insert.execute(params![
                        id,
                        LIST,
                        subject,
                        body,
                        &hash[..],
                        "Delivered",
                        SITE_ID,
                        SOURCE_INSTANCE,
                        SOURCE_SCRIPT,
                        execution,
                        created - 5,
                        created,
                        1,
                        targets,
                        created + 1,
                        created + 5,
                        None::<i64>,
                        PRIORITY_NORMAL,
                        1,
                    ])?;
                    attempt.execute(params![id, created + 1])?;
                }
            }
        }
        drop(insert);
        drop(attempt);
        txn.commit()?;
    }
    close_bulk(conn)
}

/// Appends `n` notifications to a site buffer at `db`, as `Send` writes them.
/// The terminal rows of central's database at `db` resolved before `cutoff_ms`: what a purge
/// with that cutoff deletes.
pub(crate) fn terminal_rows_before(db: &Path, cutoff_ms: i64) -> Result<u64> {
    let conn = Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let count: i64 = conn.query_row(
        "SELECT COUNT(*) FROM Notifications
         WHERE Status IN ('Delivered', 'Parked', 'Discarded', 'Superseded', 'Cleared',
                          'Acknowledged')
           AND ResolvedAt < ?1",
        [cutoff_ms],
        |row| row.get(0),
    )?;
    Ok(u64::try_from(count).unwrap_or_default())
}

pub(crate) fn add_site_rows(db: &Path, n: u64) -> Result<()> {
    let mut conn = open_bulk(db)?;
    let now = Utc::now().timestamp_millis();
    {
        let txn = conn.transaction()?;
        let mut insert = txn.prepare(
            "INSERT INTO buffered (notification_id, type, list_name, subject, body, type_data,
                 source_site_id, source_instance_id, source_script, origin_execution_id,
                 origin_parent_execution_id, enqueued_at)
             VALUES (?1, 'Email', ?2, ?3, ?4, '', ?5, ?6, ?7, ?8, NULL, ?9)",
        )?;
        for i in 0..n {
            let (subject, body) = content(i);
            insert.execute(params![
                Uuid::now_v7().to_string(),
                LIST,
                subject,
                body,
                SITE_ID,
                SOURCE_INSTANCE,
                SOURCE_SCRIPT,
                Uuid::new_v4().to_string(),
                now,
            ])?;
        }
        drop(insert);
        txn.commit()?;
    }
    close_bulk(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_length_prefixed() {
        // Moving a byte between fields must change the hash, as in central's ContentHash.
        assert_ne!(
            content_hash(["Email", "ops", "ab", "c", ""]),
            content_hash(["Email", "ops", "a", "bc", ""])
        );
    }
}
