//! One delivery attempt of one claimed row (or of one digest): resolve its list, deliver through
//! the channel's adapter within the attempt's time bound, turn the answer into the row's next
//! state, and hand that outcome to the recorder, which writes it under the claim's epoch.
//!
//! A [`Delivery`] is the task a channel loop starts for it: it holds a delivery slot until the
//! channel has answered and frees it before the outcome is handed over, so the outcome write
//! shares a commit with the next claim instead of holding the slot for it.
//!
//! A webhook list with fallback URLs is delivered to one of its endpoints, the one its failover
//! state routes to (`super::list_failover`): the attempt resolves the list, picks the endpoint
//! and reports back what it found, with the answer.
//!
//! An attempt never fails its caller: a panic in the adapter, a timeout and an unknown list are
//! all outcomes like any other, recorded on the row. Its time bound is at most half the claim
//! timeout, so no successor can claim the row while the attempt is still under way.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures_util::FutureExt;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::caught::panic_message;
use super::digest::Digest;
use super::list_failover::{ListReport, Route, Seen};
use super::recorder::RecorderHandle;
use crate::config_cache::ConfigCache;
use crate::delivery::{ChannelSettings, Deliver, Turn};
use crate::domain::channel::{ListTargets, NotificationList};
use crate::domain::delivery::{AttemptOutcome, Delivered, DeliveryError};
use crate::domain::failover::ProviderOutcome;
use crate::domain::retry::{RetryPolicy, Transition};
use crate::domain::status::Status;
use crate::domain::webhook::WebhookUrl;
use crate::metrics::Metrics;
use crate::records::{AttemptRecord, ClaimedNotification};
use crate::store::DispatchStore;

/// How long one attempt of `channel` may take. It may not outlive its claim, or a successor
/// could deliver it concurrently; and it is bounded by the channel's own overall timeout.
pub(super) fn attempt_timeout(claim_timeout: Duration, channel: &ChannelSettings) -> Duration {
    let claim_bound = claim_timeout / 2;
    match channel {
        ChannelSettings::Email(Some(s)) => s.overall_timeout.min(claim_bound),
        // Every endpoint of a list is posted to within one attempt.
        ChannelSettings::Webhook(s) => s.timeout.saturating_mul(4).min(claim_bound),
        ChannelSettings::Email(None) => claim_bound,
    }
}

/// A delivery a channel loop starts: one attempt, run as a task of its own while it holds a
/// slot; see the module documentation.
pub(super) struct Delivery<S, D> {
    pub(super) attempt: Attempt<S, D>,
    /// What the adapter delivers: a claimed row, or the one notification of a digest.
    pub(super) notification: ClaimedNotification,
    /// The digest `notification` stands for: each of its rows gets the attempt's outcome.
    pub(super) digest: Option<Digest>,
    /// Its place at the channel's connections: the order deliveries started in.
    pub(super) turn: Turn,
    /// The delivery slot, held until the channel has answered.
    pub(super) slot: OwnedSemaphorePermit,
    /// Cancelled when another node takes the lease (the outcome would be refused and the
    /// successor redelivers the row) or when the drain runs out of time.
    pub(super) cancelled: CancellationToken,
    pub(super) recorder: RecorderHandle,
}

impl<S: DispatchStore, D: Deliver> Delivery<S, D> {
    /// Delivers, frees the slot, and hands the outcome (each digest row's) to the recorder.
    /// Returns how long the slot was held and how the attempt counts for its provider; `None`:
    /// cancelled before the channel answered.
    pub(super) async fn run(self) -> Option<Ended> {
        let Self {
            attempt,
            notification,
            digest,
            turn,
            slot,
            cancelled,
            recorder,
        } = self;
        let began = tokio::time::Instant::now();
        let Attempted {
            record,
            provider,
            list,
        } = tokio::select! {
            biased;
            () = cancelled.cancelled() => return None,
            attempted = attempt.run(notification, turn) => attempted,
        };
        // The slot is free as soon as the channel has answered: the outcome write then shares a
        // commit with the next claim instead of holding the slot for it.
        drop(slot);
        let held = began.elapsed();
        // Err only once the recorder is gone (a drain that ran out of time): the row is due
        // again when its claim expires.
        match digest {
            None => {
                let _ = recorder.send(record).await;
            }
            Some(digest) => {
                tracing::debug!(digest = %digest.id, rows = digest.rows.len(), outcome = %record.outcome.as_str(), "digest attempted");
                let _ = recorder.send_all(digest.records(&record)).await;
            }
        }
        Some(Ended {
            held,
            provider,
            list,
        })
    }
}

/// How a delivery ended, for its channel loop.
pub(super) struct Ended {
    /// How long it held its slot.
    pub(super) held: Duration,
    /// The provider it went to and how it answered ([`Attempted::provider`]).
    pub(super) provider: Option<(usize, ProviderOutcome)>,
    /// What it found out about its webhook list's endpoints ([`Attempted::list`]).
    pub(super) list: Option<ListReport>,
}

