//! The buffer's side of ClearCondition: marking a key's buffered rows cleared, the durable
//! pending clears (the central half of each clear; `crate::clears` sends them), and what
//! forwarding and replication read of them.
//!
//! Invariants:
//! - A clear is one write job: the key's rows still buffered are marked (`cleared_at`; a row
//!   marked before keeps its time) and the key's pending clear is recorded with `up_to_seq` =
//!   the newest seq handed out so far, read inside the job. A Send committed earlier in the same
//!   transaction is therefore below it and marked, one committed later above it and unmarked.
//! - `pending_clears` holds at most one row per key; a later clear of the key moves its
//!   `up_to_seq` forward (why that is enough: `PendingClears` in the domain). A row is deleted
//!   only once central applied that very watermark, so a clear recorded while central was
//!   applying an earlier one stays pending.
//! - Every change to `pending_clears` is published after its commit
//!   ([`Buffer::pending_clears`]), before the marking it commits with is announced as
//!   [`super::RowChange::Marked`]: a replication stream that copies the marks again has seen
//!   the new list by then, and sends it with them or before.
//! - A standby's pending clears are the active's, replaced as a whole by each list the active
//!   sends ([`replace_pending`]), at the active's seqs like its rows; its head is raised to
//!   their watermarks, so a Send it takes once promoted is above every one of them.
//! - A clear handed over by a former active ([`adopt_clears`]) is recorded at seq 0: due at
//!   once, and holding every unmarked row of the key here until central applied it. The former
//!   active's rows the clear came before are all marked (the clear marked them, and marked the
//!   copies held here during the hand-over), so none of them needs to go first; its rows after
//!   the clear, and this node's own rows of the key (sent while it was active, after the clear
//!   or during a partition), wait for it. A pending clear of the key this node already has is
//!   kept with its watermark (which orders this node's own rows), and a clear as recent as one
//!   this node already had central apply (`applied_clears`) is not recorded again: applying it
//!   again would end this node's rows of the key sent since.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::watch;

use super::{Buffer, BufferError, Page, ROW_COLUMNS, Result, Seq, decode_row, select_head};
use crate::domain::{BufferedNotification, ConditionKey, PendingClear, PendingClears, SiteId};

/// Version 4: each row's condition key and, once a clear ended it, when (Unix ms, NULL = not
/// cleared); the pending clears. Rows written before it have no key, as they were sent.
pub(super) const SCHEMA_V4: &str = "
ALTER TABLE buffered ADD COLUMN condition_key TEXT;
ALTER TABLE buffered ADD COLUMN cleared_at INTEGER;
ALTER TABLE rejected ADD COLUMN condition_key TEXT;
ALTER TABLE rejected ADD COLUMN cleared_at INTEGER;
CREATE INDEX buffered_by_condition_key ON buffered (condition_key)
    WHERE condition_key IS NOT NULL;
CREATE INDEX buffered_cleared ON buffered (seq) WHERE cleared_at IS NOT NULL;
CREATE TABLE pending_clears (
    condition_key TEXT PRIMARY KEY,
    up_to_seq     INTEGER NOT NULL,
    cleared_at    INTEGER NOT NULL
);
";

/// Version 5: per key, the `cleared_at` (Unix ms) of the latest clear central applied for this
/// node while it was active, so that one handed over again by a former active is not applied
/// twice. Emptied when the node hands its buffer over; the [`APPLIED_CLEARS_KEPT`] most recent
/// keys are kept (more only where their times tie).
pub(super) const SCHEMA_V5: &str = "
CREATE TABLE applied_clears (
    condition_key TEXT PRIMARY KEY,
    cleared_at    INTEGER NOT NULL
);
CREATE INDEX applied_clears_by_time ON applied_clears (cleared_at);
";

/// Keys `applied_clears` remembers, the most recently cleared kept. A former active hands over
/// clears it made before it stopped being active; forgetting one means only that, should the
/// former active still hold it when it returns, central is asked to clear the key once more.
/// The bound keeps a site whose keys are ever new (an id in the key) from growing the table
/// for good.
const APPLIED_CLEARS_KEPT: i64 = 10_000;

