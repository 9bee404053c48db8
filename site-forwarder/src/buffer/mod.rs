//! The durable store-and-forward buffer: a SQLite file (WAL, `synchronous=FULL`) written through
//! `group_commit`, so concurrent `Send`s share one transaction and one fsync.
//!
//! Invariants:
//! - [`Buffer::enqueue`] returns only after the row is committed: an id handed to a script is
//!   never lost, whatever happens to the process afterwards.
//! - A row leaves `buffered` only in [`Buffer::settle`]: deleted because central acked it, or
//!   moved (in the same job, so it is never in neither table) to `rejected` with the reason.
//! - `seq` is AUTOINCREMENT, so it is never reused even after the newest row is deleted. The
//!   forwarder's cursor depends on that: without it, a row enqueued after the buffer drained could
//!   get the seq of an already-sent row and be skipped.
//! - Reads use the read-only pool and see the last commit; they never block the writer.
//! - Every committed change is announced after its commit, from the writer's follow-ups and so
//!   in commit order: [`Buffer::head`] moves to the newest seq, [`Buffer::row_changes`] carries
//!   the seqs that left `buffered` and those a clear marked, [`Buffer::pending_clears`] the
//!   pending clears, and while a replication stream is attached the new rows are kept in memory
//!   ([`recent`]) for it to copy without reading them back. A standby's replication stream is
//!   built from these ([`pair`] has the pair's own tables and operations, [`clears`] the
//!   ClearCondition ones).
//! - A Send is stored only while the buffer keeps room to drain ([`room`]): past
//!   `min_free_disk_bytes` or `max_buffer_bytes` it is refused with [`BufferError::NoRoom`],
//!   while deletes of acked rows always have the reserve.
//! - A settle that fails for lack of space (or because the commit failed) is retried here with a
//!   growing pause until it commits or the buffer is stopped: the forwarder's stream stays open,
//!   and the rows central acked are not sent again meanwhile.

mod clears;
mod pair;
pub mod recent;
pub mod room;

pub use clears::AdoptedClears;
pub use pair::{PairRecord, ReplicaChanges, RetainedSpan};
pub use recent::RecentPage;
pub use room::{NoRoom, ROOM_CHECK_INTERVAL, RoomStatus, SpaceLimits};

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use group_commit::{Database, Durability, Options};
use rusqlite::{Connection, OptionalExtension, Row, params};
use tokio::sync::{Notify, broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::domain::{
    Body, BufferStats, BufferedNotification, BufferedStatus, ConditionKey, ContentError, ListName,
    LocalStatus, NotificationContent, NotificationId, NotificationType, PendingClears, Priority,
    SiteId, Subject, TypeData,
};

/// Why a buffer operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BufferError {
    #[error("site buffer: {0}")]
    Database(#[from] group_commit::Error),
    #[error("site buffer holds invalid data: {0}")]
    Corrupt(String),
    /// A Send refused to keep room for draining (see [`room`]); nothing was stored.
    #[error("the site buffer takes no Sends now: {0}")]
    NoRoom(#[from] NoRoom),
}

impl BufferError {
    /// Whether the disk was full: SQLite's SQLITE_FULL, from a statement or from the commit.
    pub fn is_disk_full(&self) -> bool {
        let Self::Database(group_commit::Error::Sqlite(e) | group_commit::Error::Commit(e)) = self
        else {
            return false;
        };
        matches!(
            e.as_ref(),
            rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull
        )
    }

    /// Whether the whole group commit failed (disk full, I/O error, the file locked by another
    /// process): not this job's fault, and worth trying again after a pause.
    fn is_commit_failure(&self) -> bool {
        matches!(self, Self::Database(group_commit::Error::Commit(_))) || self.is_disk_full()
    }
}

impl From<rusqlite::Error> for BufferError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Database(e.into())
    }
}

pub type Result<T, E = BufferError> = std::result::Result<T, E>;

pub use crate::domain::Seq;

/// Schema version this binary writes, kept in `PRAGMA user_version`.
const SCHEMA_VERSION: i64 = 5;

/// Version 1: the waiting rows and the rows central rejected. Columns mirror `NotificationSubmit`
/// so a row can be resubmitted byte for byte; times are Unix milliseconds (UTC).
const SCHEMA_V1: &str = "
CREATE TABLE buffered (
    seq                        INTEGER PRIMARY KEY AUTOINCREMENT,
    notification_id            TEXT NOT NULL UNIQUE,
    type                       TEXT NOT NULL,
    list_name                  TEXT NOT NULL,
    subject                    TEXT NOT NULL,
    body                       TEXT NOT NULL,
    type_data                  TEXT NOT NULL,
    source_site_id             TEXT NOT NULL,
    source_instance_id         TEXT NOT NULL,
    source_script              TEXT NOT NULL,
    origin_execution_id        TEXT,
    origin_parent_execution_id TEXT,
    enqueued_at                INTEGER NOT NULL
);
CREATE TABLE rejected (
    seq                        INTEGER PRIMARY KEY,
    notification_id            TEXT NOT NULL UNIQUE,
    type                       TEXT NOT NULL,
    list_name                  TEXT NOT NULL,
    subject                    TEXT NOT NULL,
    body                       TEXT NOT NULL,
    type_data                  TEXT NOT NULL,
    source_site_id             TEXT NOT NULL,
    source_instance_id         TEXT NOT NULL,
    source_script              TEXT NOT NULL,
    origin_execution_id        TEXT,
    origin_parent_execution_id TEXT,
    enqueued_at                INTEGER NOT NULL,
    reason                     TEXT NOT NULL,
    rejected_at                INTEGER NOT NULL
);
";

/// Version 3: the notification's priority, as its `Priority::rank` (0 critical .. 3 low). Rows
/// written before it read back as normal (rank 2), what they were sent as: a buffer written by
/// the previous binary opens and forwards unchanged.
const SCHEMA_V3: &str = "
ALTER TABLE buffered ADD COLUMN priority INTEGER NOT NULL DEFAULT 2;
ALTER TABLE rejected ADD COLUMN priority INTEGER NOT NULL DEFAULT 2;
";

