//! Replication, the active's side: what a standby's stream (`crate::pair::source`) copies.
//! The newest seq, the rows after a cursor (from memory while the stream keeps up, else from
//! the table), the rows a clear marked, the seqs that left, the spans a resuming standby may
//! keep, the pending clears and acknowledgements, and the final statuses central sent back. Reads and announcements only: the active's buffer is never
//! changed by a standby.
//!
//! Invariants:
//! - Everything here is announced after its commit and in commit order (`super::announce`): a
//!   stream that subscribes before it reads misses no change made after its read.
//! - While a [`RecentReader`] lives, the rows committed from then on are kept in memory for it
//!   (`super::recent`), bounded; a stream that falls behind reads the table instead.

use rusqlite::params;
use tokio::sync::{broadcast, watch};

use super::announce::{RecentReader, RowChange};
use super::central_statuses;
use super::error::Result;
use super::rows::{self, Page};
use super::store::Store;
use crate::domain::{PendingAcks, PendingClears, Seq, StatusSeq, StoredStatus};

/// Of the seqs `from..=through`, only those in `kept` (sorted, disjoint, inclusive ranges) are
/// still buffered on the active.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RetainedSpan {
    pub from: Seq,
    pub through: Seq,
    pub kept: Vec<(Seq, Seq)>,
}

impl RetainedSpan {
    /// The ranges of the span that are not kept: what a standby deletes.
    pub(crate) fn gaps(&self) -> Vec<(Seq, Seq)> {
        let mut gaps = Vec::new();
        let mut next = self.from.0;
        for &(first, last) in &self.kept {
            let first = first.0.max(self.from.0);
            let last = last.0.min(self.through.0);
            if first > last {
                continue;
            }
            if first > next {
                gaps.push((Seq(next), Seq(first - 1)));
            }
            next = next.max(last.saturating_add(1));
        }
        if next <= self.through.0 {
            gaps.push((Seq(next), self.through));
        }
        gaps
    }
}

/// The newest committed seq alone, for the node's standby lag (`crate::pair::node` dates each
/// commit while active); it reads nothing else of the buffer.
#[derive(Clone, Debug)]
pub(crate) struct Commits {
    store: Store,
}

impl Commits {
    pub(super) fn new(store: Store) -> Self {
        Self { store }
    }

    /// The newest seq ever committed to `buffered` (rows since deleted included).
    pub(crate) fn head(&self) -> watch::Receiver<Seq> {
        self.store.announce.head.subscribe()
    }
}

/// The active's feed for its standby's stream.
#[derive(Clone, Debug)]
pub(crate) struct Replication {
    store: Store,
}

impl Replication {
    pub(super) fn new(store: Store) -> Self {
        Self { store }
    }

    /// The newest seq ever committed to `buffered` (rows since deleted included).
    pub(crate) fn head(&self) -> watch::Receiver<Seq> {
        self.store.announce.head.subscribe()
    }

    /// The newest seq ever committed to `buffered`, now.
    pub(crate) fn head_now(&self) -> Seq {
        *self.store.announce.head.borrow()
    }

    /// Announcements of the seqs that leave `buffered` or are marked cleared, from now on.
    pub(crate) fn row_changes(&self) -> broadcast::Receiver<RowChange> {
        self.store.announce.changes.subscribe()
    }

    /// Keeps the rows committed from now on in memory while the reader lives.
    pub(crate) fn recent_rows(&self) -> RecentReader {
        self.store.announce.recent_reader()
    }

    /// The pending clears as committed, with a change notification after every commit that
    /// changes them.
    pub(crate) fn pending_clears(&self) -> watch::Receiver<PendingClears> {
        self.store.announce.pending_clears.subscribe()
    }

    /// The pending acknowledgements as committed, with a change notification after every
    /// commit that changes them.
    pub(crate) fn pending_acks(&self) -> watch::Receiver<PendingAcks> {
        self.store.announce.pending_acks.subscribe()
    }

    /// Up to `limit` rows with a seq greater than `after`, oldest first.
    /// The newest status seq stored (final statuses central sent back), with a change
    /// notification after each commit that stores one.
    pub(crate) fn status_head(&self) -> watch::Receiver<StatusSeq> {
        self.store.announce.status_head.subscribe()
    }

    /// Up to `limit` final statuses stored after `after`, oldest first, and the last seq read.
    pub(crate) async fn statuses_after(
        &self,
        after: StatusSeq,
        limit: usize,
    ) -> Result<(Vec<StoredStatus>, StatusSeq)> {
        self.store
            .db
            .read(move |conn| central_statuses::select_after(conn, after, None, limit))
            .await
    }

    pub(crate) async fn next_after(&self, after: Seq, limit: usize) -> Result<Page> {
        self.store.rows_after(after, limit).await
    }

    /// The rows still buffered at `seqs` (those gone are left out), in the order given.
    pub(crate) async fn rows_at(&self, seqs: Vec<Seq>) -> Result<Page> {
        self.store
            .db
            .read(move |conn| rows::select_at(conn, seqs))
            .await
    }

    /// The seqs up to `through` whose rows are marked cleared, oldest first.
    pub(crate) async fn marked_seqs(&self, through: Seq) -> Result<Vec<Seq>> {
        self.store
            .db
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

    /// The buffered seqs after `after` up to `through`, as a span of at most `max_rows` rows:
    /// the span ends at `through` when the rest fits, else at the last row read.
    pub(crate) async fn retained_span(
        &self,
        after: Seq,
        through: Seq,
        max_rows: usize,
    ) -> Result<RetainedSpan> {
        let limit = i64::try_from(max_rows).unwrap_or(i64::MAX);
        self.store
            .db
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT seq FROM buffered WHERE seq > ?1 AND seq <= ?2 ORDER BY seq LIMIT ?3",
                )?;
                let seqs = stmt
                    .query_map(params![after.0, through.0, limit], |r| r.get::<_, i64>(0))?
                    .collect::<rusqlite::Result<Vec<i64>>>()?;
                let full = seqs.len() as i64 == limit;
                let end = match seqs.last() {
                    Some(last) if full => Seq(*last),
                    _ => through,
                };
                let mut kept: Vec<(Seq, Seq)> = Vec::new();
                for seq in seqs {
                    match kept.last_mut() {
                        Some((_, last)) if last.0 + 1 == seq => *last = Seq(seq),
                        _ => kept.push((Seq(seq), Seq(seq))),
                    }
                }
                Ok(RetainedSpan {
                    from: Seq(after.0 + 1),
                    through: end,
                    kept,
                })
            })
            .await
    }
}