/// What [`Buffer::adopt`] did with the clears handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdoptedClears {
    /// Recorded, or merged into this node's pending clear of the key.
    pub recorded: usize,
    /// Not recorded: this node had central apply a clear of the key at least as recent.
    pub already_applied: usize,
}

/// What [`Buffer::clear_condition`] committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionCleared {
    /// Buffered rows this clear marked (rows marked by an earlier clear are not counted).
    pub marked: usize,
    /// The key's pending clear as it now stands.
    pub pending: PendingClear,
}

impl Buffer {
    /// Ends this site's buffered notifications with `key` and records the key's pending clear,
    /// in one write job; returns once it is committed.
    pub async fn clear_condition(
        &self,
        site: &SiteId,
        key: ConditionKey,
        at: DateTime<Utc>,
    ) -> Result<ConditionCleared> {
        let site = site.as_str().to_owned();
        let at_ms = at.timestamp_millis();
        let announce = Arc::clone(&self.announce);
        let (marked, pending, _) = self
            .db
            .write_then(
                move |conn| {
                    let marked: Vec<Seq> = conn
                        .prepare_cached(
                            "UPDATE buffered SET cleared_at = ?3
                             WHERE condition_key = ?1 AND source_site_id = ?2
                               AND cleared_at IS NULL
                             RETURNING seq",
                        )?
                        .query_map(params![key.as_str(), site, at_ms], |r| r.get(0).map(Seq))?
                        .collect::<rusqlite::Result<_>>()?;
                    let up_to = select_head(conn)?;
                    conn.prepare_cached(
                        "INSERT INTO pending_clears (condition_key, up_to_seq, cleared_at)
                         VALUES (?1, ?2, ?3)
                         ON CONFLICT (condition_key) DO UPDATE SET
                             up_to_seq = max(up_to_seq, excluded.up_to_seq),
                             cleared_at = excluded.cleared_at",
                    )?
                    .execute(params![key.as_str(), up_to.0, at_ms])?;
                    let clears = select_pending(conn, Invalid::Report)?;
                    let pending = clears
                        .iter()
                        .find(|c| c.condition_key == key)
                        .cloned()
                        .ok_or_else(|| {
                            BufferError::Corrupt(format!(
                                "the pending clear of {key} was written but does not read back"
                            ))
                        })?;
                    Ok::<_, BufferError>((marked, pending, clears))
                },
                // The list first: see the module invariants.
                move |(marked, _, clears)| {
                    announce.pending_clears(clears.clone());
                    announce.marked(marked.clone());
                },
            )
            .await?;
        Ok(ConditionCleared {
            marked: marked.len(),
            pending,
        })
    }

    /// The pending clears as committed, with a change notification after every commit that
    /// changes them.
    pub fn pending_clears(&self) -> watch::Receiver<PendingClears> {
        self.announce.pending_clears.subscribe()
    }

    /// The pending clears as last published (a commit is published just after it is visible).
    /// Test-only: the service follows them through [`Self::pending_clears`].
    #[cfg(test)]
    pub fn pending_clears_now(&self) -> PendingClears {
        self.announce.pending_clears.borrow().clone()
    }

