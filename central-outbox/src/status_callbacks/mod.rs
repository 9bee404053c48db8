//! Status callbacks: on the dispatcher lease holder only, tells each list's status callback
//! endpoint every final status of the list's notifications (`domain::status_callback` has the
//! rules, `call` the request), and records every call on the notification's history.
//!
//! The changes are rows the database queued in the transaction that set each status
//! (`StatusCallbackStore`), so none can be lost here: a turn takes the due ones, calls them at
//! most [`CONCURRENT_CALLS`] at a time, and records each call with what becomes of its change
//! (forgotten once answered or given up, due again later otherwise). A call whose record the
//! store refuses is counted (`outbox_status_callback_failures_total`) and its change made again
//! next turn, so an endpoint may hear a change twice; the `Idempotency-Key` lets it tell.
//! Nothing here touches a notification's status.
//!
//! Between turns it sleeps until the next change is due, at most [`MAX_SLEEP`], and wakes at
//! once when this node's dispatcher records outcomes (most final statuses).

pub(crate) mod call;
pub mod settings;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures_util::StreamExt;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::delivery::http::HttpClient;
use crate::domain::status_callback::{CallOutcome, CallResult, Next, after_call};
use crate::metrics::Metrics;
use crate::records::{DueStatusCallback, LeaseEpoch, StatusCallbackCall};
use crate::store::StatusCallbackStore;
use settings::StatusCallbackSettings;

/// Longest sleep between turns: a change queued by another replica's ingest or an operator
/// is called within about this long.
pub(crate) const MAX_SLEEP: Duration = Duration::from_secs(1);
/// Changes taken per turn.
pub(crate) const TURN_LIMIT: u32 = 100;
/// Calls in flight at once: enough to keep a slow endpoint from holding up the others.
pub(crate) const CONCURRENT_CALLS: usize = 16;
/// How often the backlog gauges are read from the store.
const BACKLOG_EVERY: Duration = Duration::from_secs(5);

/// What a turn needs besides the store.
pub(crate) struct Caller {
    pub http: HttpClient,
    pub settings: StatusCallbackSettings,
    pub metrics: Arc<Metrics>,
}

/// Runs until `shutdown`: while this node holds the dispatcher lease, a turn, then a sleep
/// until the next change is due (at most [`MAX_SLEEP`]) or `wake`.
pub(crate) async fn run<S: StatusCallbackStore>(
    store: Arc<S>,
    caller: Arc<Caller>,
    mut lease: watch::Receiver<Option<LeaseEpoch>>,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let mut backlog_read: Option<Instant> = None;
    loop {
        if lease.borrow().is_none() {
            // Only the lease holder's figures count; a follower shows none.
            caller.metrics.status_callback_backlog(0, Duration::ZERO);
            backlog_read = None;
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            held = lease.wait_for(Option::is_some) => if held.is_err() {
                // The dispatcher is gone, so this node will never lead again.
                return;
            },
        }
        let pause = tokio::select! {
            () = shutdown.cancelled() => return,
            pause = turn(&*store, &caller) => pause,
        };
        if backlog_read.is_none_or(|at| at.elapsed() >= BACKLOG_EVERY) {
            backlog_read = Some(Instant::now());
            match store.status_callback_backlog().await {
                Ok(backlog) => {
                    let oldest = backlog.oldest_queued_at.map_or(Duration::ZERO, |at| {
                        (Utc::now() - at).to_std().unwrap_or(Duration::ZERO)
                    });
                    caller
                        .metrics
                        .status_callback_backlog(backlog.waiting, oldest);
                }
                Err(error) => {
                    caller.metrics.status_callback_failed();
                    tracing::warn!(%error, "cannot read the status callbacks' backlog");
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
            () = wake.notified() => {}
            _ = lease.changed() => {}
        }
    }
}

/// One turn: the due changes called and recorded. Returns how long to sleep.
async fn turn<S: StatusCallbackStore>(store: &S, caller: &Caller) -> Duration {
    let turn = match store.due_status_callbacks(TURN_LIMIT).await {
        Ok(turn) => turn,
        Err(error) => {
            caller.metrics.status_callback_failed();
            tracing::error!(%error, "cannot read the due status callbacks; retrying");
            return MAX_SLEEP;
        }
    };
    let full = turn.due.len() >= TURN_LIMIT as usize;
    let calls = futures_util::stream::iter(turn.due)
        .map(|due| one(caller, due))
        .buffer_unordered(CONCURRENT_CALLS)
        .collect::<Vec<_>>()
        .await;
    let mut refused = false;
    for record in calls {
        let outcome = record.outcome;
        match store.record_status_callback(record).await {
            Ok(()) => caller.metrics.status_callback_called(outcome),
            Err(error) => {
                refused = true;
                caller.metrics.status_callback_failed();
                tracing::error!(%error, "cannot record a status callback call; its change is made again");
            }
        }
    }
    if refused {
        MAX_SLEEP
    } else if full {
        Duration::ZERO
    } else {
        turn.next_due_in.map_or(MAX_SLEEP, |due| due.min(MAX_SLEEP))
    }
}

/// Makes the call for `due` (or finds it cannot be made) and says what to record.
async fn one(caller: &Caller, due: DueStatusCallback) -> StatusCallbackCall {
    let settings = &caller.settings;
    let endpoint = due.endpoint.as_ref().map(|e| e.origin());
    let (duration, result) = match (&due.endpoint, &settings.key) {
        (None, _) => (
            None,
            CallResult::Permanent("the list no longer has a status callback URL".to_owned()),
        ),
        (Some(_), None) => (
            None,
            CallResult::Transient(
                "no status_callbacks.key is configured to sign the call with".to_owned(),
            ),
        ),
        (Some(url), Some(key)) => {
            let (took, result) =
                call::call(&caller.http, url, key, &due.change, settings.timeout).await;
            (Some(took), result)
        }
    };
    let now = Utc::now();
    let next = after_call(
        &result,
        due.calls.saturating_add(1),
        due.queued_at,
        now,
        settings.give_up_after,
    );
    let (outcome, retry_at) = match next {
        Next::Done(outcome) => (outcome, None),
        Next::RetryAt(at) => (CallOutcome::Failed, Some(at)),
    };
    let error = match (&result, outcome) {
        (CallResult::Answered, _) => None,
        (CallResult::Transient(why), CallOutcome::GivenUp) => Some(format!(
            "{why}; not answered within {}, given up",
            humantime::format_duration(settings.give_up_after)
        )),
        (CallResult::Transient(why) | CallResult::Permanent(why), _) => Some(why.clone()),
    };
    StatusCallbackCall {
        seq: due.change.seq,
        id: due.change.state.id,
        status: due.change.state.status,
        called_at: now
            - chrono::Duration::from_std(duration.unwrap_or_default()).unwrap_or_default(),
        duration,
        outcome,
        error,
        endpoint,
        retry_at,
    }
}
