//! One channel's dispatch loop: its delivery slots (a semaphore), its rate limit, its queue of
//! rows claimed ahead, and its claims. Email and webhooks each run one, so a slow relay, a
//! claim waiting for the database or a rate limit on one channel never holds the other up.
//!
//! Each turn of the loop starts what it can (a queued row needs a free slot and a whole
//! rate-limit token, which it takes), then claims if the channel has room (the rules are
//! [`super::claim_decision`]; a delivery's task is [`super::attempt::Delivery`]), then waits for
//! whichever comes first: the lease changing, a claim or settings read answering, a delivery
//! finishing (its slot is free), something that may have made rows due (a row ingested here,
//! the poll timer, a lease taken, the time the next waiting row comes due), or the next
//! rate-limit token.
//!
//! A claim that takes every due row also asks the store how long until the next waiting row
//! comes due (`DispatchStore::next_due_in`: a scheduled row's time, a retry's), and the loop
//! wakes then: such a row goes out at its time, not up to a poll interval after it. Rows of
//! another replica's ingest are still found by the poll, which then learns their time too.
//!
//! Invariants: at most `max_concurrent_connections` deliveries under way (at least one) times
//! what the channel's adapter queues per connection (`Deliver::attempts_per_connection`); at
//! most one claim under way, sent once the queue is down to what the connections start during
//! one claim's latency ([`super::claim_ahead`]; nothing queued until that has been measured), so
//! rows start in the order they were claimed (the order of `domain::serve_order`) and the
//! connections do not wait for a claim to commit; a queued row that waited past half
//! its claim is never started (it could not finish before a successor may claim it): its claim
//! is released at once with a NotSent attempt saying why; every claimed row ends in a recorded
//! outcome, none is dropped from the queue without one; a channel
//! whose last claim found fewer due rows than it asked for claims again only once something
//! may have made rows due, so finished deliveries do not each cost an empty claim of an idle
//! channel. The loop itself never waits for the database: claims and the settings read (each
//! channel's row, through the config cache) run as tasks of their own, and queued rows keep
//! starting while they are under way.
//!
//! Held rows (flood consolidation) go out as digests: at most once a second, and at once after
//! a claim that found one, a claim first takes the due held rows of one list together
//! (`DispatchStore::claim_digest`); the digest then takes one slot and one rate-limit token like
//! a single row, since it is one mail or one webhook call ([`super::digest`]).
//!
//! Time is read from tokio's clock, which is the system clock except under a test's paused
//! clock: there, the pacing follows the test's time exactly.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use super::attempt::{Attempt, Delivery, Ended, attempt_timeout, failed_unsent, not_sent};
use super::caught;
use super::claim_ahead::ClaimAhead;
use super::claim_decision::{ClaimState, Decision, DueRows, NoClaim, decide};
use super::digest::Digest;
use super::lease::{DISPATCHER_LEASE, Mandate};
use super::list_failover::ListFailovers;
use super::provider::Failover;
use super::recorder::RecorderHandle;
use crate::config_cache::ConfigCache;
use crate::delivery::{ChannelSettings, Deliver, StartOrder};
use crate::domain::channel::{SmtpSettings, WebhookSettings};
use crate::domain::delivery::DeliveryError;
use crate::domain::failover::FailoverPolicy;
use crate::domain::rate::TokenBucket;
use crate::domain::serve_order::LongestWaitingShare;
use crate::domain::{NotificationId, NotificationType};
use crate::metrics::Metrics;
use crate::on_fallback::FailoverBoard;
use crate::records::{AttemptRecord, ClaimedNotification, LeaseEpoch};
use crate::store::ReadChannelSettings;
use crate::store::{DispatchStore, StoreError};

