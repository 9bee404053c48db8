//! Acknowledgements: what the acknowledgement sender (`crate::acks`) reads and settles, the
//! central half of each `SiteNotify.Acknowledge`. It follows the pending acknowledgements and
//! the rows leaving `buffered`, and forgets one once central applied it.
//!
//! Invariants (the SQL and the rest of them: `super::pending_acks`):
//! - A pending acknowledgement is deleted only once central applied that very watermark.
//! - Every change to them is published after its commit.

use std::sync::Arc;

use tokio::sync::{broadcast, watch};

use super::announce::RowChange;
use super::error::{BufferError, Result};
use super::pending_acks;
use super::store::Store;
use crate::domain::{PendingAck, PendingAcks, Seq};

/// The acknowledgement sender's hold on the buffer.
#[derive(Clone, Debug)]
pub(crate) struct Acks {
    store: Store,
}

impl Acks {
    pub(super) fn new(store: Store) -> Self {
        Self { store }
    }

    /// The pending acknowledgements as committed, with a change notification after every
    /// commit that changes them.
    pub(crate) fn pending_acks(&self) -> watch::Receiver<PendingAcks> {
        self.store.announce.pending_acks.subscribe()
    }

    /// Announcements of the seqs that leave `buffered` (or are marked), from now on.
    pub(crate) fn row_changes(&self) -> broadcast::Receiver<RowChange> {
        self.store.announce.changes.subscribe()
    }

    /// The oldest seq still buffered; `None` when the buffer is empty.
    pub(crate) async fn oldest_seq(&self) -> Result<Option<Seq>> {
        self.store.oldest_seq().await
    }

    /// Deletes the pending acknowledgement once central applied it, unless a later one of the
    /// key moved it meanwhile (it then stays, to be sent again). Returns whether it was
    /// deleted.
    pub(crate) async fn forget_ack(&self, ack: PendingAck) -> Result<bool> {
        let announce = Arc::clone(&self.store.announce);
        let (deleted, _) = self
            .store
            .db
            .write_then(
                move |conn| {
                    let deleted = pending_acks::delete_applied(conn, &ack)?;
                    let acks = pending_acks::select_pending(conn)?;
                    Ok::<_, BufferError>((deleted, acks))
                },
                move |(_, acks)| announce.pending_acks(acks.clone()),
            )
            .await?;
        Ok(deleted)
    }
}