/// Column list shared by the SELECTs that decode a row with [`decode_row`], and by
/// [`move_to_rejected`], which copies these columns from `buffered` to `rejected`.
const ROW_COLUMNS: &str = "seq, notification_id, type, list_name, subject, body, type_data, \
     source_site_id, source_instance_id, source_script, origin_execution_id, \
     origin_parent_execution_id, enqueued_at, priority, condition_key, cleared_at";

/// Row change announcements a slow replication stream may fall behind by before it is reset (and
/// resumed from the table). Each is one settle job's seqs, so this is thousands of acks.
const CHANGES_BACKLOG: usize = 4096;

/// Read connections. The forwarder holds at most one read at a time and `GetStatus` /
/// `GetBufferStats` are light, so a few are plenty.
const READERS: usize = 4;

/// First pause before a failed settle is tried again, doubled after each failure up to
/// [`SETTLE_RETRY_MAX`]. A full disk is rarely freed within milliseconds; an I/O hiccup or a
/// lock held by another process often is.
const SETTLE_RETRY_FIRST: Duration = Duration::from_millis(100);
/// Longest pause between settle attempts: a freed disk is noticed within this long, and a
/// failing disk costs one commit attempt (and one debug line) per pause, not a hot loop.
const SETTLE_RETRY_MAX: Duration = Duration::from_secs(5);

/// A batch of buffered rows, oldest first, as read for forwarding.
#[derive(Debug, Default)]
pub struct Page {
    pub rows: Vec<(Seq, BufferedNotification)>,
    /// Rows that no longer pass the content rules (written by an older binary with looser rules,
    /// or edited by hand): `(seq, notification_id as stored, problem)`. They can never be
    /// forwarded, so the forwarder moves them to `rejected` instead of letting them block.
    pub unreadable: Vec<(Seq, String, String)>,
}

impl Page {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.unreadable.is_empty()
    }

    /// The highest seq in the page (readable or not), where the next read continues from.
    pub fn last_seq(&self) -> Option<Seq> {
        let rows = self.rows.iter().map(|(seq, _)| *seq);
        let unreadable = self.unreadable.iter().map(|(seq, _, _)| *seq);
        rows.chain(unreadable).max()
    }
}

/// A committed change to rows already in `buffered`, as replication streams must copy it.
#[derive(Debug, Clone)]
pub enum RowChange {
    /// These seqs left `buffered` (acked, rejected).
    Removed(Arc<[Seq]>),
    /// A clear marked the rows at these seqs cleared: a standby holding them must get them again.
    Marked(Arc<[Seq]>),
}

/// The site's buffer. Cheap to clone; all clones share the writer, the readers and the
/// announcements.
#[derive(Clone, Debug)]
pub struct Buffer {
    db: Database,
    announce: Arc<Announcements>,
    /// Whether a Send fits (see [`room`]).
    room: Arc<room::Room>,
    /// Cancelled when the node stops: a settle waiting to retry gives up with its error.
    stop: CancellationToken,
}

/// What the buffer tells the rest of the node after each commit. Made from the writer's
/// follow-ups (`group_commit::Database::write_then`), so in commit order.
#[derive(Debug)]
struct Announcements {
    /// Signalled after each committed enqueue so the forwarder wakes without polling.
    /// `notify_one` stores a permit when nobody waits, so a wake-up is never lost.
    enqueued: Arc<Notify>,
    /// The newest seq committed to `buffered`, for the replication stream (which, unlike the
    /// forwarder's permit, any number of streams can watch).
    head: watch::Sender<Seq>,
    /// Seqs that left `buffered` or were marked cleared, announced after each commit that
    /// removed or marked rows (under the `recent` lock, see [`recent`]).
    changes: broadcast::Sender<RowChange>,
    /// The pending clears as last committed, for the forwarder and the clear sender.
    pending_clears: watch::Sender<PendingClears>,
    /// The rows committed most recently, for replication streams. Locked briefly by the
    /// writer's follow-ups and by a stream taking a page.
    recent: Mutex<recent::RecentRows>,
}

impl Announcements {
    fn recent(&self) -> std::sync::MutexGuard<'_, recent::RecentRows> {
        // A poisoned lock only means a thread panicked while holding it; the recent rows are
        // then cleared rather than trusted (streams read the table).
        self.recent.lock().unwrap_or_else(|poisoned| {
            let mut recent = poisoned.into_inner();
            recent.clear();
            recent
        })
    }

    /// A committed insert: the head moves forward (never back) and the forwarder wakes.
    fn inserted(&self, seq: Seq) {
        self.head.send_if_modified(|head| {
            let newer = seq > *head;
            if newer {
                *head = seq;
            }
            newer
        });
        self.enqueued.notify_one();
    }

    /// A committed Send: kept for the replication streams, then the head moves.
    fn sent(&self, seq: Seq, row: Arc<BufferedNotification>) {
        self.recent().committed(seq, row);
        self.inserted(seq);
    }

    /// A commit that changed `buffered` other than by Sends and removals (`head`: its newest
    /// insert): the recent rows no longer describe the table, so streams read it until the
    /// next Send.
    fn other_change(&self, head: Option<Seq>) {
        self.recent().clear();
        if let Some(head) = head {
            self.inserted(head);
        }
    }

    fn removed(&self, seqs: Vec<Seq>) {
        if !seqs.is_empty() {
            // Under the lock, so a stream taking recent rows either misses a removed row or
            // takes it before this announcement, which it then receives.
            let mut recent = self.recent();
            recent.removed(&seqs);
            // No receiver (no standby attached) is not an error.
            let _ = self.changes.send(RowChange::Removed(seqs.into()));
        }
    }

    /// A commit that marked the rows at `seqs` cleared. The recent rows hold them unmarked, so
    /// they are forgotten, under the same lock as the announcement: a stream either took a row
    /// before and receives the announcement (and copies it again), or reads it marked.
    fn marked(&self, seqs: Vec<Seq>) {
        if !seqs.is_empty() {
            let mut recent = self.recent();
            recent.clear();
            let _ = self.changes.send(RowChange::Marked(seqs.into()));
        }
    }

    /// The pending clears changed; `clears` is what the commit left.
    fn pending_clears(&self, clears: PendingClears) {
        self.pending_clears.send_replace(clears);
    }
}

