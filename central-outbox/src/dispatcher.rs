//! The dispatcher: while this node holds the `dispatcher` lease, it claims due notifications and
//! delivers each through its channel's adapter, recording every attempt.
//!
//! One loop, woken by whichever comes first: ingest (a new row), a finished delivery (a free
//! slot), the poll interval (retries coming due, rows other replicas ingested), a rate-limit
//! token coming due, or lease renewal. Each wake runs one sweep, [`Dispatcher::dispatch_once`]:
//! for each channel, claim as many rows as it has free delivery slots and rate-limit tokens,
//! start one task per row. Sweeps never overlap because only this loop runs them. A delivery task
//! never fails the loop: its outcome, whatever it is, is recorded on its own row.
//!
//! An attempt frees its slot as soon as the channel has answered, and its outcome is written by
//! a separate task: the write then shares a group commit with the claim of the row that takes
//! the slot, instead of the two waiting for one fsync each in turn.
//!
//! The lease is kept by [`LeaseKeeper`], a task of its own, so renewing it never waits for a
//! sweep. This loop follows what the keeper publishes: it claims only while it holds a lease
//! that is still valid. When the lease lapses (no renewal succeeded for its TTL) it stops
//! claiming and starting rows, but keeps the rows it claimed and lets deliveries under way
//! finish: each is bounded to half the claim timeout, so no successor can have claimed its row
//! meanwhile, and its outcome is recorded if no other node has taken the lease since (the
//! store's fence). A node that re-takes its own lapsed lease keeps its epoch, so those
//! outcomes stand and its queued rows start. When another node holds the lease, deliveries
//! under way are aborted and queued rows dropped: their outcomes would be refused and the
//! successor redelivers them. On shutdown no new claims are made, deliveries under way get
//! `drain_timeout` while the keeper goes on renewing, and then the lease is released so a
//! successor takes over at once; rows still claimed become due again when their claim expires.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures_util::FutureExt;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config_cache::ConfigCache;
use crate::delivery::{Adapters, ChannelSettings, Deliver};
use crate::domain::NotificationType;
use crate::domain::channel::{SmtpSettings, WebhookSettings};
use crate::domain::delivery::{AttemptOutcome, Delivered, DeliveryError};
use crate::domain::rate::TokenBucket;
use crate::domain::retry::RetryPolicy;
use crate::lease::{HeldLease, LeaseKeeper, LeaseSettings};
use crate::metrics::Metrics;
use crate::store::{AttemptRecord, ClaimedNotification, LeaseEpoch, OutboxStore, StoreError};

pub use crate::lease::DISPATCHER_LEASE;