/// Now, on tokio's clock (see the module documentation).
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// What one channel loop needs from the dispatcher, fixed for its life.
pub(super) struct ChannelParts<S, D> {
    pub(super) kind: NotificationType,
    pub(super) store: Arc<S>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) delivery: Arc<D>,
    /// Where the channel's settings are read (from the store, through this short-lived copy).
    pub(super) config: Arc<ConfigCache>,
    pub(super) claim_timeout: Duration,
    /// Rows per claim (`dispatcher.claim_batch`); `None`: the free slots plus two per
    /// connection.
    pub(super) claim_batch: Option<usize>,
    /// When the channel moves to another provider (`super::provider`).
    pub(super) failover: FailoverPolicy,
    /// What this node delivers through fallbacks, for GetKpis and the console.
    pub(super) board: Arc<FailoverBoard>,
    /// Where finished attempts go to be recorded (the recorder task).
    pub(super) recorder: RecorderHandle,
}

impl<S, D> Clone for ChannelParts<S, D> {
    fn clone(&self) -> Self {
        Self {
            kind: self.kind,
            store: Arc::clone(&self.store),
            metrics: Arc::clone(&self.metrics),
            delivery: Arc::clone(&self.delivery),
            config: Arc::clone(&self.config),
            claim_timeout: self.claim_timeout,
            claim_batch: self.claim_batch,
            failover: self.failover,
            board: Arc::clone(&self.board),
            recorder: self.recorder.clone(),
        }
    }
}

/// How often a channel looks for due held rows while it finds none: a digest goes out within
/// about this long of its window's end (or of the poll that follows).
const DIGEST_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// A claim's answer: what was taken under `epoch`, or why nothing was.
struct ClaimAnswer {
    wanted: usize,
    epoch: LeaseEpoch,
    /// How long the claim took, from sending to answer.
    took: Duration,
    taken: Result<Taken, StoreError>,
}

/// What one claim took: a digest (if it looked for one and one was due) and single rows; and,
/// when it took every due row and was allowed to ask, how long until the next waiting row
/// comes due (`Some(None)`: none waits; `None`: not asked).
struct Taken {
    digest: Option<Digest>,
    rows: Vec<ClaimedNotification>,
    next_due_in: Option<Option<Duration>>,
}

/// Added to a wake-up for the next due row: the store counts its time in milliseconds (MS SQL
/// rounds its clock to them), so a wake-up at the very instant could find the row a fraction of
/// a millisecond short of due and sleep again.
const DUE_MARGIN: Duration = Duration::from_millis(1);

/// Least time between two asks for the next due row. A channel kept busy by a trickle of rows
/// claims often, and each short claim would otherwise cost a second round trip (on MS SQL); at
/// most ten a second, a claim that may not ask wakes the channel when it may again, so a row
/// coming due is found at most this much later.
const NEXT_DUE_ASK_INTERVAL: Duration = Duration::from_millis(100);

/// Claimed work waiting for a slot: one row, or the rows of one digest.
// Rows are by far the common case, so they stay unboxed; only a digest wastes the difference.
#[allow(clippy::large_enum_variant)]
enum Work {
    Row(ClaimedNotification),
    Digest(Digest),
}

impl Work {
    fn epoch(&self) -> Option<LeaseEpoch> {
        match self {
            Self::Row(n) => Some(n.epoch),
            Self::Digest(d) => d.rows.first().map(|r| r.epoch),
        }
    }
}

/// The delivery slots: a semaphore whose size follows the channel's settings. Shrinking while
/// deliveries hold permits forgets the surplus as they come back.
struct Slots {
    semaphore: Arc<Semaphore>,
    size: usize,
    /// Permits to forget as they are returned, after a shrink.
    owed: usize,
}

impl Slots {
    fn new() -> Self {
        Self {
            semaphore: Arc::new(Semaphore::new(1)),
            size: 1,
            owed: 0,
        }
    }

    fn resize(&mut self, size: usize) {
        let size = size.max(1);
        if size > self.size {
            let mut grow = size - self.size;
            let paid = grow.min(self.owed);
            self.owed -= paid;
            grow -= paid;
            self.semaphore.add_permits(grow);
        } else {
            self.owed += self.size - size;
        }
        self.size = size;
        self.settle();
    }

    /// Forgets owed permits that are free now.
    fn settle(&mut self) {
        if self.owed > 0 {
            self.owed -= self.semaphore.forget_permits(self.owed);
        }
    }

    fn free(&self) -> usize {
        self.semaphore.available_permits()
    }

    fn try_take(&mut self) -> Option<OwnedSemaphorePermit> {
        self.settle();
        Arc::clone(&self.semaphore).try_acquire_owned().ok()
    }
}