/// A replication stream's hold on the buffer's recent rows: they are kept while one exists.
#[derive(Debug)]
pub struct RecentReader {
    announce: Arc<Announcements>,
    id: recent::ReaderId,
}

impl RecentReader {
    /// Up to `max_rows` rows committed after `cursor`, from memory; `None` when they must be
    /// read from the table ([`Buffer::next_after`]). The cursor only moves forward: rows up to
    /// it, and those returned, are not kept for this reader any longer.
    pub fn after(&self, cursor: Seq, max_rows: usize) -> Option<RecentPage> {
        self.announce.recent().after(self.id, cursor, max_rows)
    }
}

impl Drop for RecentReader {
    fn drop(&mut self) {
        self.announce.recent().detach(self.id);
    }
}

impl Buffer {
    /// Opens (creating if needed) the buffer file and brings its schema up to date, with no
    /// space limits of its own. Blocking: call it from a blocking context or at start-up.
    // Test-only shorthand: the service opens with limits and settles acks and rejections
    // together (`open_with`, `settle`).
    #[cfg(test)]
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, SpaceLimits::NONE, CancellationToken::new())
    }

    /// Opens (creating if needed) the buffer file as `open` does, refusing Sends past `limits`; `stop` ends a settle's retries.
    pub fn open_with(path: &Path, limits: SpaceLimits, stop: CancellationToken) -> Result<Self> {
        let mut options = Options::new(path);
        // Every acked Send must survive power loss, not just a process crash.
        options.durability = Durability::Full;
        options.readers = READERS;
        let mut head = Seq::START;
        let mut pending_clears = PendingClears::default();
        let mut pages = room::Pages::default();
        let db = Database::open(&options, |conn| {
            migrate(conn)?;
            head = select_head(conn)?;
            pending_clears = clears::select_pending(conn, clears::Invalid::Report)?;
            keep_job_journals_in_memory(conn)?;
            pages = room::Pages::read(conn)?;
            Ok(())
        })?;
        Ok(Self {
            room: room::Room::new(path, limits, pages),
            stop,
            db,
            announce: Arc::new(Announcements {
                enqueued: Arc::new(Notify::new()),
                head: watch::Sender::new(head),
                changes: broadcast::Sender::new(CHANGES_BACKLOG),
                pending_clears: watch::Sender::new(pending_clears),
                recent: Mutex::default(),
            }),
        })
    }

    /// The newest seq ever committed to `buffered` (rows since deleted included).
    pub fn head(&self) -> watch::Receiver<Seq> {
        self.announce.head.subscribe()
    }

    /// The newest seq ever committed to `buffered`, now.
    pub fn head_now(&self) -> Seq {
        *self.announce.head.borrow()
    }

    /// Announcements of the seqs that leave `buffered` or are marked cleared, from now on.
    pub fn row_changes(&self) -> broadcast::Receiver<RowChange> {
        self.announce.changes.subscribe()
    }

    /// Keeps the rows committed from now on in memory while the reader lives.
    pub fn recent_rows(&self) -> RecentReader {
        let id = self.announce.recent().attach();
        RecentReader {
            announce: Arc::clone(&self.announce),
            id,
        }
    }

    /// Fires after each committed enqueue.
    pub fn enqueued(&self) -> &Arc<Notify> {
        &self.announce.enqueued
    }

    /// Stores a notification durably; returns once it is committed. Refused with
    /// [`BufferError::NoRoom`], storing nothing, when it would leave the buffer no room to drain.
    pub async fn enqueue(&self, notification: BufferedNotification) -> Result<Seq> {
        // Held until the commit is answered: until then the row counts as in flight.
        let _admitted = self.room.admit(stored_bytes(&notification))?;
        let row = Arc::new(notification);
        let announced = Arc::clone(&row);
        let announce = Arc::clone(&self.announce);
        let room = Arc::clone(&self.room);
        let (seq, _) = self
            .db
            .write_then(
                move |conn| {
                    let seq = insert_buffered(conn, &row)?;
                    // Figures for the next admission; a failure to read them only leaves
                    // the previous ones, never fails the Send.
                    Ok::<_, BufferError>((seq, room::Pages::read(conn).ok()))
                },
                move |(seq, pages)| {
                    if let Some(pages) = pages {
                        room.pages(*pages);
                    }
                    announce.sent(*seq, announced);
                },
            )
            .await?;
        Ok(seq)
    }

    /// Whether the buffer takes Sends now, and why not (as of the last check).
    pub fn room_status(&self) -> RoomStatus {
        self.room.status()
    }

    /// Changes of whether the buffer takes Sends.
    pub fn watch_room(&self) -> watch::Receiver<RoomStatus> {
        self.room.watch()
    }

    /// Checks the room every [`ROOM_CHECK_INTERVAL`] until `stop`, so a refusal lifts (and
    /// health follows) when space frees with no Send to notice it.
    pub async fn keep_room_current(&self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(ROOM_CHECK_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let pages = self
                .db
                .read(|conn| room::Pages::read(conn).map_err(BufferError::from))
                .await;
            match pages {
                Ok(pages) => self.room.pages(pages),
                Err(error) => {
                    tracing::debug!(%error, "cannot read the buffer's page counts; using the last")
                }
            }
            if self.room.refusing() {
                self.make_room().await;
            } else {
                self.room.reassess();
            }
        }
    }

    /// Gives the WAL's space back (see [`room::Room::checkpoint`]), then checks the room again.
    async fn make_room(&self) {
        let room = Arc::clone(&self.room);
        let checkpointed = tokio::task::spawn_blocking(move || room.checkpoint()).await;
        match checkpointed {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::debug!(%error, "cannot checkpoint the site buffer now"),
            Err(error) => tracing::warn!(%error, "the site buffer's checkpoint task failed"),
        }
        self.room.reassess();
    }

    /// Up to `limit` rows with a seq greater than `after`, oldest first.
    pub async fn next_after(&self, after: Seq, limit: usize) -> Result<Page> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.db
            .read(move |conn| select_after(conn, after, limit))
            .await
    }

    /// Deletes acked rows and moves rejected rows to `rejected`, all in one write job (one
    /// savepoint in the next group commit). Seqs no longer buffered are skipped: a row may be
    /// acked twice when it was resent after a reconnect. Returns how many rows left `buffered`.
    ///
    /// A failed commit (a full disk above all) is retried after a pause that grows from
    /// [`SETTLE_RETRY_FIRST`] to [`SETTLE_RETRY_MAX`], until it commits or the buffer is
    /// stopped (then the last error is returned). Meanwhile Sends are refused when the disk was
    /// full. Other errors are returned at once.
    pub async fn settle(&self, acked: Vec<Seq>, rejected: Vec<(Seq, String)>) -> Result<usize> {
        if acked.is_empty() && rejected.is_empty() {
            return Ok(0);
        }
        let mut pause = SETTLE_RETRY_FIRST;
        let mut failures: u32 = 0;
        loop {
            let error = match self.try_settle(acked.clone(), rejected.clone()).await {
                Ok(settled) => {
                    if failures > 0 {
                        tracing::info!(
                            attempts = failures + 1,
                            "acked rows deleted from the site buffer after failed attempts"
                        );
                    }
                    self.room.deletes_succeeded();
                    if self.room.refusing() {
                        self.make_room().await;
                    }
                    return Ok(settled);
                }
                Err(error) if error.is_commit_failure() => error,
                Err(error) => return Err(error),
            };
            if error.is_disk_full() {
                self.room.deletes_failing(error.to_string());
                // The WAL may hold space a checkpoint gives back (rows written before the
                // reserve was set up, or another program's files deleted since).
                self.make_room().await;
            }
            failures += 1;
            if failures == 1 {
                tracing::warn!(
                    %error, rows = acked.len() + rejected.len(), retry_in = ?pause,
                    "cannot delete acked rows from the site buffer; retrying (they are not resent)"
                );
            } else {
                tracing::debug!(%error, attempt = failures, retry_in = ?pause, "settle failed again");
            }
            tokio::select! {
                () = self.stop.cancelled() => return Err(error),
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(SETTLE_RETRY_MAX);
        }
    }

    /// One attempt of [`Self::settle`].
    async fn try_settle(&self, acked: Vec<Seq>, rejected: Vec<(Seq, String)>) -> Result<usize> {
        let now = Utc::now().timestamp_millis();
        let mut gone: Vec<Seq> = acked.clone();
        gone.extend(rejected.iter().map(|(seq, _)| *seq));
        let announce = Arc::clone(&self.announce);
        let room = Arc::clone(&self.room);
        let (settled, _) = self
            .db
            .write_then(
                move |conn| {
                    let mut settled = 0;
                    for (seq, reason) in &rejected {
                        settled += move_to_rejected(conn, *seq, reason, now)?;
                    }
                    for seq in &acked {
                        settled += delete_buffered(conn, *seq)?;
                    }
                    Ok::<_, BufferError>((settled, room::Pages::read(conn).ok()))
                },
                // Every requested seq, settled now or before: removing an absent row is a no-op
                // for a standby too, and a row acked twice must not stay on it.
                move |(_, pages)| {
                    if let Some(pages) = pages {
                        room.pages(*pages);
                    }
                    announce.removed(gone);
                },
            )
            .await?;
        Ok(settled)
    }

    /// Deletes acked rows (see [`Self::settle`]).
    // Test-only shorthand: the service opens with limits and settles acks and rejections
    // together (`open_with`, `settle`).
    #[cfg(test)]
    pub async fn remove(&self, acked: Vec<Seq>) -> Result<usize> {
        self.settle(acked, Vec::new()).await
    }

    /// Moves one row to `rejected` with the reason (see [`Self::settle`]).
    // Test-only shorthand: the service opens with limits and settles acks and rejections
    // together (`open_with`, `settle`).
    #[cfg(test)]
    pub async fn reject(&self, seq: Seq, reason: String) -> Result<bool> {
        Ok(self.settle(Vec::new(), vec![(seq, reason)]).await? > 0)
    }

    /// Whether the notification is still waiting in the buffer. Test-only: the service asks
    /// for the whole `local_status`.
    #[cfg(test)]
    pub async fn contains(&self, id: NotificationId) -> Result<bool> {
        Ok(matches!(
            self.local_status(id).await?,
            LocalStatus::Buffered(_)
        ))
    }

    /// Where the notification stands locally: buffered, rejected, or not here.
    pub async fn local_status(&self, id: NotificationId) -> Result<LocalStatus> {
        self.db.read(move |conn| select_status(conn, id)).await
    }

    pub async fn stats(&self) -> Result<BufferStats> {
        self.db.read(select_stats).await
    }
}