/// Timing of the dispatcher. Defaults documented in `deploy/central-outbox.toml`.
#[derive(Debug, Clone)]
pub struct DispatcherSettings {
    /// Identifies this node as lease holder; unique per process.
    pub node_id: String,
    /// Longest a due row waits when nothing wakes the dispatcher.
    pub poll_interval: Duration,
    /// How long a lease lasts without renewal.
    pub lease_ttl: Duration,
    /// How often the lease is renewed (well under `lease_ttl`).
    pub renew_interval: Duration,
    /// How long a claimed row stays claimed; after it the row is due again (at-least-once).
    pub claim_timeout: Duration,
    /// How long in-flight deliveries may run after shutdown begins.
    pub drain_timeout: Duration,
    /// Sweep when something happens (a new row ingested here, a delivery finished) as well as on
    /// the poll timer. `false` reproduces the timer-only loop of the system this replaces (for
    /// comparison benchmarks); it adds up to a poll interval of latency.
    pub wake_on_events: bool,
    /// Rows claimed per sweep and channel. `None` (the default): the free delivery slots plus
    /// two rows per connection (never more than the rate limit allows), so that
    /// while a backlog drains, a slot that frees up starts its next row from the local queue
    /// instead of waiting for a claim to commit. `Some(n)`: up to n. Either way a sweep claims
    /// only when nothing is queued, and queued rows start as slots free up.
    pub claim_batch: Option<usize>,
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepOutcome {
    /// This node does not hold the lease.
    NotLeader,
    /// Claimed and started this many deliveries (0: nothing was due, or no slot or token free).
    Started(usize),
}

/// The channels, in the order a sweep serves them.
const CHANNELS: [NotificationType; 2] = [NotificationType::Email, NotificationType::Webhook];

/// One channel's share of the dispatcher: its busy slots, its rate limit, rows claimed but not
/// yet started, and the settings of the last sweep (which those rows are delivered with).
#[derive(Debug, Default)]
struct ChannelState {
    in_flight: usize,
    bucket: Option<TokenBucket>,
    queue: VecDeque<(ClaimedNotification, Instant)>,
    settings: Option<ChannelSettings>,
}

/// The dispatch loop of one node, delivering through `D` (the real adapters, or a test's).
pub struct Dispatcher<S, D = Adapters> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    delivery: Arc<D>,
    config: Arc<ConfigCache>,
    settings: DispatcherSettings,
    webhook: WebhookSettings,
    wake: Arc<Notify>,
    /// Keeps the lease; taken and spawned by `run`.
    keeper: Option<LeaseKeeper<S>>,
    /// What the keeper last published.
    held: watch::Receiver<Option<HeldLease>>,
    /// The epoch this node dispatches under now: the keeper's, while still valid.
    lease: Option<LeaseEpoch>,
    /// The epoch of the work queued and under way, which outlives a lapse of `lease`: kept if
    /// the keeper renews with it, dropped if another epoch (another holder) comes between.
    tenure: Option<LeaseEpoch>,
    /// When the lease we last saw renewed runs out, measured from before the renewal was sent.
    lease_deadline: Option<tokio::time::Instant>,
    /// Publishes `lease` to whoever works only on the leader (the purge) or reports it (metrics).
    lease_watch: watch::Sender<Option<LeaseEpoch>>,
    channels: [ChannelState; CHANNELS.len()],
    /// Earliest instant a rate-limited channel gets a token again, if any is waiting for one.
    throttled_until: Option<tokio::time::Instant>,
    /// Email settings of the last sweep, to log clamping warnings once per change.
    warned_for: Option<SmtpSettings>,
    /// Deliveries under way: each holds one slot of its channel.
    in_flight: JoinSet<Finished>,
    /// Outcomes of finished deliveries being written; they hold no slot.
    recording: JoinSet<()>,
}

/// A delivery whose channel has answered, with what is to be recorded.
struct Finished {
    kind: NotificationType,
    record: AttemptRecord,
}

fn channel_index(kind: NotificationType) -> usize {
    match kind {
        NotificationType::Email => 0,
        NotificationType::Webhook => 1,
    }
}

impl<S: OutboxStore, D: Deliver> Dispatcher<S, D> {
    pub fn new(
        store: Arc<S>,
        metrics: Arc<Metrics>,
        delivery: Arc<D>,
        config: Arc<ConfigCache>,
        settings: DispatcherSettings,
        webhook: WebhookSettings,
        wake: Arc<Notify>,
    ) -> Self {
        for warning in webhook.policy.retry_policy().1 {
            tracing::warn!("webhook configuration: {warning}");
        }
        let keeper = LeaseKeeper::new(
            Arc::clone(&store),
            Arc::clone(&metrics),
            LeaseSettings {
                node_id: settings.node_id.clone(),
                ttl: settings.lease_ttl,
                renew_interval: settings.renew_interval,
            },
        );
        let held = keeper.subscribe();
        Self {
            store,
            metrics,
            delivery,
            config,
            settings,
            webhook,
            wake,
            keeper: Some(keeper),
            held,
            lease: None,
            tenure: None,
            lease_deadline: None,
            lease_watch: watch::Sender::new(None),
            channels: Default::default(),
            throttled_until: None,
            warned_for: None,
            in_flight: JoinSet::new(),
            recording: JoinSet::new(),
        }
    }

