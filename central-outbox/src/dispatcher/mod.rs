//! The dispatcher: while this node holds the `dispatcher` lease, it claims due notifications and
//! delivers each through its channel's adapter, recording every attempt.
//!
//! Its parts, each with one job:
//! - the lease keeper (`lease`), a task of its own, so renewing never waits for dispatch work;
//! - this module's loop, which follows the keeper and publishes a [`Mandate`](lease::Mandate)
//!   (the epoch this node may claim under now, and the epoch its work belongs to with that
//!   epoch's cancellation token), and turns ingest and the poll timer into "rows may be due";
//! - one loop per channel (`channel`): its slots, rate limit, queue of rows claimed ahead and
//!   its claims, in the order of `domain::serve_order`;
//! - one attempt per row (`attempt`), run as a task holding a slot;
//! - the recorder (`recorder`), one task writing every outcome, in groups.
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
//! It needs the store's dispatch capability only ([`DispatchStore`]): leases, claims, outcomes
//! and the channel settings it reads. `Dispatcher::dispatch_once` (compiled for tests only) is
//! the deterministic step for tests: one turn of every channel, waiting for the store calls it
//! makes.

mod attempt;
mod channel;
mod claim_ahead;
mod digest;
mod lease;
mod recorder;

#[cfg(test)]
mod gated_tests;
#[cfg(test)]
mod paused_tests;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::config_cache::ConfigCache;
use crate::delivery::{Adapters, Deliver};
use crate::domain::NotificationType;
use crate::metrics::Metrics;
use crate::records::{AttemptRecord, LeaseEpoch};
use crate::store::DispatchStore;
use channel::{ChannelLoop, ChannelParts};
use lease::{EpochScope, LeaseKeeper, LeaseSettings, LeaseView, Mandate, Tenure};

pub use lease::DISPATCHER_LEASE;

/// The channels, each with a loop of its own.
const CHANNELS: [NotificationType; 2] = [NotificationType::Email, NotificationType::Webhook];

/// Timing of the dispatcher. Defaults documented in `deploy/central-outbox.toml`.
#[derive(Debug, Clone)]
pub struct DispatcherSettings {
    /// Identifies this node as lease holder; unique per process.
    pub node_id: String,
    /// Longest a due row waits when nothing wakes the dispatcher (retries coming due, rows
    /// another replica ingested).
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
}

/// What one `Dispatcher::dispatch_once` did.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepOutcome {
    /// This node does not hold the lease.
    NotLeader,
    /// Claimed and started this many deliveries (0: nothing was due, or no slot or token free).
    Started(usize),
}

/// The dispatcher of one node, delivering through `D` (the real adapters, or a test's).
pub struct Dispatcher<S, D = Adapters> {
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
    channels: Vec<ChannelLoop<S, D>>,
    /// The recorder's inbox, and its task (spawned at the first use).
    recorder: Option<(mpsc::Sender<AttemptRecord>, JoinHandle<()>)>,
    metrics: Arc<Metrics>,
    delivery: Arc<D>,
    config: Arc<ConfigCache>,
}

impl<S: DispatchStore, D: Deliver> Dispatcher<S, D> {
    pub fn new(
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
        Self {
            store,
            settings,
            ingest,
            keeper: Some(keeper),
            lease,
            mandate: watch::Sender::new(Mandate::default()),
            due: watch::Sender::new(0),
            all_work: CancellationToken::new(),
            channels: Vec::new(),
            recorder: None,
            metrics,
            delivery,
            config,
        }
    }

    /// The lease epoch this node holds, `None` while it is not the dispatcher.
    pub fn lease_watch(&self) -> watch::Receiver<Option<LeaseEpoch>> {
        self.lease.subscribe()
    }

    /// Runs until `shutdown` is cancelled, then drains and releases the lease.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let keeper_stop = CancellationToken::new();
        let keeper = self
            .keeper
            .take()
            .map(|keeper| tokio::spawn(keeper.run(keeper_stop.clone())));
        let channels_stop = CancellationToken::new();
        let mut channels = JoinSet::new();
        self.ensure_channels();
        for channel in std::mem::take(&mut self.channels) {
            channels.spawn(channel.run(
                self.mandate.subscribe(),
                self.due.subscribe(),
                channels_stop.clone(),
            ));
        }
        let mut poll = tokio::time::interval(self.settings.poll_interval);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let lease_deadline = self.lease.deadline();
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
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
        if let Some(keeper) = keeper
            && let Err(e) = keeper.await
        {
            tracing::error!(error = %e, "the lease keeper failed");
        }
        self.lease.set(None);
    }

    /// Stops the channel loops (they finish the deliveries under way), then lets the recorder
    /// write what they returned; all within `drain_timeout`, after which what is left is
    /// cancelled and due again when its claims expire.
    async fn drain(&mut self, mut channels: JoinSet<()>, stop: CancellationToken) {
        stop.cancel();
        let recorder = self.recorder.take();
        let drained = tokio::time::timeout(self.settings.drain_timeout, async {
            while channels.join_next().await.is_some() {}
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
            channels.abort_all();
            while channels.join_next().await.is_some() {}
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

    /// Builds the channel loops (and starts the recorder they send to) on first use.
    fn ensure_channels(&mut self) {
        if !self.channels.is_empty() {
            return;
        }
        let recorder = self
            .recorder
            .get_or_insert_with(|| {
                recorder::start(
                    Arc::clone(&self.store),
                    Arc::clone(&self.metrics),
                    self.settings.claim_timeout,
                )
            })
            .0
            .clone();
        self.channels = CHANNELS
            .into_iter()
            .map(|kind| {
                ChannelLoop::new(ChannelParts {
                    kind,
                    store: Arc::clone(&self.store),
                    metrics: Arc::clone(&self.metrics),
                    delivery: Arc::clone(&self.delivery),
                    config: Arc::clone(&self.config),
                    claim_timeout: self.settings.claim_timeout,
                    claim_batch: self.settings.claim_batch,
                    recorder: recorder.clone(),
                })
            })
            .collect();
    }

    /// One turn of every channel, as after a wake-up that may have made rows due: claim up to
    /// the free slots and rate-limit tokens and start the deliveries. Unlike the loop, this
    /// waits for the store calls it makes (stepping the dispatcher by hand). Only the crate's
    /// paused-clock and gated tests step it so; the service runs the loop.
    #[cfg(test)]
    pub async fn dispatch_once(&mut self) -> Result<SweepOutcome, crate::store::StoreError> {
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
