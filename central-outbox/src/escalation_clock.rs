//! The escalation clock: on the dispatcher lease holder only, fires the pages, exhaustions and
//! reminders that are due (`EscalationStore::escalate_due`, rules in `domain::escalation`), and
//! wakes the dispatcher for the notifications those pages stored.
//!
//! The schedule lives in the store, never here: each turn reads what is due by the store's
//! clock and fires it under the lease epoch, so a node that loses the lease fires nothing more,
//! and its successor fires the next page once (the page rows' key). Between turns it sleeps until
//! the next incident is due, but never longer than [`MAX_SLEEP`]: an incident opened through
//! another replica's ingest, or moved forward by a parked page, is seen within a second, which
//! keeps a page's timing error (p99) within the two seconds `make bench` holds it to.
//!
//! A failed turn is counted (`outbox_escalation_failures_total`, which an alert rule watches)
//! and retried after [`MAX_SLEEP`]; nothing is lost, since what was due stays due.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::dispatcher::DISPATCHER_LEASE;
use crate::metrics::Metrics;
use crate::records::LeaseEpoch;
use crate::store::EscalationStore;

/// Longest the clock sleeps between turns.
pub(crate) const MAX_SLEEP: Duration = Duration::from_secs(1);

/// Incidents fired per turn (one transaction): a backlog after an outage goes out in turns of
/// this many, each short enough not to hold the writer from ingest for long.
pub(crate) const TURN_LIMIT: u32 = 200;

/// Runs until `shutdown`: while this node holds the dispatcher lease, a turn, then a sleep
/// until the next is due (at most [`MAX_SLEEP`]).
pub(crate) async fn run<S: EscalationStore>(
    store: Arc<S>,
    metrics: Arc<Metrics>,
    mut lease: watch::Receiver<Option<LeaseEpoch>>,
    dispatcher_wake: Arc<Notify>,
    shutdown: CancellationToken,
) {
    loop {
        let epoch = tokio::select! {
            () = shutdown.cancelled() => return,
            held = lease.wait_for(Option::is_some) => match held {
                Ok(epoch) => epoch.unwrap_or(LeaseEpoch(0)),
                // The dispatcher is gone, so this node will never lead again.
                Err(_) => return,
            },
        };
        let pause = match store
            .escalate_due(DISPATCHER_LEASE, epoch, TURN_LIMIT)
            .await
        {
            Ok(turn) => {
                metrics.escalation_turn(&turn);
                if turn.messages > 0 {
                    dispatcher_wake.notify_one();
                }
                if turn.more_due {
                    Duration::ZERO
                } else {
                    turn.next_due_in.map_or(MAX_SLEEP, |due| due.min(MAX_SLEEP))
                }
            }
            Err(e) => {
                metrics.escalation_failed();
                tracing::error!(error = %e, "the escalation clock's turn failed; retrying");
                MAX_SLEEP
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
            // A new epoch (or the lease lost) is seen at once.
            _ = lease.changed() => {}
        }
    }
}
