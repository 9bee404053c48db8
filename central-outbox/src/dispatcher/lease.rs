//! The dispatcher lease: kept by a task of its own, [`LeaseKeeper`] (take it, renew it every
//! `renew_interval`, publish what is held, release it when told to stop), and followed by the
//! dispatch loop through [`LeaseView`] (claim only under a lease still valid, drop work claimed
//! under an epoch another node has held since).
//!
//! Renewal must never wait behind the dispatcher's own work: a sweep blocked on a slow claim, a
//! burst of ingest or a long purge used to delay it past the TTL, and the node then lost its
//! own lease, cancelled mails the relay had already taken and sent them again. So the keeper is
//! not part of the dispatch loop, and the store serves lease calls ahead of bulk work (a
//! connection of their own on MS SQL, the writer's priority lane on SQLite). The keeper never
//! cancels a renewal itself: each is bounded by the store's own timeouts (MS SQL: connect and
//! command timeouts), and a renewal cancelled mid-request costs its connection, so the next one
//! pays for a new login and statement compilation. On a loaded Babelfish that took longer than
//! the TTL every time, and the node never held its lease again. A renewal that answers late is
//! simply worth less: its lease is valid from when it was sent.
//!
//! What is published, [`HeldLease`], carries the instant until which this node may act under
//! the epoch: measured from *before* the renewal was sent, so the database's expiry is at least
//! that late. Consumers (the dispatcher, the purge) stop claiming when it passes, whatever the
//! keeper is doing. The keeper keeps renewing until stopped, including while the dispatcher
//! drains at shutdown, so outcomes that arrive during the drain are still recorded.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::records::LeaseEpoch;
use crate::store::DispatchStore;

/// Name of the lease whose holder dispatches.
pub const DISPATCHER_LEASE: &str = "dispatcher";

/// The lease as this node holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HeldLease {
    pub epoch: LeaseEpoch,
    /// Until when this node may act under `epoch` if no renewal succeeds meanwhile.
    pub valid_until: Instant,
}

impl HeldLease {
    /// Whether the lease may still be acted under.
    pub(super) fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }
}

/// How the lease is kept. Defaults are documented in `deploy/central-outbox.toml`.
#[derive(Debug, Clone)]
pub(super) struct LeaseSettings {
    /// Identifies this node as lease holder; unique per process.
    pub node_id: String,
    /// How long a lease lasts without renewal.
    pub ttl: Duration,
    /// How often the lease is renewed (at most half of `ttl`).
    pub renew_interval: Duration,
}

/// Takes and renews the dispatcher lease until stopped; see the module documentation. Clones
/// share what is held, so a keeper restarted by the supervisor renews the same lease, and the
/// dispatcher can release it even after its keeper was given up on.
pub(super) struct LeaseKeeper<S> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    settings: LeaseSettings,
    held: Arc<watch::Sender<Option<HeldLease>>>,
}

impl<S> Clone for LeaseKeeper<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            metrics: Arc::clone(&self.metrics),
            settings: self.settings.clone(),
            held: Arc::clone(&self.held),
        }
    }
}

impl<S: DispatchStore> LeaseKeeper<S> {
    pub(super) fn new(store: Arc<S>, metrics: Arc<Metrics>, settings: LeaseSettings) -> Self {
        Self {
            store,
            metrics,
            settings,
            held: Arc::new(watch::Sender::new(None)),
        }
    }

    /// What this node holds, updated after every renewal.
    pub(super) fn subscribe(&self) -> watch::Receiver<Option<HeldLease>> {
        self.held.subscribe()
    }

    /// Renews every `renew_interval` (the first at once) until `stop`, then releases the lease
    /// so a successor need not wait for it to expire.
    pub(super) async fn run(self, stop: CancellationToken) {
        let mut renew = tokio::time::interval(self.settings.renew_interval);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                _ = renew.tick() => {}
            }
            // Shutdown does not wait for a slow renewal: the lease is released right after.
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = self.renew() => {}
            }
        }
        self.release().await;
    }

    /// One renewal (or first take), published. A failure leaves what is held as it was: it
    /// stays valid until its `valid_until`, and the next tick tries again.
    async fn renew(&self) {
        let sent_at = Instant::now();
        let answer = self
            .store
            .acquire_lease(DISPATCHER_LEASE, &self.settings.node_id, self.settings.ttl)
            .await;
        let took = sent_at.elapsed();
        let previous = *self.held.borrow();
        let now = match answer {
            Ok(Some(epoch)) => Some(HeldLease {
                epoch,
                valid_until: sent_at + self.settings.ttl,
            }),
            Ok(None) => None,
            Err(e) => {
                self.metrics.lease_renewed(took, true);
                tracing::error!(error = %e, "cannot renew the dispatcher lease");
                return;
            }
        };
        self.metrics.lease_renewed(took, false);
        if took > self.settings.ttl / 3 {
            tracing::warn!(?took, ttl = ?self.settings.ttl, "dispatcher lease renewal was slow");
        }
        match (previous.map(|h| h.epoch), now.map(|h| h.epoch)) {
            (None, Some(epoch)) => tracing::info!(epoch = epoch.0, "became the dispatcher"),
            (Some(old), Some(new)) if old != new => tracing::warn!(
                old = old.0,
                new = new.0,
                "dispatcher lease re-taken with a new epoch"
            ),
            (Some(old), None) => {
                tracing::warn!(epoch = old.0, "lost the dispatcher lease to another node");
            }
            _ => {}
        }
        self.held.send_replace(now);
    }

    /// Gives the lease up if this node holds it (a no-op otherwise, so calling it twice is
    /// harmless).
    pub(super) async fn release(&self) {
        let Some(held) = self.held.send_replace(None) else {
            return;
        };
        let released = tokio::time::timeout(
            self.settings.ttl,
            self.store
                .release_lease(DISPATCHER_LEASE, &self.settings.node_id, held.epoch),
        )
        .await;
        match released {
            Ok(Ok(true)) => tracing::info!(epoch = held.epoch.0, "released the dispatcher lease"),
            Ok(Ok(false)) => tracing::debug!("the dispatcher lease had already passed on"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot release the dispatcher lease; it expires");
            }
            Err(_) => tracing::warn!("releasing the dispatcher lease timed out; it expires"),
        }
    }
}

