//! The dispatcher: while this node holds the `dispatcher` lease, it claims due notifications and
//! delivers each through its channel's adapter, recording every attempt.
//!
//! Its parts, each with one job:
//! - the lease keeper (`lease`), a task of its own, so renewing never waits for dispatch work;
//! - this module's loop, which follows the keeper and publishes a [`Mandate`](lease::Mandate)
//!   (the epoch this node may claim under now, and the epoch its work belongs to with that
//!   epoch's cancellation token), and turns ingest and the poll timer into "rows may be due";
//! - one loop per channel (`channel`): its slots, rate limit, queue of rows claimed ahead and
//!   its claims, in the order of `domain::serve_order`, and its wake-up when the next waiting
//!   row comes due; whether it claims, and how many rows,
//!   is the pure `claim_decision`, how deep it claims ahead `claim_ahead`;
//! - one attempt per row (`attempt`), run as a task holding a slot;
//! - the recorder (`recorder`), one task writing every outcome, in groups; the channel loops
//!   hold its handle, which also says how many outcomes wait for a write.
//!
//! The lease rules. A node claims and starts rows only under a lease still valid. When the
//! lease lapses (no renewal succeeded for its TTL) it stops claiming and starting, but keeps
//! what it claimed and lets deliveries under way finish: each is bounded to half the claim
//! timeout, so no successor can have claimed its row meanwhile, and its outcome is recorded if
//! no other node has taken the lease since (the store's fence). A node that re-takes its own
//! lapsed lease keeps its epoch, so those outcomes stand and its queued rows start. When
//! another node takes the lease, the old epoch's token is cancelled: deliveries under way stop
//! and queued rows are dropped (their outcomes would be refused; the successor redelivers).
//! On shutdown no new claims are made, deliveries under way get `drain_timeout` while the
//! keeper goes on renewing, the recorder writes what they return, and then the lease is
//! released so a successor takes over at once; rows still claimed become due again when their
//! claims expire.
//!
//! The keeper, the channel loops and the recorder run supervised (`task_supervisor`): one
//! that ends or panics is restarted from the same parts; one that keeps failing takes the node
//! out (this loop drains and releases the lease as at shutdown, and the service stops).
//!
//! It needs the store's dispatch capability only ([`DispatchStore`]): leases, claims, outcomes
//! and the channel settings it reads. `Dispatcher::dispatch_once` (compiled for tests only) is
//! the deterministic step for tests: one turn of every channel, waiting for the store calls it
//! makes.

mod attempt;
mod caught;
mod channel;
mod claim_ahead;
mod claim_decision;
mod digest;
mod lease;
mod list_failover;
mod provider;
mod recorder;

#[cfg(test)]
mod gated_tests;
#[cfg(test)]
mod paused_tests;
#[cfg(test)]
mod wake_tests;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config_cache::ConfigCache;
use crate::delivery::{Adapters, Deliver};
use crate::domain::NotificationType;
use crate::metrics::Metrics;
use crate::on_fallback::FailoverBoard;
use crate::records::LeaseEpoch;
use crate::store::DispatchStore;
use channel::{ChannelLoop, ChannelParts};
use lease::{EpochScope, LeaseKeeper, LeaseSettings, LeaseView, Mandate, Tenure};
use task_supervisor::{FaultPlan, NodeFailure, Supervisor};

pub use lease::DISPATCHER_LEASE;

/// The channels, each with a loop of its own.
const CHANNELS: [NotificationType; 2] = [NotificationType::Email, NotificationType::Webhook];