/// Runs on the write connection before the writer starts: creates or upgrades the schema.
fn migrate(conn: &mut Connection) -> Result<(), group_commit::Error> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(group_commit::Error::TaskFailed(format!(
            "the buffer's schema version {version} is newer than this binary supports \
             ({SCHEMA_VERSION}); run a newer site-forwarder"
        )));
    }
    if version < 1 {
        let txn = conn.transaction()?;
        txn.execute_batch(SCHEMA_V1)?;
        txn.pragma_update(None, "user_version", 1)?;
        txn.commit()?;
    }
    if version < 2 {
        let txn = conn.transaction()?;
        txn.execute_batch(pair::SCHEMA_V2)?;
        txn.pragma_update(None, "user_version", 2)?;
        txn.commit()?;
    }
    if version < 3 {
        let txn = conn.transaction()?;
        txn.execute_batch(SCHEMA_V3)?;
        txn.pragma_update(None, "user_version", 3)?;
        txn.commit()?;
    }
    if version < 4 {
        let txn = conn.transaction()?;
        txn.execute_batch(clears::SCHEMA_V4)?;
        txn.pragma_update(None, "user_version", 4)?;
        txn.commit()?;
    }
    if version < 5 {
        let txn = conn.transaction()?;
        txn.execute_batch(clears::SCHEMA_V5)?;
        txn.pragma_update(None, "user_version", 5)?;
        txn.commit()?;
    }
    Ok(())
}

