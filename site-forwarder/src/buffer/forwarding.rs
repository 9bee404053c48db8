//! Forwarding: what the forwarder (`crate::forwarder`) reads and settles. It is woken by each
//! Send, reads the rows after its cursor with the pending clears that hold them, and settles
//! central's acks: acked rows deleted, rejected ones moved aside with the reason.
//!
//! Invariants:
//! - A row leaves `buffered` here only through [`Forwarding::settle`] (see `super::store`), and
//!   a failed settle is retried there until it commits or the node stops.
//! - The pending clears read with a page are read in the same read as its rows, so the
//!   forwarder never misses the clear that holds a row.

use std::sync::Arc;

use tokio::sync::{Notify, watch};

use super::error::Result;
use super::pending_clears::{self, Invalid};
use super::rows::{self, Page};
use super::store::Store;
use crate::domain::{PendingClears, Seq};

/// The forwarder's hold on the buffer.
#[derive(Clone, Debug)]
pub(crate) struct Forwarding {
    store: Store,
}

impl Forwarding {
    pub(super) fn new(store: Store) -> Self {
        Self { store }
    }

    /// Fires after each committed enqueue. `notify_one` stores a permit when nobody waits, so a
    /// wake-up is never lost.
    pub(crate) fn enqueued(&self) -> &Arc<Notify> {
        &self.store.announce.enqueued
    }

    /// The pending clears as committed, with a change notification after every commit that
    /// changes them.
    pub(crate) fn pending_clears(&self) -> watch::Receiver<PendingClears> {
        self.store.announce.pending_clears.subscribe()
    }

    /// Up to `limit` rows after `after`, oldest first, and the pending clears as the table holds
    /// them just after: every clear committed before a row that was read is among them (unless
    /// central applied it since, which releases the row anyway), so the forwarder never misses
    /// the clear that holds a row. The published list could lag a commit the read already sees.
    pub(crate) async fn next_to_forward(
        &self,
        after: Seq,
        limit: usize,
    ) -> Result<(Page, PendingClears)> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.store
            .db
            .read(move |conn| {
                let page = rows::select_after(conn, after, limit)?;
                let clears = pending_clears::select_pending(conn, Invalid::Skip)?;
                Ok((page, clears))
            })
            .await
    }

    /// Deletes acked rows and moves rejected rows to `rejected`, in one write job; retried
    /// until it commits (see `super::store`). Returns how many rows left `buffered`.
    pub(crate) async fn settle(
        &self,
        acked: Vec<Seq>,
        rejected: Vec<(Seq, String)>,
    ) -> Result<usize> {
        self.store.settle(acked, rejected).await
    }

    /// Deletes acked rows (see [`Self::settle`]).
    // Test-only shorthand: the forwarder settles acks and rejections together.
    #[cfg(test)]
    pub(crate) async fn remove(&self, acked: Vec<Seq>) -> Result<usize> {
        self.settle(acked, Vec::new()).await
    }

    /// Moves one row to `rejected` with the reason (see [`Self::settle`]).
    // Test-only shorthand: the forwarder settles acks and rejections together.
    #[cfg(test)]
    pub(crate) async fn reject(&self, seq: Seq, reason: String) -> Result<bool> {
        Ok(self.settle(Vec::new(), vec![(seq, reason)]).await? > 0)
    }
}
