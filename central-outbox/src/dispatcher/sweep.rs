//! The store calls a sweep makes, reading the SMTP settings and claiming due rows, each run as
//! a task of its own so that the dispatch loop never waits for the database.
//!
//! While a call is under way the loop goes on: it starts queued rows as slots free up, hands
//! finished outcomes to the recorders and follows the lease. When the loop awaited these calls
//! itself, a database answering slowly (Babelfish under load took seconds for a claim or a
//! settings read) held up rows claimed ahead until they had waited past half their claim and
//! were given back, each costing an extra attempt.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::task::JoinSet;

use super::attempt::panic_message;
use super::lease::DISPATCHER_LEASE;
use crate::config_cache::ConfigCache;
use crate::domain::NotificationType;
use crate::domain::channel::SmtpSettings;
use crate::domain::serve_order::ClaimLanes;
use crate::store::{ClaimedNotification, LeaseEpoch, OutboxStore, Result, StoreError};

/// What a sweep's store call answered.
pub(super) enum Answer {
    /// The SMTP settings (`None`: none are stored). The sweep that asked for them claims now.
    /// Boxed: read once a second at most, they need not make every claim's answer as large.
    Settings(Box<Result<Option<SmtpSettings>>>),
    /// A claim of up to `wanted` rows of `kind` under `epoch`.
    Claimed {
        kind: NotificationType,
        wanted: usize,
        epoch: LeaseEpoch,
        rows: Result<Vec<ClaimedNotification>>,
    },
}

/// The store calls under way: at most one settings read, and (kept by `Pacing`) at most one
/// claim per channel.
#[derive(Default)]
pub(super) struct SweepCalls {
    tasks: JoinSet<Answer>,
    reading_settings: bool,
}

impl SweepCalls {
    pub(super) fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Whether a settings read is under way (a sweep then claims when it answers).
    pub(super) fn reading_settings(&self) -> bool {
        self.reading_settings
    }

    /// Reads the SMTP settings through `config`, unless a read is under way already.
    pub(super) fn read_settings<S: OutboxStore>(
        &mut self,
        config: Arc<ConfigCache>,
        store: Arc<S>,
    ) {
        if self.reading_settings {
            return;
        }
        self.reading_settings = true;
        self.tasks.spawn(async move {
            Answer::Settings(Box::new(caught(config.smtp_settings(&*store)).await))
        });
    }

    /// Claims due rows of `kind` in `lanes` under `epoch` for `claim_timeout`.
    pub(super) fn claim<S: OutboxStore>(
        &mut self,
        store: Arc<S>,
        kind: NotificationType,
        lanes: ClaimLanes,
        epoch: LeaseEpoch,
        claim_timeout: Duration,
    ) {
        self.tasks.spawn(async move {
            let claim = store.claim_due(DISPATCHER_LEASE, epoch, kind, lanes, claim_timeout);
            Answer::Claimed {
                kind,
                wanted: lanes.total(),
                epoch,
                rows: caught(claim).await,
            }
        });
    }

    /// The next answer; pending while no call is under way.
    pub(super) async fn next(&mut self) -> Answer {
        loop {
            match self.tasks.join_next().await {
                Some(Ok(answer)) => {
                    if matches!(answer, Answer::Settings(_)) {
                        self.reading_settings = false;
                    }
                    return answer;
                }
                // Panics are caught in the task and nothing aborts these tasks, so this is the
                // runtime shutting down under the loop.
                Some(Err(e)) => tracing::error!(error = %e, "a dispatcher store call was lost"),
                None => std::future::pending().await,
            }
        }
    }
}

/// A panic in a store call is a bug, but it must cost only this call: it is answered as the
/// database being unavailable, so the channel is claimed again at the next ingest or poll.
async fn caught<T>(call: impl Future<Output = Result<T>>) -> Result<T> {
    AssertUnwindSafe(call)
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            Err(StoreError::Unavailable(format!(
                "the store call panicked: {}",
                panic_message(panic.as_ref())
            )))
        })
}