/// Keeps the writer's statement journals in memory. Every write job runs in its own savepoint
/// (see `group_commit`), and SQLite copies each page a savepoint or a statement changes into a
/// sub-journal so that alone can be rolled back; past 64 KiB that journal spills to a temporary
/// file. A standby's batch (hundreds of rows in one job) went past it every time: writing,
/// truncating and finally deleting that file was 45% of the standby's CPU in a profile. The
/// journal only serves a rollback inside the running transaction and is never read after a
/// crash (the WAL is), so keeping it in memory changes no durability; it holds at most the
/// pages one job changes (a standby's batch: a few MiB). Set after the migrations, which keep
/// their temporary files on disk.
fn keep_job_journals_in_memory(conn: &Connection) -> Result<(), group_commit::Error> {
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    Ok(())
}

/// The newest seq ever handed out: AUTOINCREMENT keeps it in `sqlite_sequence` even after the
/// row is gone (and raises it when a replica inserts a higher explicit seq).
fn select_head(conn: &Connection) -> Result<Seq, group_commit::Error> {
    let head: Option<i64> = conn
        .query_row(
            "SELECT seq FROM sqlite_sequence WHERE name = 'buffered'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    Ok(Seq(head.unwrap_or(0)))
}

/// What a row is counted as for [`room`]: its text fields plus a fixed overhead.
fn stored_bytes(n: &BufferedNotification) -> u64 {
    let p = &n.provenance;
    room::row_bytes(&[
        n.content.list_name.as_str(),
        n.content.subject.as_str(),
        n.content.body.as_str(),
        n.content.type_data.as_str(),
        p.source_site_id.as_str(),
        p.source_instance_id.as_str(),
        p.source_script.as_str(),
        n.condition_key.as_ref().map_or("", ConditionKey::as_str),
    ])
}

fn insert_buffered(conn: &Connection, n: &BufferedNotification) -> Result<Seq> {
    insert_row(conn, Insert::New, n)?;
    Ok(Seq(conn.last_insert_rowid()))
}

/// How [`insert_row`] places a row.
#[derive(Debug, Clone, Copy)]
enum Insert {
    /// A fresh row with the next seq (a Send).
    New,
    /// A fresh row with the next seq unless the notification is already buffered (an adopted
    /// row); the caller learns which from the changed-row count.
    NewUnlessHeld,
    /// A copy of the active's row at its seq there, unless that seq or that notification is
    /// held already (the caller then replaces it).
    ReplicaUnlessHeld(Seq),
    /// A copy of the active's row at its seq there, replacing whatever held that seq or that
    /// notification (a standby applying a batch).
    Replica(Seq),
}

/// The columns [`insert_row`] binds as `?1` to `?15`, and the seq as `?16` for a replica.
macro_rules! insert_sql {
    ($verb:literal $(, $seq_column:literal, $seq_value:literal)? $(; $tail:literal)?) => {
        concat!(
            $verb,
            " INTO buffered (notification_id, type, list_name, subject, body, type_data, \
             source_site_id, source_instance_id, source_script, origin_execution_id, \
             origin_parent_execution_id, enqueued_at, priority, condition_key, cleared_at",
            $($seq_column,)?
            ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15",
            $($seq_value,)? ")",
            $($tail)?
        )
    };
}

/// Inserts one row; returns how many rows changed (0 when an `...UnlessHeld` insert skipped it).
fn insert_row(conn: &Connection, how: Insert, n: &BufferedNotification) -> Result<usize> {
    // Fixed texts, so the statement cache finds them without building a string per row.
    let (sql, seq) = match how {
        Insert::New => (insert_sql!("INSERT"), None),
        Insert::NewUnlessHeld => (insert_sql!("INSERT OR IGNORE"), None),
        Insert::ReplicaUnlessHeld(seq) => (
            insert_sql!("INSERT", ", seq", ", ?16"; " ON CONFLICT DO NOTHING"),
            Some(seq.0),
        ),
        Insert::Replica(seq) => (
            insert_sql!("INSERT OR REPLACE", ", seq", ", ?16"),
            Some(seq.0),
        ),
    };
    let mut stmt = conn.prepare_cached(sql)?;
    let p = &n.provenance;
    let mut id = uuid::Uuid::encode_buffer();
    let mut origin = uuid::Uuid::encode_buffer();
    let mut parent = uuid::Uuid::encode_buffer();
    stmt.raw_bind_parameter(1, &*n.id.as_uuid().hyphenated().encode_lower(&mut id))?;
    stmt.raw_bind_parameter(2, n.content.kind.as_str())?;
    stmt.raw_bind_parameter(3, n.content.list_name.as_str())?;
    stmt.raw_bind_parameter(4, n.content.subject.as_str())?;
    stmt.raw_bind_parameter(5, n.content.body.as_str())?;
    stmt.raw_bind_parameter(6, n.content.type_data.as_str())?;
    stmt.raw_bind_parameter(7, p.source_site_id.as_str())?;
    stmt.raw_bind_parameter(8, p.source_instance_id.as_str())?;
    stmt.raw_bind_parameter(9, p.source_script.as_str())?;
    stmt.raw_bind_parameter(
        10,
        p.origin_execution_id
            .as_ref()
            .map(|u| &*u.hyphenated().encode_lower(&mut origin)),
    )?;
    stmt.raw_bind_parameter(
        11,
        p.origin_parent_execution_id
            .as_ref()
            .map(|u| &*u.hyphenated().encode_lower(&mut parent)),
    )?;
    stmt.raw_bind_parameter(12, p.site_enqueued_at.timestamp_millis())?;
    stmt.raw_bind_parameter(13, n.priority.rank())?;
    stmt.raw_bind_parameter(14, n.condition_key.as_ref().map(ConditionKey::as_str))?;
    stmt.raw_bind_parameter(15, n.cleared_at_site.map(|at| at.timestamp_millis()))?;
    if let Some(seq) = seq {
        stmt.raw_bind_parameter(16, seq)?;
    }
    Ok(stmt.raw_execute()?)
}

fn select_after(conn: &Connection, after: Seq, limit: i64) -> Result<Page> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ROW_COLUMNS} FROM buffered WHERE seq > ?1 ORDER BY seq LIMIT ?2"
    ))?;
    let mut rows = stmt.query(params![after.0, limit])?;
    let mut page = Page::default();
    while let Some(row) = rows.next()? {
        let seq = Seq(row.get(0)?);
        match decode_row(row)? {
            Ok(n) => page.rows.push((seq, n)),
            Err(problem) => {
                let id: String = row.get(1)?;
                page.unreadable.push((seq, id, problem.to_string()));
            }
        }
    }
    Ok(page)
}