/// Timing of the dispatcher. Defaults documented in `deploy/central-outbox.toml`.
#[derive(Debug, Clone)]
pub struct DispatcherSettings {
    /// Identifies this node as lease holder; unique per process.
    pub node_id: String,
    /// Longest a due row waits when nothing wakes the dispatcher: rows another replica
    /// ingested, a claim that ran out. Scheduled rows and retries coming due need no poll: after
    /// every claim that takes all due rows, each channel wakes when the next waiting row comes
    /// due (`channel`).
    pub poll_interval: Duration,
    /// How long a lease lasts without renewal.
    pub lease_ttl: Duration,
    /// How often the lease is renewed (well under `lease_ttl`).
    pub renew_interval: Duration,
    /// How long a claimed row stays claimed; after it the row is due again (at-least-once).
    pub claim_timeout: Duration,
    /// How long in-flight deliveries may run after shutdown begins.
    pub drain_timeout: Duration,
    /// Rows claimed per claim and channel. `None` (the default): the free delivery slots, two
    /// rows per connection and the rows the connections start during one claim's latency, less
    /// what is queued (never more than the rate limit allows), so that while a backlog drains,
    /// a slot that frees up starts its next row from the local queue instead of waiting for a
    /// claim to commit. `Some(n)`: up to n. Either way a channel claims again once its queue is
    /// down to what it starts during a claim (`claim_ahead`), and queued rows start as slots
    /// free up.
    pub claim_batch: Option<usize>,
    /// When a channel moves to its next provider and probes its first (`domain::failover`).
    pub failover: crate::domain::failover::FailoverPolicy,
}

/// What one `Dispatcher::dispatch_once` did.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SweepOutcome {
    /// This node does not hold the lease.
    NotLeader,
    /// Claimed and started this many deliveries (0: nothing was due, or no slot or token free).
    Started(usize),
}

/// The dispatcher of one node, delivering through `D` (the real adapters, or a test's).
pub(crate) struct Dispatcher<S, D = Adapters> {
    store: Arc<S>,
    settings: DispatcherSettings,
    /// What ingest on this node notifies.
    ingest: Arc<Notify>,
    /// Keeps the lease; taken and spawned by `run`.
    keeper: Option<LeaseKeeper<S>>,
    /// What this node knows of its lease.
    lease: LeaseView,
    /// Published to the channel loops.
    mandate: watch::Sender<Mandate>,
    /// Ticks whenever rows may have become due.
    due: watch::Sender<u64>,
    /// Parent of every epoch's token; cancelled when a drain runs out of time.
    all_work: CancellationToken,
    /// The channel loops stepped by hand (`dispatch_once`); the service's run as tasks.
    #[cfg(test)]
    channels: Vec<ChannelLoop<S, D>>,
    /// Where the channel loops send finished attempts, and the recorder's task (started at
    /// the first use, supervised).
    recorder: Option<(recorder::RecorderHandle, JoinHandle<()>)>,
    /// Cancelled when the recorder may end (the drain): it ends once every record is written.
    recorder_stop: CancellationToken,
    /// Each notified after each write of outcomes that changed a row (the site status feed
    /// and the status callbacks wake on them: `crate::status_feed`, `crate::status_callbacks`).
    recorded: Arc<[Arc<Notify>]>,
    /// Restarts the keeper, the channel loops and the recorder when they fail; see
    /// `task_supervisor`.
    supervisor: Supervisor,
    metrics: Arc<Metrics>,
    delivery: Arc<D>,
    config: Arc<ConfigCache>,
    /// What this node delivers through fallback providers (`crate::on_fallback`).
    board: Arc<FailoverBoard>,
}

impl<S: DispatchStore, D: Deliver> Dispatcher<S, D> {
    pub(crate) fn new(
        store: Arc<S>,
        metrics: Arc<Metrics>,
        delivery: Arc<D>,
        config: Arc<ConfigCache>,
        settings: DispatcherSettings,
        ingest: Arc<Notify>,
    ) -> Self {
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
        let board = Arc::new(FailoverBoard::default());
        board.follow_lease(lease.subscribe());
        Self {
            store,
            settings,
            ingest,
            keeper: Some(keeper),
            lease,
            mandate: watch::Sender::new(Mandate::default()),
            due: watch::Sender::new(0),
            all_work: CancellationToken::new(),
            #[cfg(test)]
            channels: Vec::new(),
            recorder: None,
            recorder_stop: CancellationToken::new(),
            recorded: Arc::from([]),
            supervisor: Supervisor::new(
                metrics.supervision(),
                NodeFailure::default(),
                FaultPlan::default(),
            ),
            metrics,
            delivery,
            config,
            board,
        }
    }

