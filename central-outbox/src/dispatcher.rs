//! The dispatcher: while this node holds the `dispatcher` lease, it claims due notifications and
//! delivers each through its channel's adapter, recording every attempt.
//!
//! One loop, woken by whichever comes first: ingest (a new row), a finished delivery (a free
//! slot), the poll interval (retries coming due, rows other replicas ingested) or lease renewal.
//! Each wake runs one sweep, [`Dispatcher::dispatch_once`]: claim as many rows as there are free
//! delivery slots, start one task per row. Sweeps never overlap because only this loop runs them.
//! A delivery task never fails the loop: its outcome, whatever it is, is recorded on its own row.
//!
//! On shutdown no new claims are made; in-flight deliveries get `drain_timeout` to finish, after
//! which they are aborted and their rows, still claimed, become due again when the claim expires.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::delivery::EmailAdapter;
use crate::domain::NotificationType;
use crate::domain::channel::SmtpSettings;
use crate::domain::delivery::{AttemptOutcome, Delivered, DeliveryError};
use crate::domain::retry::RetryPolicy;
use crate::metrics::Metrics;
use crate::store::{AttemptRecord, ClaimedNotification, LeaseEpoch, OutboxStore, StoreError};

/// Name of the lease whose holder dispatches.
pub const DISPATCHER_LEASE: &str = "dispatcher";

/// Timing of the dispatcher. Defaults documented in `deploy/central-outbox.toml`.
#[derive(Debug, Clone)]
pub struct DispatcherSettings {
    /// Identifies this node as lease holder; unique per process.
    pub node_id: String,
    /// Longest a due row waits when nothing wakes the dispatcher.
    pub poll_interval: Duration,
    /// How long a lease lasts without renewal; renewed every third of it.
    pub lease_ttl: Duration,
    /// How long a claimed row stays claimed; after it the row is due again (at-least-once).
    pub claim_timeout: Duration,
    /// How long in-flight deliveries may run after shutdown begins.
    pub drain_timeout: Duration,
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepOutcome {
    /// This node does not hold the lease.
    NotLeader,
    /// Every delivery slot is busy.
    NoFreeSlot,
    /// Claimed and started this many deliveries (0: nothing was due).
    Started(usize),
}

pub struct Dispatcher<S> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    email: Arc<EmailAdapter>,
    settings: DispatcherSettings,
    wake: Arc<Notify>,
    lease: Option<LeaseEpoch>,
    /// Publishes `lease` to whoever works only on the leader (the purge) or reports it (metrics).
    lease_watch: watch::Sender<Option<LeaseEpoch>>,
    /// Settings of the last sweep, to log clamping warnings once per change, not per attempt.
    channel: Option<SmtpSettings>,
    in_flight: JoinSet<()>,
}

impl<S: OutboxStore> Dispatcher<S> {
    pub fn new(
        store: Arc<S>,
        metrics: Arc<Metrics>,
        settings: DispatcherSettings,
        wake: Arc<Notify>,
    ) -> Self {
        Self {
            store,
            metrics,
            email: Arc::new(EmailAdapter::new()),
            settings,
            wake,
            lease: None,
            lease_watch: watch::Sender::new(None),
            channel: None,
            in_flight: JoinSet::new(),
        }
    }

    /// The lease epoch this node holds, `None` while it is not the dispatcher.
    pub fn lease_watch(&self) -> watch::Receiver<Option<LeaseEpoch>> {
        self.lease_watch.subscribe()
    }