    /// Up to `limit` rows after `after`, oldest first (as [`Buffer::next_after`]), and the
    /// pending clears as the table holds them just after: every clear committed before a row
    /// that was read is among them (unless central applied it since, which releases the row
    /// anyway), so the forwarder never misses the clear that holds a row. The published list
    /// could lag a commit the read already sees.
    pub async fn next_to_forward(&self, after: Seq, limit: usize) -> Result<(Page, PendingClears)> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.db
            .read(move |conn| {
                let page = super::select_after(conn, after, limit)?;
                let clears = select_pending(conn, Invalid::Skip)?;
                Ok((page, clears))
            })
            .await
    }

    /// The pending clears as the table holds them now (a hand-over reads them after its rows).
    pub async fn read_pending_clears(&self) -> Result<PendingClears> {
        self.db
            .read(|conn| Ok(select_pending(conn, Invalid::Report)?))
            .await
    }

    /// Deletes the pending clear once central applied it, unless a later clear of the key moved
    /// it meanwhile, or a clear handed over made it more recent (it then stays, to be sent
    /// again), and remembers it as applied. Returns whether it was deleted.
    pub async fn forget_clear(&self, clear: PendingClear) -> Result<bool> {
        let announce = Arc::clone(&self.announce);
        let (deleted, _) = self
            .db
            .write_then(
                move |conn| {
                    let key = clear.condition_key.as_str();
                    let at_ms = clear.cleared_at.timestamp_millis();
                    let deleted = conn
                        .prepare_cached(
                            "DELETE FROM pending_clears
                             WHERE condition_key = ?1 AND up_to_seq = ?2 AND cleared_at = ?3",
                        )?
                        .execute(params![key, clear.up_to.0, at_ms])?;
                    if deleted > 0 {
                        remember_applied(conn, key, at_ms)?;
                    }
                    Ok::<_, BufferError>((deleted > 0, select_pending(conn, Invalid::Report)?))
                },
                move |(_, clears)| announce.pending_clears(clears.clone()),
            )
            .await?;
        Ok(deleted)
    }

    /// The oldest seq still buffered; `None` when the buffer is empty.
    pub async fn oldest_seq(&self) -> Result<Option<Seq>> {
        self.db
            .read(|conn| {
                let oldest: Option<i64> =
                    conn.query_row("SELECT MIN(seq) FROM buffered", [], |r| r.get(0))?;
                Ok(oldest.map(Seq))
            })
            .await
    }

    /// The rows still buffered at `seqs` (those gone are left out), in the order given.
    pub async fn rows_at(&self, seqs: Vec<Seq>) -> Result<Page> {
        self.db
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(&format!(
                    "SELECT {ROW_COLUMNS} FROM buffered WHERE seq = ?1"
                ))?;
                let mut page = Page::default();
                for seq in seqs {
                    let mut rows = stmt.query([seq.0])?;
                    if let Some(row) = rows.next()? {
                        match decode_row(row)? {
                            Ok(n) => page.rows.push((seq, n)),
                            Err(problem) => {
                                let id: String = row.get(1)?;
                                page.unreadable.push((seq, id, problem.to_string()));
                            }
                        }
                    }
                }
                Ok(page)
            })
            .await
    }

    /// The seqs up to `through` whose rows are marked cleared, oldest first.
    pub async fn marked_seqs(&self, through: Seq) -> Result<Vec<Seq>> {
        self.db
            .read(move |conn| {
                let seqs = conn
                    .prepare_cached(
                        "SELECT seq FROM buffered WHERE cleared_at IS NOT NULL AND seq <= ?1
                         ORDER BY seq",
                    )?
                    .query_map([through.0], |r| r.get(0).map(Seq))?
                    .collect::<rusqlite::Result<_>>()?;
                Ok(seqs)
            })
            .await
    }
}

/// What [`select_pending`] does with a row that no longer passes the rules (edited by hand):
/// it could never be sent, so it is left out rather than stopping the buffer, and logged where
/// that is not once per forwarded page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Invalid {
    Report,
    Skip,
}

/// Every pending clear, oldest watermark first.
pub(super) fn select_pending(
    conn: &Connection,
    invalid: Invalid,
) -> Result<PendingClears, group_commit::Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT condition_key, up_to_seq, cleared_at FROM pending_clears ORDER BY up_to_seq",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    let mut clears = Vec::new();
    for row in rows {
        let (key, up_to, at_ms) = row?;
        let parsed = ConditionKey::parse(key.clone(), "condition_key");
        match (parsed, DateTime::from_timestamp_millis(at_ms)) {
            (Ok(condition_key), Some(cleared_at)) => clears.push(PendingClear {
                condition_key,
                up_to: Seq(up_to),
                cleared_at,
            }),
            _ if invalid == Invalid::Skip => {}
            _ => tracing::error!(
                condition_key = %key, up_to_seq = up_to, cleared_at = at_ms,
                "a pending clear in the site buffer is invalid; it is never sent to central"
            ),
        }
    }
    Ok(PendingClears::new(clears))
}