/// One channel's loop and pacing state; see the module documentation.
pub(super) struct ChannelLoop<S, D> {
    parts: ChannelParts<S, D>,
    /// The settings of the last read, which queued rows are delivered with.
    settings: Option<ChannelSettings>,
    slots: Slots,
    /// The channel's connections (`max_concurrent_connections`); each has as many slots as
    /// its adapter keeps attempts under way on one.
    connections: usize,
    bucket: Option<TokenBucket>,
    /// When a rate-limit token comes, if the channel waits for one.
    throttled_until: Option<tokio::time::Instant>,
    /// Claimed, not yet started, with when they were claimed.
    queue: VecDeque<(Work, Instant)>,
    /// When the last claim looked for a due digest; `None`: the next claim looks.
    digests_checked_at: Option<Instant>,
    /// Which claimed rows go to the longest-waiting (`domain::serve_order`).
    share: LongestWaitingShare,
    /// Whether rows may be due: drained after a short claim until something may have made
    /// rows due ([`DueRows`]).
    due: DueRows,
    /// When the earliest waiting row not due at the last short claim comes due (a scheduled
    /// row's time, a retry's), on tokio's clock: the loop wakes then as if polled, so such a
    /// row goes out at its time rather than up to a poll interval later.
    next_due: Option<tokio::time::Instant>,
    /// When a claim last asked for the next due row ([`NEXT_DUE_ASK_INTERVAL`]).
    next_due_asked_at: Option<Instant>,
    claim: Option<JoinHandle<ClaimAnswer>>,
    settings_read: Option<JoinHandle<Result<ChannelSettings, StoreError>>>,
    /// A settings read answered since the last turn: its answer is fresh enough to claim
    /// with, even where the cache keeps no copy (no SMTP settings stored).
    settings_just_read: bool,
    /// Deliveries under way; each holds a slot until its channel has answered, and ends with
    /// how long it held it and how its provider answered (`None`: cancelled).
    deliveries: JoinSet<Option<Ended>>,
    /// Which of the channel's providers attempts go to (`super::provider`).
    failover: Failover,
    /// Which endpoint each webhook list with fallbacks delivers to (`super::list_failover`);
    /// empty on the email channel.
    lists: ListFailovers,
    /// How deep to claim ahead, from the claims' and deliveries' measured times.
    ahead: ClaimAhead,
    /// The order started attempts take their places at the connections in: the order they
    /// started in.
    start_order: StartOrder,
    /// Settings last warned about, to log clamping warnings once per change.
    warned_for: Option<Warned>,
}

impl<S: DispatchStore, D: Deliver> ChannelLoop<S, D> {
    pub(super) fn new(parts: ChannelParts<S, D>) -> Self {
        let failover = Failover::new(
            parts.kind,
            parts.failover,
            Arc::clone(&parts.metrics),
            Arc::clone(&parts.board),
        );
        let lists = ListFailovers::new(
            parts.failover,
            Arc::clone(&parts.metrics),
            Arc::clone(&parts.board),
        );
        Self {
            parts,
            settings: None,
            slots: Slots::new(),
            connections: 1,
            bucket: None,
            throttled_until: None,
            queue: VecDeque::new(),
            digests_checked_at: None,
            share: LongestWaitingShare::default(),
            due: DueRows::default(),
            next_due: None,
            next_due_asked_at: None,
            claim: None,
            settings_read: None,
            settings_just_read: false,
            deliveries: JoinSet::new(),
            failover,
            lists,
            ahead: ClaimAhead::default(),
            start_order: StartOrder::default(),
            warned_for: None,
        }
    }

