//! The one database every capability of the buffer works on: the SQLite file (WAL,
//! `synchronous=FULL`) written through `group_commit`, so concurrent `Send`s share one
//! transaction and one fsync; the announcements its commits make; and the room it keeps to
//! drain. Each capability (`super::intake`, `super::forwarding`, ...) is a handle over a clone
//! of it.
//!
//! Invariants:
//! - Reads use the read-only pool and see the last commit; they never block the writer.
//! - A row leaves `buffered` only in [`Store::settle`] (deleted because central acked it, or
//!   moved, in the same job, to `rejected` with the reason, so it is never in neither table),
//!   or through the pair's replication and hand-over (`super::replica`, `super::handover`).
//! - A settle that fails for lack of space (or because the commit failed) is retried here with a
//!   growing pause until it commits or the buffer is stopped: the forwarder's stream stays open,
//!   and the rows central acked are not sent again meanwhile.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use group_commit::{Database, Durability, Options};
use tokio_util::sync::CancellationToken;

use super::announce::Announcements;
use super::error::{BufferError, Result};
use super::room::{self, SpaceLimits};
use super::rows::{self, Page};
use super::{central_statuses, pending_acks, pending_clears, schema};
use crate::domain::{PendingAcks, PendingClears, Seq, StatusSeq};

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

/// The buffer's database and what every capability shares. Cheap to clone; all clones share
/// the writer, the readers, the announcements and the room.
#[derive(Clone, Debug)]
pub(super) struct Store {
    pub(super) db: Database,
    pub(super) announce: Arc<Announcements>,
    /// Whether a Send fits (see `super::room`).
    pub(super) room: Arc<room::Room>,
    /// Cancelled when the node stops: a settle waiting to retry gives up with its error.
    pub(super) stop: CancellationToken,
}

impl Store {
    /// Opens (creating if needed) the buffer file, brings its schema up to date and reads what
    /// the announcements start from. Blocking: call it from a blocking context or at start-up.
    pub(super) fn open(path: &Path, limits: SpaceLimits, stop: CancellationToken) -> Result<Self> {
        let mut options = Options::new(path);
        // Every acked Send must survive power loss, not just a process crash.
        options.durability = Durability::Full;
        options.readers = READERS;
        let mut head = Seq::START;
        let mut clears = PendingClears::default();
        let mut acks = PendingAcks::default();
        let mut status_head = StatusSeq::default();
        let mut pages = room::Pages::default();
        let db = Database::open(&options, |conn| {
            schema::migrate(conn)?;
            head = rows::select_head(conn)?;
            clears = pending_clears::select_pending(conn, pending_clears::Invalid::Report)?;
            acks = pending_acks::select_pending(conn)?;
            status_head = central_statuses::select_head(conn)
                .map_err(|e| group_commit::Error::TaskFailed(e.to_string()))?;
            schema::keep_job_journals_in_memory(conn)?;
            pages = room::Pages::read(conn)?;
            Ok(())
        })?;
        Ok(Self {
            room: room::Room::new(path, limits, pages),
            stop,
            db,
            announce: Arc::new(Announcements::new(head, clears, acks, status_head)),
        })
    }

    /// Up to `limit` rows with a seq greater than `after`, oldest first.
    pub(super) async fn rows_after(&self, after: Seq, limit: usize) -> Result<Page> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.db
            .read(move |conn| rows::select_after(conn, after, limit))
            .await
    }

    /// The pending clears as the table holds them now.
    pub(super) async fn read_pending_clears(&self) -> Result<PendingClears> {
        self.db
            .read(|conn| {
                Ok(pending_clears::select_pending(
                    conn,
                    pending_clears::Invalid::Report,
                )?)
            })
            .await
    }

    /// The oldest seq still buffered; `None` when the buffer is empty.
    pub(super) async fn oldest_seq(&self) -> Result<Option<Seq>> {
        self.db
            .read(|conn| {
                let oldest: Option<i64> =
                    conn.query_row("SELECT MIN(seq) FROM buffered", [], |r| r.get(0))?;
                Ok(oldest.map(Seq))
            })
            .await
    }

    /// The pending acknowledgements as the table holds them now.
    pub(super) async fn read_pending_acks(&self) -> Result<PendingAcks> {
        self.db
            .read(|conn| Ok(pending_acks::select_pending(conn)?))
            .await
    }

    /// Gives the WAL's space back (see [`room::Room::checkpoint`]), then checks the room again.
    pub(super) async fn make_room(&self) {
        let room = Arc::clone(&self.room);
        let checkpointed = tokio::task::spawn_blocking(move || room.checkpoint()).await;
        match checkpointed {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::debug!(%error, "cannot checkpoint the site buffer now"),
            Err(error) => tracing::warn!(%error, "the site buffer's checkpoint task failed"),
        }
        self.room.reassess();
    }

    /// Deletes acked rows and moves rejected rows to `rejected`, all in one write job (one
    /// savepoint in the next group commit). Seqs no longer buffered are skipped: a row may be
    /// acked twice when it was resent after a reconnect. Returns how many rows left `buffered`.
    ///
    /// A failed commit (a full disk above all) is retried after a pause that grows from
    /// [`SETTLE_RETRY_FIRST`] to [`SETTLE_RETRY_MAX`], until it commits or the buffer is
    /// stopped (then the last error is returned). Meanwhile Sends are refused when the disk was
    /// full. Other errors are returned at once.
    pub(super) async fn settle(
        &self,
        acked: Vec<Seq>,
        rejected: Vec<(Seq, String)>,
    ) -> Result<usize> {
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
                        settled += rows::move_to_rejected(conn, *seq, reason, now)?;
                    }
                    for seq in &acked {
                        settled += rows::delete_buffered(conn, *seq)?;
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
}
