//! Clears: what the clear sender (`crate::clears`) reads and settles, the central half of each
//! `ClearCondition`. It follows the pending clears and the rows leaving `buffered`, asks when
//! the rows a clear waits for are gone, and forgets a clear once central applied it.
//!
//! Invariants (the SQL and the rest of them: `super::pending_clears`):
//! - A pending clear is deleted only once central applied that very watermark, so a clear
//!   recorded while central was applying an earlier one stays pending.
//! - Every change to the pending clears is published after its commit.

use std::sync::Arc;

use tokio::sync::{broadcast, watch};

use super::announce::RowChange;
use super::error::{BufferError, Result};
use super::pending_clears::{self, Invalid};
use super::store::Store;
use crate::domain::{PendingClear, PendingClears, Seq};

/// The clear sender's hold on the buffer.
#[derive(Clone, Debug)]
pub(crate) struct Clears {
    store: Store,
}

impl Clears {
    pub(super) fn new(store: Store) -> Self {
        Self { store }
    }

    /// The pending clears as committed, with a change notification after every commit that
    /// changes them.
    pub(crate) fn pending_clears(&self) -> watch::Receiver<PendingClears> {
        self.store.announce.pending_clears.subscribe()
    }

    /// The pending clears as last published (a commit is published just after it is visible).
    /// Test-only: the service follows them through [`Self::pending_clears`].
    #[cfg(test)]
    pub(crate) fn pending_clears_now(&self) -> PendingClears {
        self.store.announce.pending_clears.borrow().clone()
    }

    /// Announcements of the seqs that leave `buffered` or are marked cleared, from now on.
    pub(crate) fn row_changes(&self) -> broadcast::Receiver<RowChange> {
        self.store.announce.changes.subscribe()
    }

    /// The oldest seq still buffered; `None` when the buffer is empty.
    pub(crate) async fn oldest_seq(&self) -> Result<Option<Seq>> {
        self.store.oldest_seq().await
    }

    /// Deletes the pending clear once central applied it, unless a later clear of the key moved
    /// it meanwhile, or a clear handed over made it more recent (it then stays, to be sent
    /// again), and remembers it as applied. Returns whether it was deleted.
    pub(crate) async fn forget_clear(&self, clear: PendingClear) -> Result<bool> {
        let announce = Arc::clone(&self.store.announce);
        let (deleted, _) = self
            .store
            .db
            .write_then(
                move |conn| {
                    let deleted = pending_clears::delete_applied(conn, &clear)?;
                    let clears = pending_clears::select_pending(conn, Invalid::Report)?;
                    Ok::<_, BufferError>((deleted, clears))
                },
                move |(_, clears)| announce.pending_clears(clears.clone()),
            )
            .await?;
        Ok(deleted)
    }
}
