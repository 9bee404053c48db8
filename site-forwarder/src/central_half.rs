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

use crate::buffer::RowChange;

/// What one kind of site action's central half does.
pub(crate) trait CentralHalf {
    /// The pending actions as the buffer publishes them.
    type Pending: Clone;
    type Error: Display;

    /// What the log calls one ("clear", "acknowledgement").
    const WHAT: &'static str;

    fn is_empty(pending: &Self::Pending) -> bool;

    /// Asks central to apply every one that is due now, forgetting each once it did.
    fn send_due(
        &self,
        pending: &Self::Pending,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
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
            round = half.send_due(&pending) => round,
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