    /// The lease epoch this node holds, `None` while it is not the dispatcher.
    pub fn lease_watch(&self) -> watch::Receiver<Option<LeaseEpoch>> {
        self.lease_watch.subscribe()
    }

    /// Runs until `shutdown` is cancelled, then drains and releases the lease.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let keeper_stop = CancellationToken::new();
        let keeper = self
            .keeper
            .take()
            .map(|keeper| tokio::spawn(keeper.run(keeper_stop.clone())));
        let mut poll = tokio::time::interval(self.settings.poll_interval);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let lease_deadline = self.lease_deadline;
            let throttled_until = self.throttled_until;
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                () = sleep_until(lease_deadline), if lease_deadline.is_some() => {
                    self.lease_expired();
                    continue;
                }
                Ok(()) = self.held.changed() => {
                    let held = *self.held.borrow_and_update();
                    self.follow_lease(held);
                    if !self.settings.wake_on_events {
                        // Timer-only mode sweeps on the poll timer alone.
                        continue;
                    }
                }
                Some(_) = self.recording.join_next(), if !self.recording.is_empty() => continue,
                Some(finished) = self.in_flight.join_next(), if !self.in_flight.is_empty() => {
                    self.finished(finished);
                    // Collect every other finished task too, so one sweep fills all free slots.
                    while let Some(finished) = self.in_flight.try_join_next() {
                        self.finished(finished);
                    }
                    if !self.settings.wake_on_events {
                        // Timer-only mode: carry on with what the last sweep claimed.
                        self.start_all_queued();
                        continue;
                    }
                }
                () = self.wake.notified(), if self.settings.wake_on_events => {}
                () = sleep_until(throttled_until), if throttled_until.is_some() => {
                    if !self.settings.wake_on_events {
                        self.start_all_queued();
                        continue;
                    }
                }
                _ = poll.tick() => {}
            }
            if let Err(e) = self.dispatch_once().await {
                tracing::error!(error = %e, "dispatch sweep failed");
            }
        }
        self.drain().await;
        keeper_stop.cancel();
        if let Some(keeper) = keeper
            && let Err(e) = keeper.await
        {
            tracing::error!(error = %e, "the lease keeper failed");
        }
        self.set_lease(None);
    }

    /// Frees the slot of a finished delivery and starts recording its outcome.
    fn finished(&mut self, finished: Result<Finished, tokio::task::JoinError>) {
        match finished {
            Ok(Finished { kind, record }) => {
                let state = &mut self.channels[channel_index(kind)];
                state.in_flight = state.in_flight.saturating_sub(1);
                self.recording
                    .spawn(record_outcome(Arc::clone(&self.store), record));
            }
            // Aborted when another node took the lease (the counts were reset then). A panic in
            // the adapter is caught inside the task (`Attempt::run`); one anywhere else loses
            // the channel it ran on, so recount once the set is empty.
            Err(e) => {
                if e.is_panic() {
                    tracing::error!(error = %e, "a delivery task panicked outside its attempt");
                }
                if self.in_flight.is_empty() {
                    for state in &mut self.channels {
                        state.in_flight = 0;
                    }
                }
            }
        }
    }

    /// Takes what the keeper published: a lease still valid is dispatched under. Another epoch,
    /// or none (another node holds the lease), means another node held it since this node
    /// claimed what it has queued and under way: that work is dropped.
    fn follow_lease(&mut self, held: Option<HeldLease>) {
        let epoch = held.map(|h| h.epoch);
        if self.tenure.is_some() && self.tenure != epoch {
            self.abort_in_flight();
        }
        self.tenure = epoch;
        let now = held.filter(HeldLease::is_valid);
        self.lease_deadline = now.map(|h| h.valid_until);
        self.set_lease(now.map(|h| h.epoch));
    }

    fn set_lease(&mut self, lease: Option<LeaseEpoch>) {
        self.lease = lease;
        self.metrics.set_lease(lease.is_some(), lease.map(|e| e.0));
        self.lease_watch.send_if_modified(|held| {
            let changed = *held != lease;
            *held = lease;
            changed
        });
    }

    /// The lease ran out without a successful renewal: stop claiming and starting. Rows claimed
    /// but not started stay queued, and deliveries under way go on: if this node renews before
    /// another takes the lease, it keeps its epoch and carries on with them (a queued row that
    /// has waited too long is still given back, see `start_queued`); if another node takes it,
    /// they are dropped then. See the module documentation.
    fn lease_expired(&mut self) {
        tracing::warn!(
            in_flight = self.in_flight.len(),
            "dispatcher lease expired without renewal; no new claims until it is renewed"
        );
        self.lease_deadline = None;
        self.set_lease(None);
    }

    /// Aborts every delivery under way and drops outcomes not yet written.
    fn abort_in_flight(&mut self) {
        if !self.in_flight.is_empty() || !self.recording.is_empty() {
            tracing::warn!(
                in_flight = self.in_flight.len(),
                "another node holds the dispatcher lease; cancelling in-flight deliveries"
            );
        }
        if !self.in_flight.is_empty() {
            self.in_flight.abort_all();
        }
        // The lease is another node's, so these writes would be refused anyway.
        if !self.recording.is_empty() {
            self.recording.abort_all();
        }
        for state in &mut self.channels {
            state.in_flight = 0;
            // Claimed but never started: due again when their claims expire.
            state.queue.clear();
        }
    }

    /// One sweep: for each channel, claim up to its free slots and rate-limit tokens and start
    /// the deliveries.
    pub async fn dispatch_once(&mut self) -> Result<SweepOutcome, StoreError> {
        let Some(epoch) = self.lease else {
            return Ok(SweepOutcome::NotLeader);
        };
        let email = self.config.smtp_settings(&*self.store).await?;
        self.note_email_settings(email.as_ref());
        self.throttled_until = None;
        let mut started = 0;
        for kind in CHANNELS {
            let channel = match kind {
                NotificationType::Email => ChannelSettings::Email(email.clone()),
                NotificationType::Webhook => ChannelSettings::Webhook(self.webhook.clone()),
            };
            started += self.dispatch_channel(epoch, kind, channel).await?;
        }
        Ok(SweepOutcome::Started(started))
    }

    async fn dispatch_channel(
        &mut self,
        epoch: LeaseEpoch,
        kind: NotificationType,
        channel: ChannelSettings,
    ) -> Result<usize, StoreError> {
        let policy = channel.policy();
        let now = Instant::now();
        let state = &mut self.channels[channel_index(kind)];
        // A changed limit starts a fresh bucket; an unchanged one keeps its tokens.
        match (policy.rate_limit, &state.bucket) {
            (None, _) => state.bucket = None,
            (Some(limit), Some(bucket)) if bucket.limit() == limit => {}
            (Some(limit), _) => state.bucket = Some(TokenBucket::new(limit, now)),
        }
        state.settings = Some(channel);
        let mut started = self.start_queued(kind);
        let state = &mut self.channels[channel_index(kind)];
        let slots = policy.max_concurrent_connections.max(1) as usize;
        let free = slots.saturating_sub(state.in_flight);
        if !state.queue.is_empty() || free == 0 {
            return Ok(started);
        }
        let tokens = state
            .bucket
            .as_mut()
            .map_or(usize::MAX, |b| b.available(now));
        if tokens == 0 {
            // start_queued found nothing to start, so note when a token comes.
            self.note_throttle(kind, now);
            return Ok(started);
        }
        // Claiming ahead halves the claims per delivery and hides their commit latency (in
        // `make bench`, about 1,800 -> 2,400 deliveries/s with four connections). The price: a row
        // claimed but not yet started when this node dies shows an InFlight attempt like one
        // that was under way, so its redelivery is reported as a possible duplicate.
        let want = self
            .settings
            .claim_batch
            .unwrap_or_else(|| (free + 2 * slots).min(tokens));
        let claimed = self
            .store
            .claim_due(
                DISPATCHER_LEASE,
                epoch,
                kind,
                want,
                self.settings.claim_timeout,
            )
            .await?;
        let claimed_at = Instant::now();
        self.channels[channel_index(kind)]
            .queue
            .extend(claimed.into_iter().map(|n| (n, claimed_at)));
        started += self.start_queued(kind);
        Ok(started)
    }

    fn start_all_queued(&mut self) {
        for kind in CHANNELS {
            self.start_queued(kind);
        }
    }

    /// Starts queued rows of one channel while it has a free slot and a rate-limit token, and
    /// only while this node holds the lease.
    fn start_queued(&mut self, kind: NotificationType) -> usize {
        if self.lease.is_none() {
            return 0;
        }
        let index = channel_index(kind);
        let Some(channel) = self.channels[index].settings.clone() else {
            return 0;
        };
        let policy = channel.policy();
        let (retry, _) = policy.retry_policy();
        let slots = policy.max_concurrent_connections.max(1) as usize;
        let timeout = self.attempt_timeout(&channel);
        // A row waiting longer than this could not finish before its claim runs out.
        let stale_after = self.settings.claim_timeout / 2;
        let mut started = 0;
        loop {
            let now = Instant::now();
            let state = &mut self.channels[index];
            if state.in_flight >= slots || state.queue.is_empty() {
                break;
            }
            if let Some(bucket) = state.bucket.as_mut() {
                if bucket.available(now) == 0 {
                    self.note_throttle(kind, now);
                    break;
                }
                bucket.take(1, now);
            }
            let Some((notification, claimed_at)) = state.queue.pop_front() else {
                break;
            };
            if now.duration_since(claimed_at) > stale_after {
                tracing::warn!(
                    id = %notification.id,
                    "claimed row waited too long to start; it is retried after its claim expires"
                );
                continue;
            }
            state.in_flight += 1;
            started += 1;
            let attempt = Attempt {
                store: Arc::clone(&self.store),
                metrics: Arc::clone(&self.metrics),
                delivery: Arc::clone(&self.delivery),
                config: Arc::clone(&self.config),
                channel: channel.clone(),
                retry,
                timeout,
            };
            self.in_flight.spawn(attempt.run(notification));
        }
        started
    }

    /// Remembers when the channel's next rate-limit token arrives, to sweep again then.
    fn note_throttle(&mut self, kind: NotificationType, now: Instant) {
        if let Some(bucket) = self.channels[channel_index(kind)].bucket.as_mut() {
            let ready = tokio::time::Instant::now() + bucket.wait_for_one(now);
            self.throttled_until = Some(self.throttled_until.map_or(ready, |t| t.min(ready)));
        }
    }

    /// An attempt may not outlive its claim, or a successor could deliver it concurrently; and
    /// it is bounded by the channel's own overall timeout.
    fn attempt_timeout(&self, channel: &ChannelSettings) -> Duration {
        let claim_bound = self.settings.claim_timeout / 2;
        match channel {
            ChannelSettings::Email(Some(s)) => s.overall_timeout.min(claim_bound),
            // Every endpoint of a list is posted to within one attempt.
            ChannelSettings::Webhook(s) => s.timeout.saturating_mul(4).min(claim_bound),
            ChannelSettings::Email(None) => claim_bound,
        }
    }

    fn note_email_settings(&mut self, settings: Option<&SmtpSettings>) {
        if self.warned_for.as_ref() == settings {
            return;
        }
        if let Some(s) = settings {
            for warning in s.policy.retry_policy().1 {
                tracing::warn!("SMTP configuration: {warning}");
            }
        }
        self.warned_for = settings.cloned();
    }

    async fn drain(&mut self) {
        if self.in_flight.is_empty() && self.recording.is_empty() {
            return;
        }
        tracing::info!(in_flight = self.in_flight.len(), "draining deliveries");
        let drained = tokio::time::timeout(self.settings.drain_timeout, async {
            while let Some(finished) = self.in_flight.join_next().await {
                if let Ok(Finished { record, .. }) = finished {
                    self.recording
                        .spawn(record_outcome(Arc::clone(&self.store), record));
                }
            }
            while self.recording.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                aborted = self.in_flight.len() + self.recording.len(),
                "drain timeout: aborting deliveries; their rows are retried after the claim timeout"
            );
            self.in_flight.abort_all();
            self.recording.abort_all();
            while self.in_flight.join_next().await.is_some() {}
            while self.recording.join_next().await.is_some() {}
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Writes a finished attempt's outcome, fenced by its claim epoch (see the store).
async fn record_outcome<S: OutboxStore>(store: Arc<S>, record: AttemptRecord) {
    let id = record.id;
    let status = record.transition.status;
    match store.record_outcome(DISPATCHER_LEASE, record).await {
        Ok(true) => tracing::debug!(%id, %status, "attempt recorded"),
        Ok(false) => tracing::warn!(
            %id,
            "attempt outcome not recorded: the claim or lease was lost meanwhile"
        ),
        Err(e) => tracing::error!(
            %id,
            error = %e,
            "cannot record the attempt; the row becomes due again after its claim expires"
        ),
    }
}

/// One delivery attempt of one claimed row, run as its own task.
struct Attempt<S, D> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    delivery: Arc<D>,
    config: Arc<ConfigCache>,
    channel: ChannelSettings,
    retry: RetryPolicy,
    timeout: Duration,
}

impl<S: OutboxStore, D: Deliver> Attempt<S, D> {
    /// Delivers, and returns what to record and which channel's slot it frees.
    async fn run(self, notification: ClaimedNotification) -> Finished {
        let kind = notification.content.kind;
        let started = Instant::now();
        // A panic in an adapter is a bug, but it must cost only this attempt: caught here, it
        // is recorded as a transient failure (retried, then parked like any other), and the
        // task still returns, so its channel slot is freed at once.
        let attempt = AssertUnwindSafe(self.deliver(&notification)).catch_unwind();
        let result = match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(result)) => result,
            Ok(Err(panic)) => {
                let reason = panic_message(panic.as_ref());
                tracing::error!(id = %notification.id, %reason, "a delivery attempt panicked");
                Err(DeliveryError::transient(format!(
                    "the delivery attempt panicked: {reason}"
                )))
            }
            Err(_) => Err(DeliveryError::transient(format!(
                "delivery attempt timed out after {}s",
                self.timeout.as_secs()
            ))),
        };
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
        };
        self.metrics
            .attempt_finished(kind, record.outcome, record.duration);
        Finished { kind, record }
    }

    async fn deliver(&self, n: &ClaimedNotification) -> Result<Delivered, DeliveryError> {
        let list = self
            .config
            .list(&*self.store, &n.content.list_name)
            .await
            .map_err(|e| DeliveryError::transient(format!("cannot resolve the list: {e}")))?
            .ok_or_else(|| {
                DeliveryError::permanent(format!(
                    "unknown notification list {:?}",
                    n.content.list_name.as_str()
                ))
            })?;
        if list.kind() != n.content.kind {
            return Err(DeliveryError::permanent(format!(
                "notification list {:?} is a {} list, not {}",
                list.name.as_str(),
                list.kind(),
                n.content.kind
            )));
        }
        self.delivery.deliver(&self.channel, &list, n).await
    }
}

/// The text a panic was raised with, when it was a string (as `panic!` makes it).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-text panic payload")
}