    /// Supervises the dispatcher's tasks with `supervisor` (the service's, so that a task
    /// given up on takes the whole node out) instead of one of its own.
    pub(crate) fn with_supervisor(mut self, supervisor: Supervisor) -> Self {
        self.supervisor = supervisor;
        self
    }

    /// Notifies each of `recorded` after each write of outcomes that changed a row.
    pub(crate) fn with_outcomes_recorded(mut self, recorded: Vec<Arc<Notify>>) -> Self {
        self.recorded = Arc::from(recorded);
        self
    }

    /// What this node delivers through fallback providers now (GetKpis, the console).
    pub(crate) fn on_fallback(&self) -> Arc<FailoverBoard> {
        Arc::clone(&self.board)
    }

    /// The lease epoch this node holds, `None` while it is not the dispatcher.
    pub(crate) fn lease_watch(&self) -> watch::Receiver<Option<LeaseEpoch>> {
        self.lease.subscribe()
    }

    /// Runs until `shutdown` is cancelled, then drains and releases the lease. The keeper,
    /// the channel loops and the recorder run supervised: one that fails is restarted, and
    /// one that keeps failing fires the supervisor's [`NodeFailure`], on which this loop stops
    /// as on shutdown (drain, release the lease) so another replica takes over at once.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let keeper_stop = CancellationToken::new();
        let keeper = self.keeper.take().map(|keeper| {
            let handle = self.supervisor.spawn("lease", keeper_stop.clone(), {
                let keeper = keeper.clone();
                let stop = keeper_stop.clone();
                move || keeper.clone().run(stop.clone())
            });
            (keeper, handle)
        });
        let channels_stop = CancellationToken::new();
        let mut channels = Vec::new();
        for parts in self.channel_parts() {
            let name = match parts.kind {
                NotificationType::Email => "channel.email",
                NotificationType::Webhook => "channel.webhook",
            };
            let (mandate, due, stop) = (
                self.mandate.subscribe(),
                self.due.subscribe(),
                channels_stop.clone(),
            );
            channels.push(self.supervisor.spawn(name, channels_stop.clone(), move || {
                ChannelLoop::new(parts.clone()).run(mandate.clone(), due.clone(), stop.clone())
            }));
        }
        let failure = self.supervisor.failure().clone();
        let mut poll = tokio::time::interval(self.settings.poll_interval);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let lease_deadline = self.lease.deadline();
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                () = failure.failed() => {
                    tracing::error!(
                        task = failure.task().unwrap_or("?"),
                        "a dispatcher task was given up on: draining and releasing the lease"
                    );
                    break;
                }
                // Ahead of the deadline: a renewal published while this loop was busy moves the
                // deadline on, and must be seen before the old deadline is judged.
                Some(held) = self.lease.changed() => {
                    let tenure = self.lease.follow(held);
                    self.publish(tenure);
                }
                () = sleep_until(lease_deadline), if lease_deadline.is_some() => {
                    tracing::warn!("dispatcher lease expired without renewal; no new claims until it is renewed");
                    self.lease.expired();
                    self.publish(Tenure::Kept);
                }
                () = self.ingest.notified() => self.rows_may_be_due(),
                _ = poll.tick() => self.rows_may_be_due(),
            }
        }
        self.drain(channels, channels_stop).await;
        keeper_stop.cancel();
        if let Some((keeper, handle)) = keeper {
            if let Err(e) = handle.await {
                tracing::error!(error = %e, "the lease keeper's supervisor failed");
            }
            // The keeper releases the lease when it stops; one given up on could not.
            keeper.release().await;
        }
        self.lease.set(None);
    }

    /// Stops the channel loops (they finish the deliveries under way), then lets the recorder
    /// write what they returned; all within `drain_timeout`, after which what is left is
    /// cancelled and due again when its claims expire.
    async fn drain(&mut self, mut channels: Vec<JoinHandle<()>>, stop: CancellationToken) {
        stop.cancel();
        let recorder = self.recorder.take();
        self.recorder_stop.cancel();
        let drained = tokio::time::timeout(self.settings.drain_timeout, async {
            for channel in &mut channels {
                let _ = channel.await;
            }
            if let Some((inbox, task)) = recorder {
                // The channel loops hold the other senders and are gone now: the recorder
                // ends once it has written what is queued.
                drop(inbox);
                let _ = task.await;
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                "drain timeout: aborting deliveries; their rows are retried after the claim timeout"
            );
            self.all_work.cancel();
            // Only the loops still running: a finished loop's handle may already have been
            // awaited above, and a `JoinHandle` awaited again after it answered panics.
            for channel in channels.into_iter().filter(|c| !c.is_finished()) {
                channel.abort();
                let _ = channel.await;
            }
        }
    }

    /// Rows may have become due (a row ingested here, the poll timer): every channel claims
    /// again at its next turn.
    fn rows_may_be_due(&self) {
        self.due.send_modify(|tick| *tick = tick.wrapping_add(1));
    }

    /// Publishes what this node may do now. Work of an epoch another node has held since is
    /// cancelled through its token, and the next epoch's work gets a token of its own.
    fn publish(&mut self, tenure: Tenure) {
        let now = self.lease.current();
        let epoch = self.lease.tenure();
        self.mandate.send_modify(|mandate| {
            if tenure == Tenure::Lost
                && let Some(old) = mandate.scope.take()
            {
                tracing::warn!(
                    epoch = old.epoch.0,
                    "another node holds the dispatcher lease; cancelling in-flight deliveries"
                );
                old.token.cancel();
            }
            if mandate.tenure() != epoch {
                mandate.scope = epoch.map(|epoch| EpochScope {
                    epoch,
                    token: self.all_work.child_token(),
                });
            }
            mandate.now = now;
        });
    }

    /// What each channel loop is built from (a restarted loop is built from the same parts),
    /// starting the recorder they send to on first use.
    fn channel_parts(&mut self) -> Vec<ChannelParts<S, D>> {
        let recorder = match &self.recorder {
            Some((sender, _)) => sender.clone(),
            None => {
                let (sender, inbox) = recorder::channel();
                let (store, metrics) = (Arc::clone(&self.store), Arc::clone(&self.metrics));
                let claim_timeout = self.settings.claim_timeout;
                let recorded = Arc::clone(&self.recorded);
                let task =
                    self.supervisor
                        .spawn("recorder", self.recorder_stop.clone(), move || {
                            recorder::run(
                                Arc::clone(&store),
                                Arc::clone(&metrics),
                                claim_timeout,
                                Arc::clone(&inbox),
                                Arc::clone(&recorded),
                            )
                        });
                self.recorder = Some((sender.clone(), task));
                sender
            }
        };
        CHANNELS
            .into_iter()
            .map(|kind| ChannelParts {
                kind,
                store: Arc::clone(&self.store),
                metrics: Arc::clone(&self.metrics),
                delivery: Arc::clone(&self.delivery),
                config: Arc::clone(&self.config),
                claim_timeout: self.settings.claim_timeout,
                claim_batch: self.settings.claim_batch,
                failover: self.settings.failover,
                board: Arc::clone(&self.board),
                recorder: recorder.clone(),
            })
            .collect()
    }

    /// Builds the channel loops on first use, for stepping them by hand (`dispatch_once`).
    #[cfg(test)]
    fn ensure_channels(&mut self) {
        if self.channels.is_empty() {
            self.channels = self
                .channel_parts()
                .into_iter()
                .map(ChannelLoop::new)
                .collect();
        }
    }

    /// One turn of every channel, as after a wake-up that may have made rows due: claim up to
    /// the free slots and rate-limit tokens and start the deliveries. Unlike the loop, this
    /// waits for the store calls it makes (stepping the dispatcher by hand). Only the crate's
    /// paused-clock and gated tests step it so; the service runs the loop.
    #[cfg(test)]
    pub(crate) async fn dispatch_once(&mut self) -> Result<SweepOutcome, crate::store::StoreError> {
        self.publish(Tenure::Kept);
        let mandate = self.mandate.borrow().clone();
        if mandate.now.is_none() {
            return Ok(SweepOutcome::NotLeader);
        }
        self.ensure_channels();
        let mut started = 0;
        let mut failed = None;
        for channel in &mut self.channels {
            match channel.sweep_once(&mandate).await {
                Ok(n) => started += n,
                Err(e) => failed = Some(e),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(SweepOutcome::Started(started)),
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