/// What this node may do under the lease, as the dispatcher publishes it to its channel loops.
#[derive(Debug, Clone, Default)]
pub(super) struct Mandate {
    /// The epoch this node may claim and start rows under now; `None` while it may not (no
    /// lease, or a lapsed one).
    pub(super) now: Option<LeaseEpoch>,
    /// The epoch the work queued and under way belongs to, which outlives a lapse of `now`.
    pub(super) scope: Option<EpochScope>,
}

impl Mandate {
    /// The epoch of the work queued and under way.
    pub(super) fn tenure(&self) -> Option<LeaseEpoch> {
        self.scope.as_ref().map(|s| s.epoch)
    }
}

/// One lease epoch's work: every delivery started under it holds `token`, a child of the
/// dispatcher's, cancelled when another node takes the lease (the successor redelivers; an
/// outcome recorded now would be refused) or when a drain runs out of time.
#[derive(Debug, Clone)]
pub(super) struct EpochScope {
    pub(super) epoch: LeaseEpoch,
    pub(super) token: CancellationToken,
}

/// What the dispatch loop knows of its lease: the epoch it may claim under now, and the epoch
/// its queued and running work was claimed under (which outlives a lapse). It republishes the
/// former to whoever works only on the leader (the purge) or reports it (metrics).
pub(super) struct LeaseView {
    metrics: Arc<Metrics>,
    /// What the keeper last published.
    held: watch::Receiver<Option<HeldLease>>,
    /// The epoch this node dispatches under now: the keeper's, while still valid.
    now: Option<LeaseEpoch>,
    /// The epoch of the work queued and under way, which outlives a lapse of `now`: kept if
    /// the keeper renews with it, dropped if another epoch (another holder) comes between.
    tenure: Option<LeaseEpoch>,
    /// When the lease we last saw renewed runs out, measured from before the renewal was sent.
    deadline: Option<Instant>,
    /// Publishes `now`.
    published: watch::Sender<Option<LeaseEpoch>>,
}

/// What following the keeper's news means for the work queued and under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(super) enum Tenure {
    /// Claimed under the epoch still held (or nothing was claimed): it carries on.
    Kept,
    /// Another node held the lease since that work was claimed: its outcomes would be refused
    /// and the successor redelivers it, so it is to be dropped.
    Lost,
}

impl LeaseView {
    pub(super) fn new(held: watch::Receiver<Option<HeldLease>>, metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            held,
            now: None,
            tenure: None,
            deadline: None,
            published: watch::Sender::new(None),
        }
    }

    /// The epoch this node may claim and start rows under, `None` while it may not.
    pub(super) fn current(&self) -> Option<LeaseEpoch> {
        self.now
    }

    /// The epoch the work queued and under way was claimed under, which outlives a lapse.
    pub(super) fn tenure(&self) -> Option<LeaseEpoch> {
        self.tenure
    }

    /// When the lease runs out unless a renewal comes first.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The epoch this node dispatches under, as published to the purge.
    pub(super) fn subscribe(&self) -> watch::Receiver<Option<LeaseEpoch>> {
        self.published.subscribe()
    }

    /// Waits for the keeper's next news; `None` once the keeper is gone.
    pub(super) async fn changed(&mut self) -> Option<Option<HeldLease>> {
        self.held.changed().await.ok()?;
        Some(*self.held.borrow_and_update())
    }

    /// Takes what the keeper published: a lease still valid is dispatched under. Another epoch,
    /// or none (another node holds the lease), means another node held it since this node
    /// claimed what it has queued and under way: that work is [`Tenure::Lost`].
    pub(super) fn follow(&mut self, held: Option<HeldLease>) -> Tenure {
        let epoch = held.map(|h| h.epoch);
        let tenure = if self.tenure.is_some() && self.tenure != epoch {
            Tenure::Lost
        } else {
            Tenure::Kept
        };
        self.tenure = epoch;
        let valid = held.filter(HeldLease::is_valid);
        self.deadline = valid.map(|h| h.valid_until);
        self.set(valid.map(|h| h.epoch));
        tenure
    }

    /// The lease ran out without a successful renewal: no claiming or starting until it is
    /// renewed. The tenure stands: if this node renews before another takes the lease, it
    /// keeps its epoch and its work.
    pub(super) fn expired(&mut self) {
        self.deadline = None;
        self.set(None);
    }

    /// Publishes that this node dispatches under `lease` (`None`: not at all).
    pub(super) fn set(&mut self, lease: Option<LeaseEpoch>) {
        self.now = lease;
        self.metrics.set_lease(lease.is_some(), lease.map(|e| e.0));
        self.published.send_if_modified(|held| {
            let changed = *held != lease;
            *held = lease;
            changed
        });
    }
}
