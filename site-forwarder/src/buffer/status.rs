//! The buffer as `GetStatus`, `GetBufferStats`, the health reports and `/metrics` see it:
//! where one notification stands locally, the buffer's figures, and whether it takes Sends.
//! Reads only; nothing here changes the buffer.

use chrono::DateTime;
use rusqlite::{Connection, OptionalExtension};

use super::central_statuses;
use super::error::{BufferError, Result};
use super::room::RoomStatus;
use super::store::Store;
use crate::domain::{
    BufferStats, BufferedStatus, LocalStatus, NotificationId, NotificationType, Priority,
    StoredStatus,
};

/// Reads of where notifications and the buffer stand (`grpc::site_notify`, the health reporter,
/// the metrics scraper, the node's first start).
#[derive(Clone, Debug)]
pub(crate) struct StatusReader {
    store: Store,
}

impl StatusReader {
    pub(super) fn new(store: Store) -> Self {
        Self { store }
    }

    /// Where the notification stands locally: buffered, rejected, or not here.
    pub(crate) async fn local_status(&self, id: NotificationId) -> Result<LocalStatus> {
        self.store
            .db
            .read(move |conn| select_status(conn, id))
            .await
    }

    /// Whether the notification is still waiting in the buffer. Test-only: the service asks
    /// for the whole `local_status`.
    #[cfg(test)]
    pub(crate) async fn contains(&self, id: NotificationId) -> Result<bool> {
        Ok(matches!(
            self.local_status(id).await?,
            LocalStatus::Buffered(_)
        ))
    }

    /// The final status central sent back for the notification, if this node holds one.
    pub(crate) async fn central_status(&self, id: NotificationId) -> Result<Option<StoredStatus>> {
        self.store
            .db
            .read(move |conn| central_statuses::select_one(conn, id))
            .await
    }

    /// The buffer's depth, its oldest row, the rejected rows and the pending clears.
    pub(crate) async fn stats(&self) -> Result<BufferStats> {
        self.store.db.read(select_stats).await
    }

    /// Whether the buffer takes Sends now, and why not (as of the last check).
    pub(crate) fn room_status(&self) -> RoomStatus {
        self.store.room.status()
    }
}

fn select_status(conn: &Connection, id: NotificationId) -> Result<LocalStatus> {
    let id = id.to_string();
    let mut buffered = conn.prepare_cached(
        "SELECT type, list_name, enqueued_at, priority, condition_key, cleared_at, deliver_after
         FROM buffered WHERE notification_id = ?1",
    )?;
    let row = buffered
        .query_row([&id], |r| {
            Ok((
                (
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                ),
                (
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, Option<i64>>(5)?,
                    r.get::<_, Option<i64>>(6)?,
                ),
            ))
        })
        .optional()?;
    if let Some((
        (kind, list_name, enqueued_ms, rank),
        (condition_key, cleared_ms, deliver_after_ms),
    )) = row
    {
        let kind = NotificationType::from_db(&kind)
            .ok_or_else(|| BufferError::Corrupt(format!("{id}: unknown type {kind:?}")))?;
        let enqueued_at = DateTime::from_timestamp_millis(enqueued_ms)
            .ok_or_else(|| BufferError::Corrupt(format!("{id}: enqueued_at out of range")))?;
        let priority = Priority::from_rank(rank)
            .ok_or_else(|| BufferError::Corrupt(format!("{id}: unknown priority rank {rank}")))?;
        let at = |column: &str, ms: Option<i64>| {
            ms.map(|ms| {
                DateTime::from_timestamp_millis(ms)
                    .ok_or_else(|| BufferError::Corrupt(format!("{id}: {column} out of range")))
            })
            .transpose()
        };
        let cleared_at = at("cleared_at", cleared_ms)?;
        let deliver_after = at("deliver_after", deliver_after_ms)?;
        return Ok(LocalStatus::Buffered(BufferedStatus {
            kind,
            list_name,
            enqueued_at,
            priority,
            condition_key,
            cleared_at,
            deliver_after,
        }));
    }
    let mut rejected =
        conn.prepare_cached("SELECT reason FROM rejected WHERE notification_id = ?1")?;
    let reason: Option<String> = rejected.query_row([&id], |r| r.get(0)).optional()?;
    Ok(match reason {
        Some(reason) => LocalStatus::Rejected { reason },
        None => LocalStatus::NotHere,
    })
}

fn select_stats(conn: &Connection) -> Result<BufferStats> {
    // COUNT(*) walks the table, which stays cheap even for a week-long outage's worth of rows;
    // the oldest row is the lowest seq, found through the primary key.
    let depth: i64 = conn.query_row("SELECT COUNT(*) FROM buffered", [], |r| r.get(0))?;
    let oldest: Option<i64> = conn
        .query_row(
            "SELECT enqueued_at FROM buffered ORDER BY seq LIMIT 1",
            [],
            |r| r.get(0),
        )
        .optional()?;
    let rejected: i64 = conn.query_row("SELECT COUNT(*) FROM rejected", [], |r| r.get(0))?;
    let pending_clears: i64 =
        conn.query_row("SELECT COUNT(*) FROM pending_clears", [], |r| r.get(0))?;
    let pending_acks: i64 =
        conn.query_row("SELECT COUNT(*) FROM pending_acks", [], |r| r.get(0))?;
    Ok(BufferStats {
        depth: u64::try_from(depth).unwrap_or(0),
        oldest_enqueued_at: oldest.and_then(DateTime::from_timestamp_millis),
        rejected: u64::try_from(rejected).unwrap_or(0),
        pending_clears: u64::try_from(pending_clears).unwrap_or(0),
        pending_acks: u64::try_from(pending_acks).unwrap_or(0),
    })
}