/// An adopted row the active already holds, but marked cleared by the node handing it over:
/// the held copy is marked too (keeping its time if it was marked already). Returns its seq
/// when it changed.
pub(super) fn mark_held_copy(conn: &Connection, row: &BufferedNotification) -> Result<Option<Seq>> {
    let Some(at) = row.cleared_at_site else {
        return Ok(None);
    };
    let seq = conn
        .prepare_cached(
            "UPDATE buffered SET cleared_at = ?2 WHERE notification_id = ?1 AND cleared_at IS NULL
             RETURNING seq",
        )?
        .query_row(params![row.id.to_string(), at.timestamp_millis()], |r| {
            r.get(0).map(Seq)
        })
        .optional()?;
    Ok(seq)
}

/// Deletes every pending clear and forgets the applied ones (the node has handed them over and
/// its buffer is about to become a copy of another's); returns the pending clears' keys.
pub(super) fn drop_pending(conn: &Connection) -> Result<Vec<String>> {
    let keys = conn
        .prepare_cached("DELETE FROM pending_clears RETURNING condition_key")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    conn.prepare_cached("DELETE FROM applied_clears")?
        .execute([])?;
    Ok(keys)
}

/// Records that central applied a clear of `key` committed at `at_ms`, keeping the most
/// recent [`APPLIED_CLEARS_KEPT`] keys.
fn remember_applied(conn: &Connection, key: &str, at_ms: i64) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO applied_clears (condition_key, cleared_at) VALUES (?1, ?2)
         ON CONFLICT (condition_key) DO UPDATE SET
             cleared_at = max(cleared_at, excluded.cleared_at)",
    )?
    .execute(params![key, at_ms])?;
    // NULL (nothing deleted) while fewer are kept.
    conn.prepare_cached(
        "DELETE FROM applied_clears WHERE cleared_at < (
             SELECT cleared_at FROM applied_clears ORDER BY cleared_at DESC LIMIT 1 OFFSET ?1)",
    )?
    .execute([APPLIED_CLEARS_KEPT - 1])?;
    Ok(())
}

/// A standby takes the active's pending clears: they replace its own (an empty list deletes
/// them all), and its head is raised to their highest watermark, so the first seq it hands out
/// once promoted is above every one of them even when the active's rows up to there have not
/// reached it yet. Returns the new head.
pub(super) fn replace_pending(conn: &Connection, clears: &[PendingClear]) -> Result<Seq> {
    conn.prepare_cached("DELETE FROM pending_clears")?
        .execute([])?;
    let mut insert = conn.prepare_cached(
        "INSERT INTO pending_clears (condition_key, up_to_seq, cleared_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (condition_key) DO UPDATE SET
             up_to_seq = max(up_to_seq, excluded.up_to_seq),
             cleared_at = max(cleared_at, excluded.cleared_at)",
    )?;
    let mut highest = Seq::START;
    for clear in clears {
        insert.execute(params![
            clear.condition_key.as_str(),
            clear.up_to.0,
            clear.cleared_at.timestamp_millis()
        ])?;
        highest = highest.max(clear.up_to);
    }
    raise_head(conn, highest)?;
    Ok(select_head(conn)?)
}

/// Makes AUTOINCREMENT hand out seqs above `seq` from now on (it never goes back).
fn raise_head(conn: &Connection, seq: Seq) -> Result<()> {
    if seq <= Seq::START {
        return Ok(());
    }
    let raised = conn
        .prepare_cached("UPDATE sqlite_sequence SET seq = max(seq, ?1) WHERE name = 'buffered'")?
        .execute([seq.0])?;
    if raised == 0 {
        // No row was ever inserted into `buffered`: SQLite has no entry for it yet.
        conn.prepare_cached("INSERT INTO sqlite_sequence (name, seq) VALUES ('buffered', ?1)")?
            .execute([seq.0])?;
    }
    Ok(())
}