/// Rebuilds a notification from a row selected with [`ROW_COLUMNS`], re-checking every content
/// rule. The outer error is SQLite's, the inner one names the column that broke a rule.
fn decode_row(row: &Row<'_>) -> rusqlite::Result<Result<BufferedNotification, ContentError>> {
    let id: String = row.get(1)?;
    let kind: String = row.get(2)?;
    let list_name: String = row.get(3)?;
    let subject: String = row.get(4)?;
    let body: String = row.get(5)?;
    let type_data: String = row.get(6)?;
    let site: String = row.get(7)?;
    let source_instance_id: String = row.get(8)?;
    let source_script: String = row.get(9)?;
    let origin: Option<String> = row.get(10)?;
    let parent: Option<String> = row.get(11)?;
    let enqueued_ms: i64 = row.get(12)?;
    let rank: i64 = row.get(13)?;
    let condition_key: Option<String> = row.get(14)?;
    let cleared_ms: Option<i64> = row.get(15)?;
    Ok((|| {
        let kind = NotificationType::from_db(&kind)
            .ok_or_else(|| ContentError::new("type", format!("{kind:?} is not a known type")))?;
        let priority = Priority::from_rank(rank).ok_or_else(|| {
            ContentError::new("priority", format!("rank {rank} is not a known priority"))
        })?;
        let site_enqueued_at = DateTime::from_timestamp_millis(enqueued_ms)
            .ok_or_else(|| ContentError::new("site_enqueued_at", "is out of range"))?;
        let cleared_at_site = cleared_ms
            .map(|ms| {
                DateTime::from_timestamp_millis(ms)
                    .ok_or_else(|| ContentError::new("cleared_at", "is out of range"))
            })
            .transpose()?;
        let origin = crate::domain::ScriptOrigin::parse(
            source_instance_id,
            source_script,
            origin.as_deref(),
            parent.as_deref(),
        )?;
        Ok(BufferedNotification {
            id: NotificationId::parse(&id, "notification_id")?,
            content: NotificationContent {
                kind,
                list_name: ListName::parse(list_name)?,
                subject: Subject::parse(subject)?,
                body: Body::parse(body)?,
                type_data: TypeData::parse(type_data)?,
            },
            provenance: origin.at_site(SiteId::parse(site)?, site_enqueued_at),
            priority,
            condition_key: condition_key
                .map(|key| ConditionKey::parse(key, "condition_key"))
                .transpose()?,
            cleared_at_site,
        })
    })())
}

/// Copies the row to `rejected` and deletes it; 0 if it is no longer buffered.
fn move_to_rejected(conn: &Connection, seq: Seq, reason: &str, now_ms: i64) -> Result<usize> {
    let mut copy = conn.prepare_cached(&format!(
        "INSERT OR REPLACE INTO rejected ({ROW_COLUMNS}, reason, rejected_at)
         SELECT {ROW_COLUMNS}, ?2, ?3 FROM buffered WHERE seq = ?1"
    ))?;
    let copied = copy.execute(params![seq.0, reason, now_ms])?;
    if copied == 0 {
        return Ok(0);
    }
    delete_buffered(conn, seq)
}

fn delete_buffered(conn: &Connection, seq: Seq) -> Result<usize> {
    let mut stmt = conn.prepare_cached("DELETE FROM buffered WHERE seq = ?1")?;
    Ok(stmt.execute([seq.0])?)
}

