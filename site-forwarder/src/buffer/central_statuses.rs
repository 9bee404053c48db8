//! The final statuses central sent back, as SQL over `central_statuses` (schema v8): storing a
//! batch of them, reading one notification's, reading those after a seq for a `WatchStatus` or
//! a standby, and the prune that keeps the table within `[statuses]`. The capabilities run
//! these inside their jobs (`super::statuses`, `super::status`, `super::replica`).
//!
//! Invariants:
//! - One row per notification: its status with the highest `central_seq` seen. An older one
//!   arriving again (central sends each at least once) changes nothing, not even `seq`.
//! - A stored (new or newer) status gets a `seq` above every one before (AUTOINCREMENT), so a
//!   reader that has seen up to some seq finds every later change after it. A standby stores
//!   the active's statuses at the active's seqs, so the numbering is the pair's.
//! - The prune deletes the oldest rows by `stored_at`, then by `seq`, never anything else.

use std::sync::Arc;

use chrono::DateTime;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::error::{BufferError, Result};
use crate::domain::{CentralStatus, NotificationId, StatusInterest, StatusSeq, StoredStatus};

/// Stores `statuses` at `now_ms` (each at a new seq, or at the seq given with it on a standby),
/// skipping those no newer than what is held; returns the highest seq stored, if any.
pub(super) fn store(
    conn: &Connection,
    statuses: &[(Option<StatusSeq>, CentralStatus)],
    now_ms: i64,
) -> Result<Option<StatusSeq>> {
    let mut drop_older = conn.prepare_cached(
        "DELETE FROM central_statuses WHERE notification_id = ?1 AND central_seq < ?2",
    )?;
    let mut insert = conn.prepare_cached(
        "INSERT INTO central_statuses
             (seq, notification_id, central_seq, condition_key, decided_at, stored_at, view)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT DO NOTHING",
    )?;
    // A standby's copy at the active's seq replaces whatever another numbering left there
    // (this node's own, from before a failover).
    let mut free_seq = conn
        .prepare_cached("DELETE FROM central_statuses WHERE seq = ?1 AND notification_id <> ?2")?;
    let mut head = None;
    for (seq, status) in statuses {
        let id = status.notification_id.to_string();
        drop_older.execute(params![id, status.central_seq])?;
        if let Some(seq) = seq {
            free_seq.execute(params![seq.0, id])?;
        }
        let inserted = insert.execute(params![
            seq.map(|s| s.0),
            id,
            status.central_seq,
            status.condition_key,
            status.decided_at.timestamp_millis(),
            now_ms,
            &status.view[..],
        ])?;
        if inserted > 0 {
            head = Some(StatusSeq(conn.last_insert_rowid()));
        }
    }
    Ok(head)
}

/// The newest seq stored (0 when none ever was): where readers start.
pub(super) fn select_head(conn: &Connection) -> Result<StatusSeq> {
    // sqlite_sequence keeps the highest seq ever handed out, also after the prune deleted it.
    let head: Option<i64> = conn
        .query_row(
            "SELECT seq FROM sqlite_sequence WHERE name = 'central_statuses'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    Ok(StatusSeq(head.unwrap_or(0)))
}

/// The status held for `id`, if any.
pub(super) fn select_one(conn: &Connection, id: NotificationId) -> Result<Option<StoredStatus>> {
    conn.prepare_cached(
        "SELECT seq, notification_id, central_seq, condition_key, decided_at, view
         FROM central_statuses WHERE notification_id = ?1",
    )?
    .query_row([id.to_string()], read_row)
    .optional()?
    .transpose()
}

/// The statuses among the `limit` stored after `after` (oldest first) that `interest` asks
/// about (all without one), and the last seq looked at (`after` when there was none): where the
/// next read starts.
pub(super) fn select_after(
    conn: &Connection,
    after: StatusSeq,
    interest: Option<&StatusInterest>,
    limit: usize,
) -> Result<(Vec<StoredStatus>, StatusSeq)> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn.prepare_cached(
        "SELECT seq, notification_id, central_seq, condition_key, decided_at, view
         FROM central_statuses WHERE seq > ?1 ORDER BY seq LIMIT ?2",
    )?;
    let mut rows = stmt.query(params![after.0, limit])?;
    let (mut out, mut last) = (Vec::new(), after);
    while let Some(row) = rows.next()? {
        let stored = read_row(row)??;
        last = stored.seq;
        if interest.is_none_or(|i| wanted(i, &stored.status)) {
            out.push(stored);
        }
    }
    Ok((out, last))
}

