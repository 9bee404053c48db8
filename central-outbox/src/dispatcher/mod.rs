//! The dispatcher: while this node holds the `dispatcher` lease, it claims due notifications and
//! delivers each through its channel's adapter, recording every attempt.
//!
//! One loop, woken by whichever comes first: ingest (a new row), a finished delivery (a free
//! slot), a claim answering, the poll interval (retries coming due, rows other replicas
//! ingested), a rate-limit token coming due, or lease renewal. Each wake runs one sweep (under
//! the default [`WakePolicy`]): start queued rows in the free slots, then for each channel with
//! room, claim as many rows as it has free delivery slots and rate-limit tokens, and start one
//! task per row when the claim answers. The loop itself never waits for the database: claims and
//! the SMTP settings read run as tasks (`sweep`), at most one claim per channel at a time, so a
//! slow claim never holds up rows already claimed. A delivery task never fails the loop: its
//! outcome, whatever it is, is recorded on its own row.
//!
//! An attempt frees its slot as soon as the channel has answered, and its outcome is written by
//! a separate task: the write then shares a group commit with the claim of the row that takes
//! the slot, instead of the two waiting for one fsync each in turn. Outcomes are written by at
//! most [`RECORDERS`] tasks at a time, each taking every outcome that finished while the others
//! wrote: one store call per group, not per delivery, which is what a server that spends more
//! on a call than on a row (MS SQL, above all Babelfish) needs to keep up.
//!
//! The lease is kept by `LeaseKeeper`, a task of its own, so renewing it never waits for a
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
//!
//! This module is the loop; its parts live beside it: the lease (`lease`: the keeper and the
//! loop's view of it), channel pacing (`pacing`: slots, rate limits, the queue of claimed rows),
//! a sweep's store calls (`sweep`), one attempt (`attempt`: delivering one row and recording
//! its outcome) and the wake policy ([`WakePolicy`]: when a wake-up sweeps, which is all the
//! timer-only mode changes).

mod attempt;
mod lease;
mod pacing;
mod sweep;
mod wake;

#[cfg(test)]
mod gated_tests;
#[cfg(test)]
mod memory_store;
#[cfg(test)]
mod paused_tests;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config_cache::ConfigCache;
use crate::delivery::{Adapters, ChannelSettings, Deliver};
use crate::domain::NotificationType;
use crate::domain::channel::{SmtpSettings, WebhookSettings};
use crate::metrics::Metrics;
use crate::store::{AttemptRecord, LeaseEpoch, OutboxStore, StoreError};
use attempt::{Attempt, Finished, attempt_timeout, record_outcomes};
use lease::{LeaseKeeper, LeaseSettings, LeaseView, Tenure};
use pacing::{CHANNELS, Pacing};
use sweep::{Answer, SweepCalls};
use wake::{Step, Wake};

pub use lease::DISPATCHER_LEASE;
pub use wake::WakePolicy;