fn select_status(conn: &Connection, id: NotificationId) -> Result<LocalStatus> {
    let id = id.to_string();
    let mut buffered = conn.prepare_cached(
        "SELECT type, list_name, enqueued_at, priority, condition_key, cleared_at FROM buffered
         WHERE notification_id = ?1",
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
                (r.get::<_, Option<String>>(4)?, r.get::<_, Option<i64>>(5)?),
            ))
        })
        .optional()?;
    if let Some(((kind, list_name, enqueued_ms, rank), (condition_key, cleared_ms))) = row {
        let kind = NotificationType::from_db(&kind)
            .ok_or_else(|| BufferError::Corrupt(format!("{id}: unknown type {kind:?}")))?;
        let enqueued_at = DateTime::from_timestamp_millis(enqueued_ms)
            .ok_or_else(|| BufferError::Corrupt(format!("{id}: enqueued_at out of range")))?;
        let priority = Priority::from_rank(rank)
            .ok_or_else(|| BufferError::Corrupt(format!("{id}: unknown priority rank {rank}")))?;
        let cleared_at = cleared_ms
            .map(|ms| {
                DateTime::from_timestamp_millis(ms)
                    .ok_or_else(|| BufferError::Corrupt(format!("{id}: cleared_at out of range")))
            })
            .transpose()?;
        return Ok(LocalStatus::Buffered(BufferedStatus {
            kind,
            list_name,
            enqueued_at,
            priority,
            condition_key,
            cleared_at,
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
    Ok(BufferStats {
        depth: u64::try_from(depth).unwrap_or(0),
        oldest_enqueued_at: oldest.and_then(DateTime::from_timestamp_millis),
        rejected: u64::try_from(rejected).unwrap_or(0),
        pending_clears: u64::try_from(pending_clears).unwrap_or(0),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::domain::ScriptOrigin;
    use uuid::Uuid;

    /// A valid notification with `subject`, for buffer tests.
    pub(crate) fn notification(subject: &str) -> BufferedNotification {
        crate::domain::accepted_send(
            NotificationContent {
                kind: NotificationType::Email,
                list_name: ListName::parse("ops".into()).unwrap(),
                subject: Subject::parse(subject.into()).unwrap(),
                body: Body::parse("Level 97%".into()).unwrap(),
                type_data: TypeData::empty(),
            },
            ScriptOrigin::parse(
                "node-1".into(),
                "tank.py".into(),
                Some(&Uuid::new_v4().to_string()),
                None,
            )
            .unwrap(),
            SiteId::parse("site-a".into()).unwrap(),
            Utc::now(),
            Priority::Normal,
            None,
        )
    }

    /// Like [`notification`], with `priority`.
    pub(crate) fn with_priority(subject: &str, priority: Priority) -> BufferedNotification {
        BufferedNotification {
            priority,
            ..notification(subject)
        }
    }

    fn open(dir: &tempfile::TempDir) -> Buffer {
        Buffer::open(&dir.path().join("buffer.db")).unwrap()
    }

    #[tokio::test]
    async fn enqueued_rows_read_back_oldest_first_and_identical() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let first = notification("first");
        let second = notification("second");
        let s1 = buffer.enqueue(first.clone()).await.unwrap();
        let s2 = buffer.enqueue(second.clone()).await.unwrap();
        assert!(s1 < s2);

        let page = buffer.next_after(Seq::START, 10).await.unwrap();
        assert_eq!(page.rows, vec![(s1, first.clone()), (s2, second.clone())]);
        assert!(page.unreadable.is_empty());
        assert_eq!(page.last_seq(), Some(s2));

        let page = buffer.next_after(s1, 10).await.unwrap();
        assert_eq!(page.rows, vec![(s2, second)]);
        let page = buffer.next_after(Seq::START, 1).await.unwrap();
        assert_eq!(page.rows, vec![(s1, first)]);
        assert!(buffer.next_after(s2, 10).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn remove_deletes_only_the_acked_rows_and_tolerates_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let a = notification("a");
        let b = notification("b");
        let sa = buffer.enqueue(a.clone()).await.unwrap();
        let sb = buffer.enqueue(b.clone()).await.unwrap();
        assert_eq!(buffer.remove(vec![sa]).await.unwrap(), 1);
        assert_eq!(
            buffer.remove(vec![sa]).await.unwrap(),
            0,
            "second ack is a no-op"
        );
        assert!(!buffer.contains(a.id).await.unwrap());
        assert!(buffer.contains(b.id).await.unwrap());
        assert_eq!(buffer.stats().await.unwrap().depth, 1);
        let _ = sb;
    }

    #[tokio::test]
    async fn seqs_are_never_reused_after_the_buffer_drains() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let s1 = buffer.enqueue(notification("a")).await.unwrap();
        buffer.remove(vec![s1]).await.unwrap();
        let s2 = buffer.enqueue(notification("b")).await.unwrap();
        assert!(s2 > s1, "a cursor at {s1:?} must still see the new row");
        assert_eq!(buffer.next_after(s1, 10).await.unwrap().rows.len(), 1);
    }

    #[tokio::test]
    async fn reject_moves_the_row_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let n = notification("bad");
        let seq = buffer.enqueue(n.clone()).await.unwrap();
        assert!(buffer.reject(seq, "conflict".into()).await.unwrap());
        assert!(!buffer.reject(seq, "again".into()).await.unwrap());
        assert_eq!(
            buffer.local_status(n.id).await.unwrap(),
            LocalStatus::Rejected {
                reason: "conflict".into()
            }
        );
        let stats = buffer.stats().await.unwrap();
        assert_eq!((stats.depth, stats.rejected), (0, 1));
        assert_eq!(stats.oldest_enqueued_at, None);
        assert!(buffer.next_after(Seq::START, 10).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn status_and_stats_describe_buffered_rows() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let n = notification("s");
        buffer.enqueue(n.clone()).await.unwrap();
        buffer.enqueue(notification("t")).await.unwrap();
        assert_eq!(
            buffer.local_status(n.id).await.unwrap(),
            LocalStatus::Buffered(BufferedStatus {
                kind: NotificationType::Email,
                list_name: "ops".into(),
                enqueued_at: n.provenance.site_enqueued_at,
                priority: Priority::Normal,
                condition_key: None,
                cleared_at: None,
            })
        );
        assert_eq!(
            buffer
                .local_status(NotificationId::generate())
                .await
                .unwrap(),
            LocalStatus::NotHere
        );
        let stats = buffer.stats().await.unwrap();
        assert_eq!(stats.depth, 2);
        assert_eq!(
            stats.oldest_enqueued_at,
            Some(n.provenance.site_enqueued_at)
        );
        assert_eq!(stats.rejected, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_enqueues_are_all_committed_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..300 {
            let buffer = buffer.clone();
            tasks.spawn(async move { buffer.enqueue(notification(&format!("n{i}"))).await });
        }
        let mut seqs = Vec::new();
        while let Some(done) = tasks.join_next().await {
            seqs.push(done.unwrap().unwrap());
        }
        seqs.sort();
        seqs.dedup();
        assert_eq!(seqs.len(), 300);
        drop(buffer);

        let reopened = open(&dir);
        assert_eq!(reopened.stats().await.unwrap().depth, 300);
        let page = reopened.next_after(Seq::START, 1000).await.unwrap();
        let read: Vec<Seq> = page.rows.iter().map(|(s, _)| *s).collect();
        assert_eq!(read, seqs, "oldest first, nothing missing");
    }

    #[tokio::test]
    async fn enqueue_wakes_a_waiting_forwarder() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let wake = Arc::clone(buffer.enqueued());
        buffer.enqueue(notification("x")).await.unwrap();
        // The permit was stored although nobody was waiting yet.
        wake.notified().await;
    }

    #[tokio::test]
    async fn rows_breaking_the_rules_are_reported_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let good = buffer.enqueue(notification("good")).await.unwrap();
        let bad = buffer.enqueue(notification("bad")).await.unwrap();
        buffer
            .db
            .write(move |c| {
                c.execute("UPDATE buffered SET subject = '' WHERE seq = ?1", [bad.0])
                    .map_err(BufferError::from)
            })
            .await
            .unwrap();
        let page = buffer.next_after(Seq::START, 10).await.unwrap();
        assert_eq!(page.rows.len(), 1);
        assert_eq!(page.rows[0].0, good);
        assert_eq!(page.unreadable.len(), 1);
        assert_eq!(page.unreadable[0].0, bad);
        assert!(page.unreadable[0].2.starts_with("subject:"));
        assert_eq!(page.last_seq(), Some(bad));
    }

    #[tokio::test]
    async fn each_priority_round_trips_through_the_buffer_and_into_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let mut sent = Vec::new();
        for priority in Priority::ALL {
            let n = with_priority(priority.as_str(), priority);
            sent.push((buffer.enqueue(n.clone()).await.unwrap(), n));
        }
        assert_eq!(buffer.next_after(Seq::START, 10).await.unwrap().rows, sent);
        let (critical_seq, critical) = &sent[0];
        let Ok(LocalStatus::Buffered(status)) = buffer.local_status(critical.id).await else {
            panic!("still buffered");
        };
        assert_eq!(status.priority, Priority::Critical);

        // A rejected row keeps its priority beside the reason.
        assert!(buffer.reject(*critical_seq, "no".into()).await.unwrap());
        let rank: i64 = buffer
            .db
            .read(|c| {
                c.query_row("SELECT priority FROM rejected", [], |r| r.get(0))
                    .map_err(BufferError::from)
            })
            .await
            .unwrap();
        assert_eq!(rank, i64::from(Priority::Critical.rank()));
    }

    /// The default the v3 migration gives rows written before it must be normal's rank.
    #[test]
    fn the_schema_default_is_normals_rank() {
        let default = format!("DEFAULT {}", Priority::Normal.rank());
        assert_eq!(
            SCHEMA_V3.matches(default.as_str()).count(),
            2,
            "{SCHEMA_V3}"
        );
    }

    /// A buffer the previous binary wrote (schema v2, no priority column) opens, and its rows,
    /// waiting or rejected, read back as normal.
    #[tokio::test]
    async fn a_version_2_buffer_is_upgraded_and_its_rows_read_as_normal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("buffer.db");
        let n = notification("written by the old binary");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(SCHEMA_V1).unwrap();
            conn.execute_batch(pair::SCHEMA_V2).unwrap();
            conn.pragma_update(None, "user_version", 2).unwrap();
            let p = &n.provenance;
            conn.execute(
                "INSERT INTO buffered (notification_id, type, list_name, subject, body, \
                 type_data, source_site_id, source_instance_id, source_script, \
                 origin_execution_id, origin_parent_execution_id, enqueued_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
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
            conn.execute(
                "INSERT INTO rejected (seq, notification_id, type, list_name, subject, body, \
                 type_data, source_site_id, source_instance_id, source_script, enqueued_at, \
                 reason, rejected_at) \
                 VALUES (99, ?1, 'email', 'ops', 's', 'b', '', 'site-a', 'node-1', 'x.py', 0, \
                 'no such list', 0)",
                [NotificationId::generate().to_string()],
            )
            .unwrap();
        }

        let buffer = Buffer::open(&path).unwrap();
        let page = buffer.next_after(Seq::START, 10).await.unwrap();
        assert_eq!(page.rows.len(), 1);
        assert_eq!(page.rows[0].1, n, "the same row, read as normal");
        assert_eq!(page.rows[0].1.priority, Priority::Normal);
        let ranks: Vec<i64> = buffer
            .db
            .read(|c| {
                c.prepare("SELECT priority FROM rejected")?
                    .query_map([], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()
                    .map_err(BufferError::from)
            })
            .await
            .unwrap();
        assert_eq!(ranks, vec![i64::from(Priority::Normal.rank())]);
        let version: i64 = buffer
            .db
            .read(|c| {
                c.query_row("PRAGMA user_version", [], |r| r.get(0))
                    .map_err(BufferError::from)
            })
            .await
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);

        // New rows take their own priority beside the old one.
        let high = with_priority("new", Priority::High);
        buffer.enqueue(high.clone()).await.unwrap();
        let rows = buffer.next_after(Seq::START, 10).await.unwrap().rows;
        assert_eq!(rows.last().map(|(_, r)| r), Some(&high));
    }

    #[tokio::test]
    async fn an_unknown_priority_rank_is_reported_as_a_bad_row() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let good = buffer.enqueue(notification("good")).await.unwrap();
        let bad = buffer.enqueue(notification("bad")).await.unwrap();
        buffer
            .db
            .write(move |c| {
                c.execute("UPDATE buffered SET priority = 7 WHERE seq = ?1", [bad.0])
                    .map_err(BufferError::from)
            })
            .await
            .unwrap();
        let page = buffer.next_after(Seq::START, 10).await.unwrap();
        assert_eq!(page.rows.len(), 1);
        assert_eq!(page.rows[0].0, good);
        assert_eq!(page.unreadable.len(), 1);
        assert_eq!(page.unreadable[0].0, bad);
        assert!(
            page.unreadable[0].2.starts_with("priority:"),
            "{:?}",
            page.unreadable
        );
    }
}
