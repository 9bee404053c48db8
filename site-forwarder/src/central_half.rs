//! The loop every "central half" of a site action runs (a clear's, an acknowledgement's): the
//! action is committed locally and answered at once, and a task beside the forwarder asks
//! central to apply it as soon as its watermark allows, retrying after any failure.
//!
//! It waits on events only: a change to the pending list, rows leaving the buffer (which may
//! make one due) while any is pending, and the retry interval after a failure; never a polling
//! timer. A failure is reported as a warning once per run of failures (then at debug), and the
//! pending list, the metric each half keeps of it, says how much is waiting.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::buffer::{BufferError, RowChange};
use crate::domain::Seq;

/// What one kind of site action's central half does; [`run`] sends what is due with it.
pub(crate) trait CentralHalf: Sync {
    /// The pending actions as the buffer publishes them.
    type Pending: Clone + Send + Sync;
    /// One pending action.
    type Item: Send + Sync;
    type Error: Display + From<BufferError> + Send;

    /// What the log calls one ("clear", "acknowledgement").
    const WHAT: &'static str;

    fn is_empty(pending: &Self::Pending) -> bool;

    /// The actions central may apply now, given the oldest seq still buffered, in order.
    fn due(pending: &Self::Pending, oldest_buffered: Option<Seq>) -> Vec<Self::Item>;

    /// The oldest seq still buffered; `None` when the buffer is empty.
    fn oldest_seq(&self) -> impl Future<Output = Result<Option<Seq>, BufferError>> + Send;

    /// Asks central to apply `item`.
    fn apply(&self, item: &Self::Item) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Forgets `item` once central applied it (unless a later action moved it meanwhile).
    fn forget(&self, item: Self::Item) -> impl Future<Output = Result<bool, BufferError>> + Send;
}

/// Asks central to apply every action of `pending` that is due now, forgetting each once it
/// did; the first failure ends the round.
async fn send_due<H: CentralHalf>(half: &H, pending: &H::Pending) -> Result<(), H::Error> {
    if H::is_empty(pending) {
        return Ok(());
    }
    let oldest = half.oldest_seq().await?;
    for item in H::due(pending, oldest) {
        half.apply(&item).await?;
        half.forget(item).await?;
    }
    Ok(())
}

/// Where a half's wake-ups come from.
pub(crate) struct Wakeups<P> {
    pub pending: watch::Receiver<P>,
    pub changes: broadcast::Receiver<RowChange>,
}

/// Runs `half` until `shutdown`: sends what is due, then waits for a reason to look again.
pub(crate) async fn run<H: CentralHalf>(
    half: &H,
    mut wakeups: Wakeups<H::Pending>,
    central_url: &str,
    retry_interval: Duration,
    shutdown: &CancellationToken,
) {
    // Whether the current run of failures was already reported as a warning.
    let mut reported = false;
    loop {
        // Announcements so far are covered by the look below: take them all as one wake-up.
        drain(&mut wakeups.changes);
        let pending = wakeups.pending.borrow_and_update().clone();
        // Stopping mid-round is safe: one central applied but still pending here is sent again
        // later, and applying it twice is harmless (a no-op, or a duplicate recorded).
        let round = tokio::select! {
            () = shutdown.cancelled() => return,
            round = send_due(half, &pending) => round,
        };
        match round {
            Ok(()) => reported = false,
            Err(error) => {
                if reported {
                    tracing::debug!(central = %central_url, %error, "{} still not applied at central", H::WHAT);
                } else {
                    tracing::warn!(
                        central = %central_url, %error, retry_in = ?retry_interval,
                        "cannot apply a {} at central yet; will retry", H::WHAT
                    );
                    reported = true;
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(retry_interval) => {}
                }
                continue;
            }
        }
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            changed = wakeups.pending.changed() => {
                // Cannot fail while the half holds the buffer; stop rather than spin.
                if changed.is_err() {
                    return;
                }
            }
            // Rows leaving the buffer may make one due; with none pending they cannot.
            change = wakeups.changes.recv(), if !H::is_empty(&pending) => {
                if matches!(change, Err(broadcast::error::RecvError::Closed)) {
                    return;
                }
            }
        }
    }
}

/// Takes every announcement already received; a receiver that lagged has lost some, which only
/// matters as a wake-up, and this is one.
fn drain<T: Clone>(changes: &mut broadcast::Receiver<T>) {
    loop {
        match changes.try_recv() {
            Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) => {}
            Err(broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed) => {
                return;
            }
        }
    }
}
