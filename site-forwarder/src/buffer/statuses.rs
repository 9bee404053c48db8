//! Statuses: the final statuses central sends back, as the status follower (`crate::statuses`)
//! stores them and `WatchStatus` streams read them. The SQL: `super::central_statuses`.
//!
//! Invariants:
//! - A batch is stored in one write job, and its newest seq is published after the commit, so a
//!   reader woken by it finds every status of the batch.
//! - The prune only ever deletes the oldest statuses (`[statuses]`'s bounds).

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::watch;

use super::central_statuses;
use super::error::Result;
use super::store::Store;
use crate::domain::{CentralStatus, StatusInterest, StatusSeq, StoredStatus};

/// Statuses deleted per prune job, so a prune never holds the writer for long.
const PRUNE_BATCH: usize = 5_000;

/// The status follower's and the `WatchStatus` streams' hold on the buffer.
#[derive(Clone, Debug)]
pub(crate) struct Statuses {
    store: Store,
}

impl Statuses {
    pub(super) fn new(store: Store) -> Self {
        Self { store }
    }

    /// Stores a batch central sent (those no newer than what is held change nothing), durably,
    /// before it returns.
    pub(crate) async fn store(&self, statuses: Vec<CentralStatus>) -> Result<()> {
        let announce = Arc::clone(&self.store.announce);
        self.store
            .db
            .write_then(
                move |conn| {
                    let batch: Vec<_> = statuses.into_iter().map(|s| (None, s)).collect();
                    central_statuses::store(conn, &batch, Utc::now().timestamp_millis())
                },
                move |head| {
                    if let Some(head) = *head {
                        announce.status_head.send_if_modified(|h| {
                            let newer = head > *h;
                            *h = (*h).max(head);
                            newer
                        });
                    }
                },
            )
            .await
            .map(|_| ())
    }

    /// The newest stored seq, with a change notification after each commit that stores one.
    pub(crate) fn head(&self) -> watch::Receiver<StatusSeq> {
        self.store.announce.status_head.subscribe()
    }

    /// The statuses `interest` asks about among the `limit` stored after `after` (oldest
    /// first), and the last seq looked at, where the next read starts.
    pub(crate) async fn after(
        &self,
        after: StatusSeq,
        interest: StatusInterest,
        limit: usize,
    ) -> Result<(Vec<StoredStatus>, StatusSeq)> {
        self.store
            .db
            .read(move |conn| central_statuses::select_after(conn, after, Some(&interest), limit))
            .await
    }

    /// Deletes the statuses stored longer than `retention` ago, and the oldest past `max_rows`,
    /// in jobs of [`PRUNE_BATCH`]; returns how many went.
    pub(crate) async fn prune(&self, retention: Duration, max_rows: u64) -> Result<usize> {
        let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let mut total = 0;
        loop {
            let cutoff = Utc::now().timestamp_millis().saturating_sub(retention_ms);
            let pruned = self
                .store
                .db
                .write(move |conn| central_statuses::prune(conn, cutoff, max_rows, PRUNE_BATCH))
                .await?;
            total += pruned;
            if pruned < PRUNE_BATCH {
                return Ok(total);
            }
        }
    }

    /// How many statuses are held (`/metrics`).
    pub(crate) async fn count(&self) -> Result<u64> {
        self.store.db.read(central_statuses::count).await
    }
}