    /// Runs until `shutdown` is cancelled, then drains.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut poll = tokio::time::interval(self.settings.poll_interval);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut renew = tokio::time::interval(self.settings.lease_ttl / 3);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                _ = renew.tick() => self.renew_lease().await,
                Some(finished) = self.in_flight.join_next(), if !self.in_flight.is_empty() => {
                    if let Err(e) = finished {
                        tracing::error!(error = %e, "a delivery task panicked");
                    }
                    // Collect every other finished task too, so one sweep fills all free slots.
                    while let Some(finished) = self.in_flight.try_join_next() {
                        if let Err(e) = finished {
                            tracing::error!(error = %e, "a delivery task panicked");
                        }
                    }
                }
                () = self.wake.notified() => {}
                _ = poll.tick() => {}
            }
            if let Err(e) = self.dispatch_once().await {
                tracing::error!(error = %e, "dispatch sweep failed");
            }
        }
        self.lease_watch.send_replace(None);
        self.drain().await;
    }

    /// Takes or renews the lease; on any failure this node stops claiming at once.
    pub async fn renew_lease(&mut self) {
        let held = self
            .store
            .acquire_lease(
                DISPATCHER_LEASE,
                &self.settings.node_id,
                self.settings.lease_ttl,
            )
            .await;
        let now = match held {
            Ok(epoch) => epoch,
            Err(e) => {
                tracing::error!(error = %e, "cannot renew the dispatcher lease");
                None
            }
        };
        match (self.lease, now) {
            (None, Some(epoch)) => tracing::info!(epoch = epoch.0, "became the dispatcher"),
            (Some(old), Some(new)) if old != new => {
                tracing::warn!(
                    old = old.0,
                    new = new.0,
                    "dispatcher lease re-taken with a new epoch"
                )
            }
            (Some(old), None) => tracing::warn!(epoch = old.0, "lost the dispatcher lease"),
            _ => {}
        }
        self.lease = now;
        self.metrics.set_lease(now.is_some(), now.map(|e| e.0));
        self.lease_watch.send_if_modified(|held| {
            let changed = *held != now;
            *held = now;
            changed
        });
    }

    /// One sweep: claim up to the number of free delivery slots and start their deliveries.
    pub async fn dispatch_once(&mut self) -> Result<SweepOutcome, StoreError> {
        let Some(epoch) = self.lease else {
            return Ok(SweepOutcome::NotLeader);
        };
        let channel = self.store.smtp_settings().await?.map(|s| s.value);
        self.note_channel_change(channel.as_ref());
        let slots = channel
            .as_ref()
            .map_or(1, |s| s.max_concurrent_connections.max(1)) as usize;
        let free = slots.saturating_sub(self.in_flight.len());
        if free == 0 {
            return Ok(SweepOutcome::NoFreeSlot);
        }
        let claimed = self
            .store
            .claim_due(DISPATCHER_LEASE, epoch, free, self.settings.claim_timeout)
            .await?;
        let started = claimed.len();
        // An attempt may not outlive its claim, or a successor could deliver it concurrently.
        let attempt_timeout = self.settings.claim_timeout / 2;
        for notification in claimed {
            let attempt = Attempt {
                store: Arc::clone(&self.store),
                metrics: Arc::clone(&self.metrics),
                email: Arc::clone(&self.email),
                channel: channel.clone(),
                timeout: attempt_timeout,
            };
            self.in_flight.spawn(attempt.run(notification));
        }
        Ok(SweepOutcome::Started(started))
    }

    fn note_channel_change(&mut self, channel: Option<&SmtpSettings>) {
        if self.channel.as_ref() == channel {
            return;
        }
        if let Some(s) = channel {
            for warning in RetryPolicy::clamped(s.max_retries, s.retry_delay).1 {
                tracing::warn!("SMTP configuration: {warning}");
            }
        }
        self.channel = channel.cloned();
    }

    async fn drain(&mut self) {
        if self.in_flight.is_empty() {
            return;
        }
        tracing::info!(in_flight = self.in_flight.len(), "draining deliveries");
        let drained = tokio::time::timeout(self.settings.drain_timeout, async {
            while self.in_flight.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                aborted = self.in_flight.len(),
                "drain timeout: aborting deliveries; their rows are retried after the claim timeout"
            );
            self.in_flight.abort_all();
            while self.in_flight.join_next().await.is_some() {}
        }
    }
}

/// One delivery attempt of one claimed row, run as its own task.
struct Attempt<S> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    email: Arc<EmailAdapter>,
    channel: Option<SmtpSettings>,
    timeout: Duration,
}

impl<S: OutboxStore> Attempt<S> {
    async fn run(self, notification: ClaimedNotification) {
        let started = Instant::now();
        let result = match tokio::time::timeout(self.timeout, self.deliver(&notification)).await {
            Ok(result) => result,
            Err(_) => Err(DeliveryError::transient(format!(
                "delivery attempt timed out after {}s",
                self.timeout.as_secs()
            ))),
        };
        let policy = match &self.channel {
            Some(s) => RetryPolicy::clamped(s.max_retries, s.retry_delay).0,
            None => RetryPolicy::clamped(0, Duration::ZERO).0,
        };
        let transition = policy.transition(notification.retry_count, &result, Utc::now());
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
        let status = record.transition.status;
        self.metrics
            .attempt_finished(notification.content.kind, record.outcome, record.duration);
        match self.store.record_outcome(DISPATCHER_LEASE, record).await {
            Ok(true) => tracing::debug!(id = %notification.id, %status, "attempt recorded"),
            Ok(false) => tracing::warn!(
                id = %notification.id,
                "attempt outcome not recorded: the claim or lease was lost meanwhile"
            ),
            Err(e) => tracing::error!(
                id = %notification.id,
                error = %e,
                "cannot record the attempt; the row becomes due again after its claim expires"
            ),
        }
    }

    async fn deliver(&self, n: &ClaimedNotification) -> Result<Delivered, DeliveryError> {
        if n.content.kind != NotificationType::Email {
            return Err(DeliveryError::permanent(format!(
                "no delivery adapter for type {}",
                n.content.kind
            )));
        }
        let Some(channel) = &self.channel else {
            return Err(DeliveryError::permanent("no SMTP configuration"));
        };
        let list = self
            .store
            .list(&n.content.list_name)
            .await
            .map_err(|e| DeliveryError::transient(format!("cannot resolve the list: {e}")))?
            .ok_or_else(|| {
                DeliveryError::permanent(format!(
                    "unknown notification list {:?}",
                    n.content.list_name.as_str()
                ))
            })?
            .value;
        if list.kind != n.content.kind {
            return Err(DeliveryError::permanent(format!(
                "notification list {:?} is a {} list, not {}",
                list.name.as_str(),
                list.kind,
                n.content.kind
            )));
        }
        self.email.deliver(channel, n.id, &n.content, &list).await
    }
}