/// Outcome writes under way at most. Two: one can be committing while the next gathers what
/// finished meanwhile, without a dozen small writes competing for the database.
const RECORDERS: usize = 2;

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
    /// Which wake-ups sweep: every event (the default), or the poll timer alone.
    pub wake: WakePolicy,
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
    /// What this node knows of its lease.
    lease: LeaseView,
    pacing: Pacing,
    /// Email settings of the last sweep, to log clamping warnings once per change.
    warned_for: Option<SmtpSettings>,
    /// Deliveries under way: each holds one slot of its channel.
    in_flight: JoinSet<Finished>,
    /// Outcomes of finished deliveries waiting for a recorder; they hold no slot.
    unwritten: Vec<AttemptRecord>,
    /// Outcome writes under way (at most [`RECORDERS`]).
    recording: JoinSet<()>,
    /// The sweeps' settings reads and claims under way (see `sweep`).
    sweep_calls: SweepCalls,
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
        let lease = LeaseView::new(keeper.subscribe(), Arc::clone(&metrics));
        Self {
            store,
            metrics,
            delivery,
            config,
            settings,
            webhook,
            wake,
            keeper: Some(keeper),
            lease,
            pacing: Pacing::default(),
            warned_for: None,
            in_flight: JoinSet::new(),
            unwritten: Vec::new(),
            recording: JoinSet::new(),
            sweep_calls: SweepCalls::default(),
        }
    }

    /// The lease epoch this node holds, `None` while it is not the dispatcher.
    pub fn lease_watch(&self) -> tokio::sync::watch::Receiver<Option<LeaseEpoch>> {
        self.lease.subscribe()
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
        let policy = self.settings.wake;
        loop {
            let lease_deadline = self.lease.deadline();
            let throttled_until = self.pacing.throttled_until();
            let wake = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                // Ahead of the deadline: a renewal published while a sweep held this loop
                // moves the deadline on, and must be seen before the old deadline is judged.
                Some(held) = self.lease.changed() => {
                    let before = self.lease.current();
                    if self.lease.follow(held) == Tenure::Lost {
                        self.abort_in_flight();
                    }
                    // A renewal makes nothing due; a lease taken (or re-taken) may find rows.
                    if self.lease.current() != before {
                        self.pacing.due_may_have_changed();
                    }
                    Wake::Lease
                }
                () = sleep_until(lease_deadline), if lease_deadline.is_some() => {
                    self.lease_expired();
                    continue;
                }
                Some(_) = self.recording.join_next(), if !self.recording.is_empty() => {
                    self.write_outcomes();
                    continue;
                }
                answer = self.sweep_calls.next(), if !self.sweep_calls.is_empty() => {
                    let claim = matches!(answer, Answer::Claimed { .. });
                    match self.answered(answer) {
                        Ok(_) if claim => Wake::Claimed,
                        Ok(_) => continue,
                        Err(e) => {
                            tracing::error!(error = %e, "dispatch sweep failed");
                            continue;
                        }
                    }
                }
                Some(finished) = self.in_flight.join_next(), if !self.in_flight.is_empty() => {
                    self.finished(finished);
                    // Collect every other finished task too, so one sweep fills all free slots.
                    while let Some(finished) = self.in_flight.try_join_next() {
                        self.finished(finished);
                    }
                    Wake::Finished
                }
                () = self.wake.notified(), if policy.hears_ingest() => Wake::Ingest,
                () = sleep_until(throttled_until), if throttled_until.is_some() => Wake::Throttle,
                _ = poll.tick() => Wake::Poll,
            };
            match policy.step(wake) {
                Step::Sweep => {
                    if matches!(wake, Wake::Ingest | Wake::Poll) {
                        self.pacing.due_may_have_changed();
                    }
                    self.sweep();
                }
                Step::StartQueued => {
                    self.start_all_queued();
                }
                Step::Nothing => {}
            }
        }
        self.drain().await;
        keeper_stop.cancel();
        if let Some(keeper) = keeper
            && let Err(e) = keeper.await
        {
            tracing::error!(error = %e, "the lease keeper failed");
        }
        self.lease.set(None);
    }

    /// Frees the slot of a finished delivery and starts recording its outcome.
    fn finished(&mut self, finished: Result<Finished, tokio::task::JoinError>) {
        match finished {
            Ok(Finished { kind, record }) => {
                self.pacing.finished(kind);
                self.unwritten.push(record);
                self.write_outcomes();
            }
            // Aborted when another node took the lease (the counts were reset then). A panic in
            // the adapter is caught inside the task (`Attempt::run`); one anywhere else loses
            // the channel it ran on, so recount once the set is empty.
            Err(e) => {
                if e.is_panic() {
                    tracing::error!(error = %e, "a delivery task panicked outside its attempt");
                }
                if self.in_flight.is_empty() {
                    self.pacing.free_all_slots();
                }
            }
        }
    }

    /// Starts writing the waiting outcomes, all in one call, if a recorder is free.
    fn write_outcomes(&mut self) {
        if self.unwritten.is_empty() || self.recording.len() >= RECORDERS {
            return;
        }
        let records = std::mem::take(&mut self.unwritten);
        self.recording
            .spawn(record_outcomes(Arc::clone(&self.store), records));
    }

    /// The lease ran out without a successful renewal: stop claiming and starting. Rows claimed
    /// but not started stay queued, and deliveries under way go on: if this node renews before
    /// another takes the lease, it keeps its epoch and carries on with them (a queued row that
    /// has waited too long is still given back, see `Pacing::start_next`); if another node
    /// takes it, they are dropped then. See the module documentation.
    fn lease_expired(&mut self) {
        tracing::warn!(
            in_flight = self.in_flight.len(),
            "dispatcher lease expired without renewal; no new claims until it is renewed"
        );
        self.lease.expired();
    }

    /// Aborts every delivery under way and drops outcomes not yet written.
    fn abort_in_flight(&mut self) {
        if !self.in_flight.is_empty() || !self.recording.is_empty() || !self.unwritten.is_empty() {
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
        self.unwritten.clear();
        // Claimed but never started: due again when their claims expire.
        self.pacing.drop_all();
    }

    /// One sweep, as after a wake-up that may have made rows due: for each channel, claim up to
    /// its free slots and rate-limit tokens and start the deliveries. Unlike the loop, this
    /// waits for the sweep's store calls (stepping the dispatcher by hand).
    pub async fn dispatch_once(&mut self) -> Result<SweepOutcome, StoreError> {
        self.pacing.due_may_have_changed();
        if self.lease.current().is_none() {
            return Ok(SweepOutcome::NotLeader);
        }
        let mut started = self.sweep();
        while !self.sweep_calls.is_empty() {
            let answer = self.sweep_calls.next().await;
            started += self.answered(answer)?;
        }
        Ok(SweepOutcome::Started(started))
    }

    /// One sweep: starts what is queued, then claims for each channel that has room (a channel
    /// whose last claim came back short claims nothing, see `Pacing`). The claims are sent, not
    /// awaited; with no fresh copy of the SMTP settings, they wait for a settings read, sent
    /// here too. Returns the deliveries started now.
    fn sweep(&mut self) -> usize {
        let Some(epoch) = self.lease.current() else {
            return 0;
        };
        let started = self.start_all_queued();
        if self.sweep_calls.reading_settings() {
            return started;
        }
        match self.config.fresh_smtp_settings() {
            Some(email) => started + self.claim_for_each_channel(epoch, Some(email)),
            None => {
                self.sweep_calls
                    .read_settings(Arc::clone(&self.config), Arc::clone(&self.store));
                started
            }
        }
    }

    /// Takes what a sweep's store call answered; returns the deliveries started. A claim's rows
    /// are queued and started (dropped if another node held the lease since they were
    /// claimed); settings go on to the claims they were read for.
    fn answered(&mut self, answer: Answer) -> Result<usize, StoreError> {
        match answer {
            Answer::Settings(email) => {
                let email = (*email)?;
                Ok(match self.lease.current() {
                    Some(epoch) => self.claim_for_each_channel(epoch, email),
                    None => 0,
                })
            }
            Answer::Claimed {
                kind,
                wanted,
                epoch,
                rows,
            } => {
                let (rows, failed) = match rows {
                    Ok(rows) => (Some(rows), None),
                    Err(e) => (None, Some(e)),
                };
                let rows = rows.filter(|_| self.lease.tenure() == Some(epoch));
                self.pacing.claim_answered(kind, wanted, rows);
                let started = self.start_queued(kind);
                match failed {
                    Some(e) => Err(e),
                    None => Ok(started),
                }
            }
        }
    }

    /// For each channel: takes the settings `email` (the email channel's) and the configured
    /// webhook settings, starts what is queued and sends a claim if the channel has room.
    fn claim_for_each_channel(&mut self, epoch: LeaseEpoch, email: Option<SmtpSettings>) -> usize {
        self.note_email_settings(email.as_ref());
        self.pacing.sweep_begins();
        let mut started = 0;
        for kind in CHANNELS {
            let channel = match kind {
                NotificationType::Email => ChannelSettings::Email(email.clone()),
                NotificationType::Webhook => ChannelSettings::Webhook(self.webhook.clone()),
            };
            self.pacing.set_settings(kind, channel);
            started += self.start_queued(kind);
            let wanted = self.pacing.claim_size(kind, self.settings.claim_batch);
            if wanted > 0 {
                let lanes = self.pacing.claim_sent(kind, wanted);
                self.sweep_calls.claim(
                    Arc::clone(&self.store),
                    kind,
                    lanes,
                    epoch,
                    self.settings.claim_timeout,
                );
            }
        }
        started
    }

    fn start_all_queued(&mut self) -> usize {
        CHANNELS
            .into_iter()
            .map(|kind| self.start_queued(kind))
            .sum()
    }

    /// Starts queued rows of one channel while it has a free slot and a rate-limit token, and
    /// only while this node holds the lease.
    fn start_queued(&mut self, kind: NotificationType) -> usize {
        if self.lease.current().is_none() {
            return 0;
        }
        let Some(channel) = self.pacing.settings(kind).cloned() else {
            return 0;
        };
        let (retry, _) = channel.policy().retry_policy();
        let timeout = attempt_timeout(self.settings.claim_timeout, &channel);
        // A row waiting longer than this could not finish before its claim runs out.
        let stale_after = self.settings.claim_timeout / 2;
        let mut started = 0;
        while let Some(notification) = self.pacing.start_next(kind, stale_after) {
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
        if self.in_flight.is_empty()
            && self.recording.is_empty()
            && self.unwritten.is_empty()
            && self.sweep_calls.is_empty()
        {
            return;
        }
        tracing::info!(in_flight = self.in_flight.len(), "draining deliveries");
        let drained = tokio::time::timeout(self.settings.drain_timeout, async {
            // Claims under way finish before the lease is released; their rows are not started
            // and are due again when their claims expire, like rows still queued.
            while !self.sweep_calls.is_empty() {
                self.sweep_calls.next().await;
            }
            while let Some(finished) = self.in_flight.join_next().await {
                if let Ok(Finished { record, .. }) = finished {
                    self.unwritten.push(record);
                    self.write_outcomes();
                }
            }
            loop {
                self.write_outcomes();
                if self.recording.join_next().await.is_none() {
                    break;
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                aborted = self.in_flight.len() + self.recording.len() + self.unwritten.len(),
                "drain timeout: aborting deliveries; their rows are retried after the claim timeout"
            );
            self.in_flight.abort_all();
            self.recording.abort_all();
            self.unwritten.clear();
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