/// One delivery attempt of one claimed row.
pub(super) struct Attempt<S, D> {
    pub(super) store: Arc<S>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) delivery: Arc<D>,
    pub(super) config: Arc<ConfigCache>,
    pub(super) channel: ChannelSettings,
    pub(super) retry: RetryPolicy,
    pub(super) timeout: Duration,
    /// The provider `channel` is set up for (its relay, `channel` being the settings `via`
    /// it), as the channel's failover state chose it; `None` where the channel has none.
    pub(super) provider: Option<Provider>,
    /// Where the webhook list's failover state routes the row's list (`None`: a list it does
    /// not follow, or an email row).
    pub(super) route: Option<Route>,
}

/// The provider an attempt goes to: its place in the channel's order and its name.
#[derive(Debug, Clone)]
pub(super) struct Provider {
    pub(super) index: usize,
    pub(super) name: String,
}

/// An attempt's record, and how it counts for the failover of the provider it went to.
pub(super) struct Attempted {
    pub(super) record: AttemptRecord,
    /// `None`: the attempt never reached its provider (no provider, an unknown list, a panic),
    /// so it says nothing about the provider.
    pub(super) provider: Option<(usize, ProviderOutcome)>,
    /// For the webhook lists' failover: the list's endpoints and how the one it went to
    /// answered; `None` where there is nothing to tell (an email row, a list without fallbacks
    /// the state does not follow).
    pub(super) list: Option<ListReport>,
}

/// What an attempt found of its webhook list's providers before it delivered.
enum ListSeen {
    /// Nothing to tell.
    Untold,
    /// The list is gone or has no fallbacks, and the failover state follows it: it should not.
    Nothing(crate::domain::ListName),
    /// The list has fallbacks; the attempt goes to `provider`.
    Providers {
        list: crate::domain::ListName,
        names: Vec<String>,
        first: WebhookUrl,
        provider: Provider,
    },
}

/// What an attempt's delivery came to, as far as its provider is concerned.
enum Answer {
    /// The channel's adapter answered (or did not within the time bound).
    Channel(Result<Delivered, DeliveryError>),
    /// The attempt failed before it asked the channel.
    Before(DeliveryError),
}