/// Records the clears a former active handed over (see the module invariants); their
/// `up_to` is the former active's seq and is not used.
pub(super) fn adopt_clears(conn: &Connection, clears: &[PendingClear]) -> Result<AdoptedClears> {
    let mut adopted = AdoptedClears::default();
    let mut applied =
        conn.prepare_cached("SELECT cleared_at FROM applied_clears WHERE condition_key = ?1")?;
    let mut record = conn.prepare_cached(
        "INSERT INTO pending_clears (condition_key, up_to_seq, cleared_at) VALUES (?1, 0, ?2)
         ON CONFLICT (condition_key) DO UPDATE SET
             cleared_at = max(cleared_at, excluded.cleared_at)",
    )?;
    for clear in clears {
        let key = clear.condition_key.as_str();
        let at_ms = clear.cleared_at.timestamp_millis();
        let applied_at: Option<i64> = applied.query_row([key], |r| r.get(0)).optional()?;
        if applied_at.is_some_and(|applied_at| applied_at >= at_ms) {
            adopted.already_applied += 1;
            continue;
        }
        record.execute(params![key, at_ms])?;
        adopted.recorded += 1;
    }
    Ok(adopted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::RowChange;
    use crate::buffer::tests::notification;
    use crate::domain::{LocalStatus, to_buffer_precision};

    fn open(dir: &tempfile::TempDir) -> Buffer {
        Buffer::open(&dir.path().join("buffer.db")).unwrap()
    }

    fn key(text: &str) -> ConditionKey {
        ConditionKey::parse(text.into(), "condition_key").unwrap()
    }

    fn site() -> SiteId {
        SiteId::parse("site-a".into()).unwrap()
    }

    /// A notification about `condition`.
    fn about(subject: &str, condition: &str) -> BufferedNotification {
        BufferedNotification {
            condition_key: Some(key(condition)),
            ..notification(subject)
        }
    }

    fn marks(buffer_rows: &[(Seq, BufferedNotification)]) -> Vec<Option<DateTime<Utc>>> {
        buffer_rows.iter().map(|(_, n)| n.cleared_at_site).collect()
    }

    #[tokio::test]
    async fn a_clear_marks_only_this_sites_unmarked_rows_of_the_key_and_records_the_head() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        buffer.enqueue(about("a", "k1")).await.unwrap();
        buffer.enqueue(about("b", "k1")).await.unwrap();
        buffer.enqueue(about("c", "k2")).await.unwrap();
        buffer.enqueue(notification("d")).await.unwrap();
        let mut elsewhere = about("e", "k1");
        elsewhere.provenance.source_site_id = SiteId::parse("site-b".into()).unwrap();
        let head = buffer.enqueue(elsewhere).await.unwrap();

        let at = to_buffer_precision(Utc::now());
        let cleared = buffer
            .clear_condition(&site(), key("k1"), at)
            .await
            .unwrap();
        assert_eq!(cleared.marked, 2);
        assert_eq!(
            cleared.pending,
            PendingClear {
                condition_key: key("k1"),
                up_to: head,
                cleared_at: at,
            }
        );
        let rows = buffer.next_after(Seq::START, 10).await.unwrap().rows;
        assert_eq!(marks(&rows), vec![Some(at), Some(at), None, None, None]);
        let Ok(LocalStatus::Buffered(status)) = buffer.local_status(rows[0].1.id).await else {
            panic!("still buffered");
        };
        assert_eq!(status.cleared_at, Some(at));
        assert_eq!(status.condition_key.as_deref(), Some("k1"));

        // Cleared again: the marked rows keep their time, a row sent since is marked, and the
        // key's one pending clear moves to the new head.
        let later = buffer.enqueue(about("f", "k1")).await.unwrap();
        let again = at + chrono::Duration::seconds(5);
        let cleared = buffer
            .clear_condition(&site(), key("k1"), again)
            .await
            .unwrap();
        assert_eq!(cleared.marked, 1);
        assert_eq!(cleared.pending.up_to, later);
        let rows = buffer.next_after(Seq::START, 10).await.unwrap().rows;
        assert_eq!(
            marks(&rows),
            vec![Some(at), Some(at), None, None, None, Some(again)]
        );
        assert_eq!(buffer.pending_clears_now().len(), 1);
        assert_eq!(buffer.stats().await.unwrap().pending_clears, 1);
    }

    /// A clear of a key nothing is buffered for still records its central half.
    #[tokio::test]
    async fn a_clear_with_nothing_buffered_is_still_pending_for_central() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let cleared = buffer
            .clear_condition(&site(), key("k1"), Utc::now())
            .await
            .unwrap();
        assert_eq!(cleared.marked, 0);
        assert_eq!(cleared.pending.up_to, Seq::START);
        assert_eq!(
            buffer.pending_clears_now().due(None).count(),
            1,
            "due at once"
        );
    }

    #[tokio::test]
    async fn pending_clears_are_published_survive_a_reopen_and_go_only_at_their_watermark() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let mut published = buffer.pending_clears();
        buffer.enqueue(about("a", "k1")).await.unwrap();
        let first = buffer
            .clear_condition(&site(), key("k1"), Utc::now())
            .await
            .unwrap()
            .pending;
        assert!(published.has_changed().unwrap());
        assert_eq!(
            published.borrow_and_update().iter().collect::<Vec<_>>(),
            vec![&first]
        );
        drop(buffer);

        let buffer = open(&dir);
        assert_eq!(
            buffer.pending_clears_now().iter().collect::<Vec<_>>(),
            vec![&first]
        );
        // Cleared again after another Send while central was applying the first: forgetting
        // the first leaves the moved one.
        buffer.enqueue(about("b", "k1")).await.unwrap();
        let second = buffer
            .clear_condition(&site(), key("k1"), Utc::now())
            .await
            .unwrap()
            .pending;
        assert!(second.up_to > first.up_to);
        assert!(!buffer.forget_clear(first).await.unwrap());
        assert_eq!(buffer.pending_clears_now().len(), 1);
        let published = buffer.pending_clears();
        assert!(buffer.forget_clear(second).await.unwrap());
        assert!(published.has_changed().unwrap());
        assert!(published.borrow().is_empty());
        assert_eq!(buffer.stats().await.unwrap().pending_clears, 0);
        drop(buffer);
        assert!(open(&dir).pending_clears_now().is_empty());
    }

    /// Replication learns of the marks, and the recent rows (which hold the rows unmarked) are
    /// forgotten, so a stream reads the marked rows from the table.
    #[tokio::test]
    async fn marks_are_announced_and_the_recent_rows_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let mut changes = buffer.row_changes();
        let reader = buffer.recent_rows();
        let a = buffer.enqueue(about("a", "k1")).await.unwrap();
        let b = buffer.enqueue(about("b", "k2")).await.unwrap();
        assert!(reader.after(Seq::START, 10).is_some());
        buffer
            .clear_condition(&site(), key("k1"), Utc::now())
            .await
            .unwrap();
        assert!(reader.after(Seq::START, 10).is_none(), "read the table");
        match changes.try_recv().unwrap() {
            RowChange::Marked(seqs) => assert_eq!(&*seqs, &[a]),
            other => panic!("{other:?}"),
        }
        // Nothing marked, nothing announced.
        buffer
            .clear_condition(&site(), key("k1"), Utc::now())
            .await
            .unwrap();
        assert!(changes.try_recv().is_err());

        assert_eq!(buffer.marked_seqs(b).await.unwrap(), vec![a]);
        assert_eq!(buffer.marked_seqs(Seq::START).await.unwrap(), vec![]);
        let page = buffer.rows_at(vec![b, Seq(99), a]).await.unwrap();
        let seqs: Vec<Seq> = page.rows.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, vec![b, a], "in the order asked, gone ones left out");
        assert!(page.rows[1].1.cleared_at_site.is_some());
        assert_eq!(buffer.oldest_seq().await.unwrap(), Some(a));
        buffer.remove(vec![a, b]).await.unwrap();
        assert_eq!(buffer.oldest_seq().await.unwrap(), None);
    }

    /// A rejected row keeps its key and its mark beside the reason.
    #[tokio::test]
    async fn a_rejected_row_keeps_its_key_and_mark() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let seq = buffer.enqueue(about("a", "k1")).await.unwrap();
        let at = to_buffer_precision(Utc::now());
        buffer
            .clear_condition(&site(), key("k1"), at)
            .await
            .unwrap();
        assert!(buffer.reject(seq, "no such list".into()).await.unwrap());
        let (condition_key, cleared_ms): (String, i64) = buffer
            .db
            .read(|c| {
                c.query_row("SELECT condition_key, cleared_at FROM rejected", [], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .map_err(BufferError::from)
            })
            .await
            .unwrap();
        assert_eq!(
            (condition_key.as_str(), cleared_ms),
            ("k1", at.timestamp_millis())
        );
    }

    /// A buffer the previous binary wrote (schema v3) opens; its rows, waiting or rejected,
    /// read back with no key, and can be cleared by none.
    #[tokio::test]
    async fn a_version_3_buffer_is_upgraded_and_its_rows_have_no_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("buffer.db");
        let n = notification("written by the old binary");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(super::super::SCHEMA_V1).unwrap();
            conn.execute_batch(super::super::pair::SCHEMA_V2).unwrap();
            conn.execute_batch(super::super::SCHEMA_V3).unwrap();
            conn.pragma_update(None, "user_version", 3).unwrap();
            let p = &n.provenance;
            conn.execute(
                "INSERT INTO buffered (notification_id, type, list_name, subject, body, \
                 type_data, source_site_id, source_instance_id, source_script, \
                 origin_execution_id, origin_parent_execution_id, enqueued_at, priority) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, 1)",
                params![
                    n.id.to_string(),
                    n.content.kind.as_str(),
                    n.content.list_name.as_str(),
                    n.content.subject.as_str(),
                    n.content.body.as_str(),
                    n.content.type_data.as_str(),
                    p.source_site_id.as_str(),
                    p.source_instance_id.as_str(),
                    p.source_script.as_str(),
                    p.origin_execution_id.map(|u| u.to_string()),
                    p.origin_parent_execution_id.map(|u| u.to_string()),
                    p.site_enqueued_at.timestamp_millis(),
                ],
            )
            .unwrap();
        }

        let buffer = Buffer::open(&path).unwrap();
        let rows = buffer.next_after(Seq::START, 10).await.unwrap().rows;
        let expected = BufferedNotification {
            priority: crate::domain::Priority::High,
            ..n
        };
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].1, expected, "the same row, with no key and no mark");
        let version: i64 = buffer
            .db
            .read(|c| {
                c.query_row("PRAGMA user_version", [], |r| r.get(0))
                    .map_err(BufferError::from)
            })
            .await
            .unwrap();
        assert_eq!(version, super::super::SCHEMA_VERSION);
        assert!(buffer.pending_clears_now().is_empty());
        let cleared = buffer
            .clear_condition(&site(), key("k1"), Utc::now())
            .await
            .unwrap();
        assert_eq!(cleared.marked, 0);
        let keyed = about("new", "k1");
        buffer.enqueue(keyed.clone()).await.unwrap();
        let rows = buffer.next_after(Seq::START, 10).await.unwrap().rows;
        assert_eq!(rows.last().map(|(_, r)| r), Some(&keyed));
    }

    /// A clear handed over by a former active: recorded due at once where the node has none of
    /// the key; merged into the node's own pending clear (its watermark kept, the later time
    /// taken, so the clear is sent again if central was applying the older one); not recorded
    /// again once central applied a clear of the key at least as recent. The end of a
    /// hand-over forgets what was applied.
    #[tokio::test]
    async fn handed_over_clears_are_merged_per_key_and_never_applied_twice() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let at = |seconds: i64| {
            to_buffer_precision(DateTime::from_timestamp(1_700_000_000 + seconds, 0).unwrap())
        };
        let handed = |condition: &str, seconds: i64| PendingClear {
            condition_key: key(condition),
            // The former active's seq: means nothing here.
            up_to: Seq(999),
            cleared_at: at(seconds),
        };
        let stored = |buffer: &Buffer| -> Vec<(String, i64, DateTime<Utc>)> {
            buffer
                .pending_clears_now()
                .iter()
                .map(|c| (c.condition_key.to_string(), c.up_to.0, c.cleared_at))
                .collect()
        };
        buffer.enqueue(about("a", "k1")).await.unwrap();
        let own = buffer
            .clear_condition(&site(), key("k1"), at(10))
            .await
            .unwrap()
            .pending;
        assert_eq!(own.up_to, Seq(1));

        let adopted = buffer
            .adopt(Vec::new(), vec![handed("k1", 20), handed("k2", 5)])
            .await
            .unwrap();
        assert_eq!(
            adopted.clears,
            AdoptedClears {
                recorded: 2,
                already_applied: 0
            }
        );
        assert_eq!(
            stored(&buffer),
            vec![("k2".into(), 0, at(5)), ("k1".into(), 1, at(20))]
        );
        // Central applied the older k1 meanwhile: the merged one stays, to be sent again.
        assert!(!buffer.forget_clear(own).await.unwrap());
        let merged = buffer.pending_clears_now().iter().nth(1).cloned().unwrap();
        let k2 = buffer.pending_clears_now().iter().next().cloned().unwrap();
        assert!(buffer.forget_clear(merged).await.unwrap());
        assert!(buffer.forget_clear(k2).await.unwrap());
        assert!(stored(&buffer).is_empty());

        // Handed over again (a repeated hand-over): as recent as applied, nothing to do; a
        // later clear of the key is new.
        let adopted = buffer
            .adopt(
                Vec::new(),
                vec![handed("k1", 20), handed("k2", 4), handed("k2", 6)],
            )
            .await
            .unwrap();
        assert_eq!(
            adopted.clears,
            AdoptedClears {
                recorded: 1,
                already_applied: 2
            }
        );
        assert_eq!(stored(&buffer), vec![("k2".into(), 0, at(6))]);

        // After a hand-over of its own the node remembers nothing applied.
        let head = buffer.head_now();
        let finished = buffer.finish_handover(head, 2).await.unwrap();
        assert_eq!(finished.deleted_clears, vec!["k2".to_owned()]);
        let applied: i64 = buffer
            .db
            .read(|c| {
                c.query_row("SELECT COUNT(*) FROM applied_clears", [], |r| r.get(0))
                    .map_err(BufferError::from)
            })
            .await
            .unwrap();
        assert_eq!(applied, 0);
    }

    /// Only the most recently cleared keys are remembered as applied.
    #[tokio::test]
    async fn applied_clears_keep_the_most_recent_keys() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let kept = buffer
            .db
            .write(|conn| {
                for i in 0..=APPLIED_CLEARS_KEPT {
                    remember_applied(conn, &format!("k{i}"), 1_000 + i)?;
                }
                // Applied again, later: kept, and no other key goes.
                remember_applied(conn, "k5", 1_000_000)?;
                let kept: Vec<String> = conn
                    .prepare(
                        "SELECT condition_key FROM applied_clears ORDER BY cleared_at LIMIT 2",
                    )?
                    .query_map([], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()?;
                let count: i64 =
                    conn.query_row("SELECT COUNT(*) FROM applied_clears", [], |r| r.get(0))?;
                Ok::<_, BufferError>((kept, count))
            })
            .await
            .unwrap();
        assert_eq!(kept.1, APPLIED_CLEARS_KEPT);
        assert_eq!(kept.0, vec!["k1".to_owned(), "k2".to_owned()], "k0 went");
    }

    /// A stored key that breaks the rules (edited by hand) is reported and left out: the buffer
    /// still opens and forwards.
    #[tokio::test]
    async fn an_invalid_stored_key_is_a_bad_row_and_an_invalid_pending_clear_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let bad = buffer.enqueue(about("a", "k1")).await.unwrap();
        buffer
            .db
            .write(move |c| {
                c.execute(
                    "UPDATE buffered SET condition_key = 'tank 4' WHERE seq = ?1",
                    [bad.0],
                )?;
                c.execute("INSERT INTO pending_clears VALUES ('tank 4', 1, 0)", [])
                    .map_err(BufferError::from)
            })
            .await
            .unwrap();
        let page = buffer.next_after(Seq::START, 10).await.unwrap();
        assert!(page.rows.is_empty());
        assert!(
            page.unreadable[0].2.starts_with("condition_key:"),
            "{:?}",
            page.unreadable
        );
        drop(buffer);
        assert!(open(&dir).pending_clears_now().is_empty());
    }
}
