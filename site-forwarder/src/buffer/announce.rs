//! What the buffer tells the rest of the node after each commit: the forwarder's wake-up, the
//! newest seq, the seqs that left `buffered` or were marked cleared, the pending clears and
//! acknowledgements, the newest final status central sent back, and
//! (while a replication stream is attached) the rows just committed ([`super::recent`]).
//!
//! Invariants:
//! - Every committed change is announced after its commit, from the writer's follow-ups
//!   (`group_commit::Database::write_then`), and so in commit order.
//! - The head only moves forward.
//! - A removal or a marking is announced under the `recent` lock, so a stream taking recent rows
//!   either misses the row or takes it before the announcement, which it then receives.

use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, broadcast, watch};

use super::recent::{self, RecentPage};
use crate::domain::{BufferedNotification, PendingAcks, PendingClears, Seq, StatusSeq};

/// Row change announcements a slow replication stream may fall behind by before it is reset (and
/// resumed from the table). Each is one settle job's seqs, so this is thousands of acks.
pub(super) const CHANGES_BACKLOG: usize = 4096;

/// A committed change to rows already in `buffered`, as replication streams must copy it.
#[derive(Debug, Clone)]
pub(crate) enum RowChange {
    /// These seqs left `buffered` (acked, rejected).
    Removed(Arc<[Seq]>),
    /// A clear marked the rows at these seqs cleared: a standby holding them must get them again.
    Marked(Arc<[Seq]>),
}

/// What the buffer tells the rest of the node after each commit. Made from the writer's
/// follow-ups (`group_commit::Database::write_then`), so in commit order.
#[derive(Debug)]
pub(super) struct Announcements {
    /// Signalled after each committed enqueue so the forwarder wakes without polling.
    /// `notify_one` stores a permit when nobody waits, so a wake-up is never lost.
    pub(super) enqueued: Arc<Notify>,
    /// The newest seq committed to `buffered`, for the replication stream (which, unlike the
    /// forwarder's permit, any number of streams can watch).
    pub(super) head: watch::Sender<Seq>,
    /// Seqs that left `buffered` or were marked cleared, announced after each commit that
    /// removed or marked rows (under the `recent` lock, see [`super::recent`]).
    pub(super) changes: broadcast::Sender<RowChange>,
    /// The pending clears as last committed, for the forwarder and the clear sender.
    pub(super) pending_clears: watch::Sender<PendingClears>,
    /// The pending acknowledgements as last committed, for the acknowledgement sender and the
    /// replication streams.
    pub(super) pending_acks: watch::Sender<PendingAcks>,
    /// The rows committed most recently, for replication streams. Locked briefly by the
    /// writer's follow-ups and by a stream taking a page.
    pub(super) recent: Mutex<recent::RecentRows>,
    /// The newest seq of the final statuses central sent back (`super::central_statuses`),
    /// for `WatchStatus` streams and the standby's replication.
    pub(super) status_head: watch::Sender<StatusSeq>,
}

impl Announcements {
    /// Announcements starting from what the file holds: its newest seq, its pending clears and
    /// acknowledgements.
    pub(super) fn new(
        head: Seq,
        pending_clears: PendingClears,
        pending_acks: PendingAcks,
        status_head: StatusSeq,
    ) -> Self {
        Self {
            status_head: watch::Sender::new(status_head),
            enqueued: Arc::new(Notify::new()),
            head: watch::Sender::new(head),
            changes: broadcast::Sender::new(CHANGES_BACKLOG),
            pending_clears: watch::Sender::new(pending_clears),
            pending_acks: watch::Sender::new(pending_acks),
            recent: Mutex::default(),
        }
    }

    /// A replication stream's hold on the recent rows, kept while it lives.
    pub(super) fn recent_reader(self: &Arc<Self>) -> RecentReader {
        let id = self.recent().attach();
        RecentReader {
            announce: Arc::clone(self),
            id,
        }
    }

    pub(super) fn recent(&self) -> std::sync::MutexGuard<'_, recent::RecentRows> {
        // A poisoned lock only means a thread panicked while holding it; the recent rows are
        // then cleared rather than trusted (streams read the table).
        self.recent.lock().unwrap_or_else(|poisoned| {
            let mut recent = poisoned.into_inner();
            recent.clear();
            recent
        })
    }

    /// A committed insert: the head moves forward (never back) and the forwarder wakes.
    pub(super) fn inserted(&self, seq: Seq) {
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
    pub(super) fn sent(&self, seq: Seq, row: Arc<BufferedNotification>) {
        self.recent().committed(seq, row);
        self.inserted(seq);
    }

    /// A commit that changed `buffered` other than by Sends and removals (`head`: its newest
    /// insert): the recent rows no longer describe the table, so streams read it until the
    /// next Send.
    pub(super) fn other_change(&self, head: Option<Seq>) {
        self.recent().clear();
        if let Some(head) = head {
            self.inserted(head);
        }
    }

    pub(super) fn removed(&self, seqs: Vec<Seq>) {
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
    pub(super) fn marked(&self, seqs: Vec<Seq>) {
        if !seqs.is_empty() {
            let mut recent = self.recent();
            recent.clear();
            let _ = self.changes.send(RowChange::Marked(seqs.into()));
        }
    }

    /// The pending clears changed; `clears` is what the commit left.
    pub(super) fn pending_clears(&self, clears: PendingClears) {
        self.pending_clears.send_replace(clears);
    }

    /// The pending acknowledgements changed; `acks` is what the commit left.
    pub(super) fn pending_acks(&self, acks: PendingAcks) {
        self.pending_acks.send_replace(acks);
    }
}

/// A replication stream's hold on the buffer's recent rows: they are kept while one exists.
#[derive(Debug)]
pub(crate) struct RecentReader {
    announce: Arc<Announcements>,
    id: recent::ReaderId,
}

impl RecentReader {
    /// Up to `max_rows` rows committed after `cursor`, from memory; `None` when they must be
    /// read from the table (`next_after`). The cursor only moves forward: rows up to
    /// it, and those returned, are not kept for this reader any longer.
    pub(crate) fn after(&self, cursor: Seq, max_rows: usize) -> Option<RecentPage> {
        self.announce.recent().after(self.id, cursor, max_rows)
    }
}

impl Drop for RecentReader {
    fn drop(&mut self) {
        self.announce.recent().detach(self.id);
    }
}