impl<S: DispatchStore, D: Deliver> Attempt<S, D> {
    /// Delivers, and returns what to record.
    pub(super) async fn run(self, notification: ClaimedNotification, turn: Turn) -> Attempted {
        let kind = notification.content.kind;
        let started = Instant::now();
        // A panic in an adapter is a bug, but it must cost only this attempt: caught here, it
        // is recorded as a transient failure (retried, then parked like any other), and the
        // task still returns, so its channel slot is freed at once.
        let seen = std::sync::Mutex::new(ListSeen::Untold);
        let attempt = AssertUnwindSafe(self.deliver(&notification, turn, &seen)).catch_unwind();
        let answer = match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(panic)) => {
                let reason = panic_message(panic.as_ref());
                tracing::error!(id = %notification.id, %reason, "a delivery attempt panicked");
                Answer::Before(DeliveryError::transient(format!(
                    "the delivery attempt panicked: {reason}"
                )))
            }
            Err(_) => Answer::Channel(Err(DeliveryError::transient(format!(
                "delivery attempt timed out after {}s",
                self.timeout.as_secs()
            )))),
        };
        let (result, reached) = match answer {
            Answer::Channel(result) => (result, true),
            Answer::Before(e) => (Err(e), false),
        };
        let outcome = ProviderOutcome::of(&result);
        // Told even when the attempt timed out or panicked after choosing: a timeout is the
        // endpoint's failure, a panic (`reached` false) is not.
        let seen = seen
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (list, list_provider) = match seen {
            ListSeen::Untold => (None, None),
            ListSeen::Nothing(list) => (
                Some(ListReport {
                    list,
                    seen: Seen::Nothing,
                }),
                None,
            ),
            ListSeen::Providers {
                list,
                names,
                first,
                provider,
            } => (
                Some(ListReport {
                    list,
                    seen: Seen::Providers {
                        names,
                        first,
                        answered: reached.then_some((provider.index, outcome)),
                    },
                }),
                // As for a relay: named only where the attempt reached it.
                Some(provider.name).filter(|_| reached),
            ),
        };
        let provider = self
            .provider
            .filter(|_| reached)
            .map(|p| (p.index, outcome, p.name));
        let transition = self.retry.transition(
            notification.retry_count,
            &result,
            Utc::now(),
            fastrand::f64(),
        );
        let record = AttemptRecord {
            row_id: notification.row_id,
            id: notification.id,
            attempt_no: notification.attempt_no,
            epoch: notification.epoch,
            outcome: AttemptOutcome::of(&result),
            error: result.as_ref().err().map(|e| e.message().to_owned()),
            duration: started.elapsed(),
            transition,
            provider: provider
                .as_ref()
                .map(|(_, _, name)| name.clone())
                .or(list_provider),
        };
        self.metrics
            .attempt_finished(kind, record.outcome, record.duration);
        Attempted {
            record,
            provider: provider.map(|(index, outcome, _)| (index, outcome)),
            list,
        }
    }

    /// Resolves the list and delivers to it (to the endpoint its route names, for a webhook
    /// list with fallbacks), saying in `seen` what it found of the list's providers as soon as
    /// it knows: a timeout may end the attempt during the delivery.
    async fn deliver(
        &self,
        n: &ClaimedNotification,
        turn: Turn,
        seen: &std::sync::Mutex<ListSeen>,
    ) -> Answer {
        let tell = |what: ListSeen| {
            *seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = what;
        };
        let list = match self.config.list(&self.store, &n.content.list_name).await {
            Ok(Some(list)) => list,
            Ok(None) => {
                if self.route.is_some() {
                    tell(ListSeen::Nothing(n.content.list_name.clone()));
                }
                return Answer::Before(DeliveryError::permanent(format!(
                    "unknown notification list {:?}",
                    n.content.list_name.as_str()
                )));
            }
            Err(e) => {
                return Answer::Before(DeliveryError::transient(format!(
                    "cannot resolve the list: {e}"
                )));
            }
        };
        if list.kind() != n.content.kind {
            return Answer::Before(DeliveryError::permanent(format!(
                "notification list {:?} is a {} list, not {}",
                list.name.as_str(),
                list.kind(),
                n.content.kind
            )));
        }
        let (list, what) = self.route_list(list);
        tell(what);
        Answer::Channel(self.delivery.deliver(&self.channel, &list, n, turn).await)
    }

    /// The list as this attempt delivers to it: a webhook list with fallbacks with only the
    /// endpoint its route names (the first unless the route was made for these very
    /// endpoints), and what to tell its failover state.
    fn route_list(&self, list: Arc<NotificationList>) -> (Arc<NotificationList>, ListSeen) {
        let ListTargets::Webhook(target) = &list.targets else {
            return (list, ListSeen::Untold);
        };
        let names = target.provider_names();
        let Some(first) = target.endpoints.first().filter(|_| !names.is_empty()) else {
            let seen = match self.route {
                Some(_) => ListSeen::Nothing(list.name.clone()),
                None => ListSeen::Untold,
            };
            return (list, seen);
        };
        let index = Route::index_for(self.route.as_ref(), &names);
        let seen = ListSeen::Providers {
            list: list.name.clone(),
            first: first.clone(),
            provider: Provider {
                index,
                name: names.get(index).cloned().unwrap_or_default(),
            },
            names,
        };
        if index == 0 {
            // The first provider is the list as it is (its one endpoint): no copy.
            return (list, seen);
        }
        let via = NotificationList {
            name: list.name.clone(),
            targets: ListTargets::Webhook(target.via(index)),
            consolidation: list.consolidation,
            escalation: list.escalation.clone(),
            status_callback: list.status_callback.clone(),
        };
        (Arc::new(via), seen)
    }
}

/// The record of a claimed row that is never handed to its channel: the claim released at
/// once, with `why` on its attempt (outcome NotSent), and the row due again now with its retry
/// count unchanged. A row in a digest stays Held (the stores keep a Held row Held when told
/// Retrying), so it goes out in its list's next digest.
pub(super) fn not_sent(n: &ClaimedNotification, in_digest: bool, why: String) -> AttemptRecord {
    let status = if in_digest || n.retry_count > 0 {
        Status::Retrying
    } else {
        Status::Pending
    };
    AttemptRecord {
        row_id: n.row_id,
        id: n.id,
        attempt_no: n.attempt_no,
        epoch: n.epoch,
        outcome: AttemptOutcome::NotSent,
        error: Some(why),
        duration: Duration::ZERO,
        transition: Transition {
            status,
            retry_count: n.retry_count,
            next_attempt_at: Some(Utc::now()),
            last_error: None,
            resolved_at: None,
            resolved_targets: None,
        },
        provider: None,
    }
}

/// The record of a row whose attempt failed before anything could be sent (a digest that
/// cannot be composed): an attempt like any other, failed with `error`, through the retry
/// policy.
pub(super) fn failed_unsent(
    n: &ClaimedNotification,
    retry: &RetryPolicy,
    error: DeliveryError,
) -> AttemptRecord {
    let result = Err(error);
    let transition = retry.transition(n.retry_count, &result, Utc::now(), fastrand::f64());
    AttemptRecord {
        row_id: n.row_id,
        id: n.id,
        attempt_no: n.attempt_no,
        epoch: n.epoch,
        outcome: AttemptOutcome::of(&result),
        error: result.err().map(|e| e.message().to_owned()),
        duration: Duration::ZERO,
        transition,
        provider: None,
    }
}