    /// Runs until `stop`, then drains: no new claims or starts, rows still queued are left
    /// to become due again when their claims expire, a claim under way is waited for (its rows
    /// are not started) and deliveries under way finish. `mandate` says what this node may do
    /// under the lease; `due` ticks whenever something may have made rows due.
    pub(super) async fn run(
        mut self,
        mut mandate: watch::Receiver<Mandate>,
        mut due: watch::Receiver<u64>,
        stop: CancellationToken,
    ) {
        loop {
            let current = mandate.borrow_and_update().clone();
            self.sweep(&current);
            let throttled_until = self.throttled_until;
            let next_due = self.next_due;
            let probe_at = self.failover.probe_at();
            let list_probe_at = self.lists.probe_at();
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                changed = mandate.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    self.follow(&mandate.borrow().clone(), &current);
                }
                answer = join(&mut self.claim), if self.claim.is_some() => {
                    self.claim = None;
                    if let Err(e) = self.claim_answered(answer, &current) {
                        self.parts.metrics.claim_failed(self.parts.kind, "claim");
                        tracing::error!(channel = %self.parts.kind, error = %e, "claiming due rows failed");
                    }
                }
                read = join(&mut self.settings_read), if self.settings_read.is_some() => {
                    self.settings_read = None;
                    match read {
                        Ok(settings) => {
                            self.set_settings(settings);
                            self.settings_just_read = true;
                        }
                        Err(e) => {
                            self.parts.metrics.claim_failed(self.parts.kind, "settings");
                            tracing::error!(
                                channel = %self.parts.kind,
                                error = %e,
                                "cannot read the channel settings"
                            );
                        }
                    }
                }
                Some(finished) = self.deliveries.join_next(), if !self.deliveries.is_empty() => {
                    self.delivery_ended(finished);
                    while let Some(finished) = self.deliveries.try_join_next() {
                        self.delivery_ended(finished);
                    }
                }
                changed = due.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    self.due_may_have_changed();
                }
                () = sleep_until(throttled_until), if throttled_until.is_some() => {
                    self.throttled_until = None;
                }
                () = sleep_until(next_due), if next_due.is_some() => {
                    self.next_due = None;
                    self.due_may_have_changed();
                }
                () = sleep_until(probe_at), if probe_at.is_some() => {
                    if let Some(channel) = self.settings.as_ref() {
                        self.failover.start_probe(&self.parts.delivery, channel);
                    }
                }
                outcome = self.failover.probe_answer(), if self.failover.probing() => {
                    self.failover.probed(outcome, now());
                }
                () = sleep_until(list_probe_at), if list_probe_at.is_some() => {
                    if let Some(channel) = self.settings.as_ref() {
                        self.lists.start_probes(&self.parts.delivery, channel, now());
                    }
                }
                () = self.lists.probe_answered(), if self.lists.probing() => {}
            }
        }
        self.drain().await;
    }

    /// One turn: take fresh settings if at hand (or send for them), start what is queued, and
    /// claim if the channel has room. Returns the deliveries started. Without a lease that
    /// allows claiming now, a turn does nothing.
    fn sweep(&mut self, mandate: &Mandate) -> usize {
        let Some(epoch) = mandate.now else {
            return 0;
        };
        let fresh = self.refresh_settings();
        let started = self.start_queued(mandate);
        self.claim_if_room(epoch, fresh);
        started
    }

    /// Sweeps like the loop and waits for the store calls it makes (the deterministic step
    /// behind `Dispatcher::dispatch_once`). Returns the deliveries started.
    #[cfg(test)]
    pub(super) async fn sweep_once(&mut self, mandate: &Mandate) -> Result<usize, StoreError> {
        self.due_may_have_changed();
        let mut started = self.sweep(mandate);
        if self.settings_read.is_some() {
            let settings = join(&mut self.settings_read).await;
            self.settings_read = None;
            self.set_settings(settings?);
            self.settings_just_read = true;
            started += self.sweep(mandate);
        }
        if self.claim.is_some() {
            let answer = join(&mut self.claim).await;
            self.claim = None;
            let failed = self.claim_answered(answer, mandate).err();
            started += self.start_queued(mandate);
            if let Some(e) = failed {
                return Err(e);
            }
        }
        Ok(started)
    }

    /// Takes the channel's current settings when a fresh copy is at hand; otherwise sends for
    /// them (from the store, through the config cache) and returns false: claims wait for the
    /// answer, while rows already queued go on starting with the settings they were claimed
    /// under.
    fn refresh_settings(&mut self) -> bool {
        if std::mem::take(&mut self.settings_just_read) {
            return true;
        }
        if self.settings_read.is_some() {
            return false;
        }
        let fresh = match self.parts.kind {
            NotificationType::Email => self
                .parts
                .config
                .fresh_smtp_settings()
                .map(|email| ChannelSettings::Email(Some(email))),
            NotificationType::Webhook => self
                .parts
                .config
                .fresh_webhook_settings()
                .map(ChannelSettings::Webhook),
        };
        if let Some(settings) = fresh {
            self.set_settings(settings);
            return true;
        }
        let config = Arc::clone(&self.parts.config);
        let store = Arc::clone(&self.parts.store);
        let kind = self.parts.kind;
        self.settings_read = Some(tokio::spawn(async move {
            caught::store_call("the store call", read_settings(kind, config, store)).await
        }));
        false
    }

    /// Takes `channel` as the channel's settings: resizes the slots; a changed rate limit
    /// starts a fresh bucket, an unchanged one keeps its tokens.
    fn set_settings(&mut self, channel: ChannelSettings) {
        let warned = Warned::of(&channel);
        if self.warned_for.as_ref() != Some(&warned) {
            if let Some(policy) = warned.policy() {
                for warning in policy.retry_policy().1 {
                    tracing::warn!("{} configuration: {warning}", warned.section());
                }
            }
            self.warned_for = Some(warned);
        }
        let policy = channel.policy();
        match (policy.rate_limit, &self.bucket) {
            (None, _) => self.bucket = None,
            (Some(limit), Some(bucket)) if bucket.limit() == limit => {}
            (Some(limit), _) => self.bucket = Some(TokenBucket::new(limit, now())),
        }
        let per_connection = self.parts.delivery.attempts_per_connection(&channel).max(1);
        self.connections = policy.max_concurrent_connections.max(1) as usize;
        self.slots.resize(self.connections * per_connection);
        self.failover.follow(&channel);
        self.settings = Some(channel);
    }

    /// Sends a claim if [`decide`] says the channel has room (`fresh`: its settings are
    /// current), of as many rows as it says; a channel out of rate-limit tokens takes its next
    /// turn when one comes.
    fn claim_if_room(&mut self, epoch: LeaseEpoch, fresh: bool) {
        let now = now();
        let rate_limit = self
            .settings
            .as_ref()
            .and_then(|c| c.policy().rate_limit)
            .map(|limit| limit.per_second());
        let state = ClaimState {
            settings_fresh: fresh,
            claim_under_way: self.claim.is_some(),
            drained: self.due.drained(),
            free_slots: self.slots.free(),
            slots: self.slots.size,
            connections: self.connections,
            queued: self.queue.len(),
            ahead: self.ahead.rows(self.slots.size, rate_limit),
            recorder_backlog: self.parts.recorder.backlog(),
            tokens: self.bucket.as_mut().map(|b| b.available(now)),
            claim_batch: self.parts.claim_batch,
        };
        let wanted = match decide(&state) {
            Decision::Claim(rows) => rows,
            Decision::Wait(NoClaim::Throttled) => {
                self.note_throttle(now);
                return;
            }
            Decision::Wait(_) => return,
        };
        let lanes = self.share.split(wanted);
        self.due.claim_sent();
        let look_for_digest = self
            .digests_checked_at
            .is_none_or(|at| now.duration_since(at) >= DIGEST_CHECK_INTERVAL);
        if look_for_digest {
            self.digests_checked_at = Some(now);
        }
        let may_ask_next_due = self
            .next_due_asked_at
            .is_none_or(|at| now.duration_since(at) >= NEXT_DUE_ASK_INTERVAL);
        let store = Arc::clone(&self.parts.store);
        let kind = self.parts.kind;
        let claim_timeout = self.parts.claim_timeout;
        self.claim = Some(tokio::spawn(async move {
            let sent = tokio::time::Instant::now();
            let claim = async {
                let mut digest = None;
                if look_for_digest {
                    let id = NotificationId::generate();
                    let rows = store
                        .claim_digest(DISPATCHER_LEASE, epoch, kind, id, claim_timeout)
                        .await?;
                    if !rows.is_empty() {
                        digest = Some(Digest { id, rows });
                    }
                }
                let rows = store
                    .claim_due(DISPATCHER_LEASE, epoch, kind, lanes, claim_timeout)
                    .await?;
                // Every due row taken: ask when the next one comes due. Only a wake-up is lost
                // if that fails (the poll still comes), never the rows just claimed.
                let next_due_in = if may_ask_next_due && rows.len() < lanes.total() {
                    Some(store.next_due_in(kind).await.unwrap_or_else(|e| {
                        tracing::warn!(channel = %kind, error = %e, "cannot read when the next row is due; the poll will find it");
                        None
                    }))
                } else {
                    None
                };
                Ok(Taken {
                    digest,
                    rows,
                    next_due_in,
                })
            };
            let taken = caught::store_call("the store call", claim).await;
            ClaimAnswer {
                wanted,
                epoch,
                took: sent.elapsed(),
                taken,
            }
        }));
    }

    /// Queues a claim's rows, unless another node has held the lease since they were claimed
    /// (then they are due again when their claims expire). A short or failed claim leaves the
    /// channel drained unless something made rows due meanwhile, so a failing database is
    /// tried again on the next ingest or poll, not on every finished delivery.
    fn claim_answered(&mut self, answer: ClaimAnswer, mandate: &Mandate) -> Result<(), StoreError> {
        let ClaimAnswer {
            wanted,
            epoch,
            took,
            taken,
        } = answer;
        if taken.is_ok() {
            self.ahead.claim_took(took);
        }
        let claimed_at = now();
        // A digest found means more may be due (another list's, or the rest of this one's
        // beyond its maximum): the next claim looks again at once.
        let short = taken.as_ref().map_or(true, |taken| {
            taken.rows.len() < wanted && taken.digest.is_none()
        });
        self.due.claim_answered(short);
        let Taken {
            digest,
            rows,
            next_due_in,
        } = taken?;
        if short {
            match next_due_in {
                Some(answer) => {
                    self.next_due_asked_at = Some(claimed_at);
                    self.next_due =
                        answer.map(|wait| tokio::time::Instant::now() + wait + DUE_MARGIN);
                }
                // Asked too recently to ask again: wake when it may, and ask then.
                None => {
                    let again = self
                        .next_due_asked_at
                        .map_or(claimed_at, |at| at + NEXT_DUE_ASK_INTERVAL);
                    let again = tokio::time::Instant::from_std(again);
                    self.next_due = Some(self.next_due.map_or(again, |due| due.min(again)));
                }
            }
        }
        if digest.is_some() {
            self.digests_checked_at = None;
        }
        self.share.claimed(rows.len());
        if mandate.tenure() == Some(epoch) {
            self.queue
                .extend(digest.map(|d| (Work::Digest(d), claimed_at)));
            self.queue
                .extend(rows.into_iter().map(|n| (Work::Row(n), claimed_at)));
        }
        Ok(())
    }

    /// Starts queued rows while the channel has a free slot and a rate-limit token, and only
    /// while this node holds the lease. A row that waited longer than half its claim could
    /// not finish before its claim runs out: its claim is released at once (its attempt says
    /// it was never sent, and it is due again now), costing no slot and no token. A digest that
    /// cannot be composed fails its rows' attempts (permanently: the same rows would fail the
    /// same way), so they park with the reason instead of being claimed again and again.
    fn start_queued(&mut self, mandate: &Mandate) -> usize {
        let (Some(_), Some(scope)) = (mandate.now, mandate.scope.as_ref()) else {
            return 0;
        };
        let Some(channel) = self.settings.clone() else {
            return 0;
        };
        let (retry, _) = channel.policy().retry_policy();
        let timeout = attempt_timeout(self.parts.claim_timeout, &channel);
        let stale_after = self.parts.claim_timeout / 2;
        let mut started = 0;
        while let Some((_, claimed_at)) = self.queue.front() {
            let now = now();
            let waited = now.duration_since(*claimed_at);
            if waited > stale_after {
                if let Some((work, _)) = self.queue.pop_front() {
                    self.release_unsent(work, waited);
                }
                continue;
            }
            let Some(permit) = self.slots.try_take() else {
                break;
            };
            if let Some(bucket) = self.bucket.as_mut() {
                if bucket.available(now) == 0 {
                    self.note_throttle(now);
                    break;
                }
                bucket.take(1, now);
            }
            let Some((work, _)) = self.queue.pop_front() else {
                break;
            };
            let (notification, digest) = match work {
                Work::Row(notification) => (notification, None),
                Work::Digest(digest) => match digest.notification() {
                    Ok(notification) => (notification, Some(digest)),
                    Err(e) => {
                        // Within the content limits by construction (domain::consolidation), so
                        // a bug; still an outcome for every row, never a row left claimed.
                        tracing::error!(digest = %digest.id, error = %e, "cannot compose a digest");
                        let error = DeliveryError::permanent(format!(
                            "cannot compose digest {}: {e}",
                            digest.id
                        ));
                        let records = digest
                            .rows
                            .iter()
                            .map(|r| failed_unsent(r, &retry, error.clone()))
                            .collect();
                        self.record_unsent(records);
                        continue;
                    }
                },
            };
            let provider = self.failover.provider();
            let route = self.lists.route(&notification.content.list_name);
            let attempt = Attempt {
                store: Arc::clone(&self.parts.store),
                metrics: Arc::clone(&self.parts.metrics),
                delivery: Arc::clone(&self.parts.delivery),
                config: Arc::clone(&self.parts.config),
                channel: match &provider {
                    Some(p) if p.index > 0 => channel.via(p.index),
                    _ => channel.clone(),
                },
                retry,
                timeout,
                provider,
                route,
            };
            self.deliveries.spawn(
                Delivery {
                    attempt,
                    notification,
                    digest,
                    turn: self.start_order.next_turn(),
                    slot: permit,
                    cancelled: scope.token.clone(),
                    recorder: self.parts.recorder.clone(),
                }
                .run(),
            );
            started += 1;
        }
        started
    }

    /// Releases the claim of work that waited `waited` for a slot (see [`Self::start_queued`]).
    fn release_unsent(&mut self, work: Work, waited: Duration) {
        let why = format!(
            "not sent: waited {:.1}s for a free {} slot, longer than half the claim timeout \
             ({}s); the claim was released and the row is due again",
            waited.as_secs_f64(),
            self.parts.kind,
            self.parts.claim_timeout.as_secs()
        );
        let records: Vec<AttemptRecord> = match &work {
            Work::Row(n) => vec![not_sent(n, false, why.clone())],
            Work::Digest(d) => d
                .rows
                .iter()
                .map(|n| not_sent(n, true, why.clone()))
                .collect(),
        };
        tracing::warn!(rows = records.len(), channel = %self.parts.kind, "{why}");
        self.parts
            .metrics
            .claims_released(self.parts.kind, records.len() as u64);
        self.record_unsent(records);
    }

    /// Hands records of attempts that sent nothing to the recorder, as a task among the
    /// deliveries (so a drain waits for it) that holds no slot.
    fn record_unsent(&mut self, records: Vec<AttemptRecord>) {
        let recorder = self.parts.recorder.clone();
        self.deliveries.spawn(async move {
            // Err only once the recorder is gone: the rows are due when their claims expire.
            let _ = recorder.send_all(records).await;
            None
        });
    }

    /// Follows a change of what this node may do under the lease: work claimed under an
    /// epoch another node has held since is dropped (its deliveries were cancelled with the
    /// epoch's token); a lease taken or re-taken may find rows due.
    fn follow(&mut self, now: &Mandate, before: &Mandate) {
        if now.tenure() != before.tenure() {
            self.queue.retain(|(work, _)| work.epoch() == now.tenure());
            self.failover.new_term();
            self.lists.new_term();
        }
        if now.now.is_some() && now.now != before.now {
            self.due_may_have_changed();
        }
    }

    /// Something may have made rows due (a row ingested, the poll timer, a lease taken): the
    /// next turn claims again. A finished delivery or a lease renewal does not count.
    fn due_may_have_changed(&mut self) {
        self.due.woken(self.claim.is_some());
    }

    fn delivery_ended(&mut self, ended: Result<Option<Ended>, tokio::task::JoinError>) {
        self.slots.settle();
        match ended {
            Ok(Some(Ended {
                held,
                provider,
                list,
            })) => {
                self.ahead.slot_held(held);
                if let Some((index, outcome)) = provider {
                    self.failover.answered(index, outcome, now());
                }
                if let Some(report) = list {
                    self.lists.reported(report, now());
                }
            }
            Ok(None) => {}
            // A panic in the adapter is caught inside the attempt; one anywhere else in the
            // task costs only that task (its permit is returned as it unwinds).
            Err(e) if e.is_panic() => {
                tracing::error!(error = %e, "a delivery task panicked outside its attempt");
            }
            Err(_) => {}
        }
    }

    /// Remembers when the next rate-limit token comes, to take a turn then.
    fn note_throttle(&mut self, now: Instant) {
        if let Some(bucket) = self.bucket.as_mut() {
            let ready = tokio::time::Instant::now() + bucket.wait_for_one(now);
            self.throttled_until = Some(self.throttled_until.map_or(ready, |t| t.min(ready)));
        }
    }

    /// See [`ChannelLoop::run`].
    async fn drain(&mut self) {
        self.queue.clear();
        self.failover.stop();
        self.lists.stop();
        if let Some(claim) = self.claim.take() {
            // Its rows are not started: due again when their claims expire.
            let _ = claim.await;
        }
        if let Some(read) = self.settings_read.take() {
            read.abort();
        }
        while let Some(finished) = self.deliveries.join_next().await {
            self.delivery_ended(finished);
        }
    }
}