fn wanted(interest: &StatusInterest, status: &CentralStatus) -> bool {
    interest.all
        || interest.ids.contains(&status.notification_id)
        || status
            .condition_key
            .as_ref()
            .is_some_and(|k| interest.condition_keys.contains(k))
}

/// Deletes up to `batch` rows stored before `cutoff_ms`, and then the oldest rows past
/// `max_rows`; returns how many went.
pub(super) fn prune(
    conn: &Connection,
    cutoff_ms: i64,
    max_rows: u64,
    batch: usize,
) -> Result<usize> {
    let batch = i64::try_from(batch).unwrap_or(i64::MAX);
    let aged = conn
        .prepare_cached(
            "DELETE FROM central_statuses WHERE seq IN (
                 SELECT seq FROM central_statuses WHERE stored_at < ?1 ORDER BY stored_at LIMIT ?2)",
        )?
        .execute(params![cutoff_ms, batch])?;
    let count: i64 = conn.query_row("SELECT COUNT(*) FROM central_statuses", [], |r| r.get(0))?;
    let over = (count - i64::try_from(max_rows).unwrap_or(i64::MAX)).clamp(0, batch);
    let extra = conn
        .prepare_cached(
            "DELETE FROM central_statuses WHERE seq IN (
                 SELECT seq FROM central_statuses ORDER BY seq LIMIT ?1)",
        )?
        .execute([over])?;
    Ok(aged + extra)
}

/// How many statuses are held.
pub(super) fn count(conn: &Connection) -> Result<u64> {
    let count: i64 = conn.query_row("SELECT COUNT(*) FROM central_statuses", [], |r| r.get(0))?;
    Ok(u64::try_from(count).unwrap_or(0))
}

/// Records that a standby holds the active's statuses up to `through`.
pub(super) fn save_through(conn: &Connection, through: StatusSeq) -> Result<()> {
    conn.prepare_cached("UPDATE pair_state SET statuses_through = max(statuses_through, ?1)")?
        .execute([through.0])?;
    Ok(())
}

fn read_row(row: &Row<'_>) -> rusqlite::Result<Result<StoredStatus>> {
    let seq: i64 = row.get(0)?;
    let id: String = row.get(1)?;
    let central_seq: i64 = row.get(2)?;
    let condition_key: Option<String> = row.get(3)?;
    let decided_ms: i64 = row.get(4)?;
    let view: Vec<u8> = row.get(5)?;
    Ok(decode(
        seq,
        &id,
        central_seq,
        condition_key,
        decided_ms,
        view,
    ))
}

fn decode(
    seq: i64,
    id: &str,
    central_seq: i64,
    condition_key: Option<String>,
    decided_ms: i64,
    view: Vec<u8>,
) -> Result<StoredStatus> {
    let notification_id = NotificationId::parse(id, "notification_id")
        .map_err(|e| BufferError::Corrupt(format!("central_statuses {seq}: {}", e.problem)))?;
    let decided_at = DateTime::from_timestamp_millis(decided_ms).ok_or_else(|| {
        BufferError::Corrupt(format!("central_statuses {seq}: decided_at out of range"))
    })?;
    Ok(StoredStatus {
        seq: StatusSeq(seq),
        status: CentralStatus {
            notification_id,
            central_seq,
            condition_key,
            decided_at,
            view: Arc::from(view),
        },
    })
}