/// The settings a channel delivers with, read through the config cache: email's stored ones
/// (`None`: none stored, its rows park), webhook's stored ones or its defaults.
async fn read_settings<S: ReadChannelSettings>(
    kind: NotificationType,
    config: Arc<ConfigCache>,
    store: Arc<S>,
) -> Result<ChannelSettings, StoreError> {
    match kind {
        NotificationType::Email => config
            .smtp_settings(&*store)
            .await
            .map(ChannelSettings::Email),
        NotificationType::Webhook => config
            .webhook_settings(&*store)
            .await
            .map(ChannelSettings::Webhook),
    }
}

/// The settings last warned about (clamped retry values), so each change warns once.
// One per channel loop: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
enum Warned {
    Email(Option<SmtpSettings>),
    Webhook(WebhookSettings),
}

impl Warned {
    fn of(channel: &ChannelSettings) -> Self {
        match channel {
            ChannelSettings::Email(email) => Self::Email(email.clone()),
            ChannelSettings::Webhook(webhook) => Self::Webhook(webhook.clone()),
        }
    }

    /// The policy to warn about; none for a channel not configured (its rows only park).
    fn policy(&self) -> Option<&crate::domain::channel::DeliveryPolicy> {
        match self {
            Self::Email(email) => email.as_ref().map(|s| &s.policy),
            Self::Webhook(webhook) => Some(&webhook.policy),
        }
    }

    /// How the warning names the settings.
    fn section(&self) -> &'static str {
        match self {
            Self::Email(_) => "SMTP",
            Self::Webhook(_) => "webhook",
        }
    }
}

/// Awaits an optional task (pending while there is none; the select guards check first).
async fn join<T>(handle: &mut Option<JoinHandle<T>>) -> T
where
    T: From<LostCall> + Send + 'static,
{
    match handle.as_mut() {
        Some(handle) => handle
            .await
            .unwrap_or_else(|e| T::from(LostCall(e.to_string()))),
        None => std::future::pending().await,
    }
}

/// A store call's task ended without an answer (the runtime shutting down under it).
struct LostCall(String);

impl From<LostCall> for ClaimAnswer {
    fn from(lost: LostCall) -> Self {
        Self {
            wanted: 0,
            epoch: LeaseEpoch(i64::MIN),
            took: Duration::ZERO,
            taken: Err(StoreError::Unavailable(format!(
                "a dispatcher claim was lost: {}",
                lost.0
            ))),
        }
    }
}

impl<T> From<LostCall> for Result<T, StoreError> {
    fn from(lost: LostCall) -> Self {
        Err(StoreError::Unavailable(format!(
            "a dispatcher store call was lost: {}",
            lost.0
        )))
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
