//! The dispatcher's hardest cases on a paused clock: lease loss mid-delivery, renewals delayed
//! within and beyond the lease's TTL, rate-limit pacing, queued rows that waited too long, what
//! one sweep claims and starts, and a shutdown whose drain times out.
//!
//! Each test runs on tokio's paused clock over the in-memory store
//! (`crate::testing::MemoryStore`, held to the store's dispatch contract by the conformance
//! suite) with a scripted delivery, so nothing depends on how fast this machine is: time moves
//! only when every task is idle (tokio then jumps to the next timer) or when a test sleeps,
//! which on a paused clock moves time at once and costs no real time. A run of the whole module
//! takes milliseconds. The same cases against real SQLite, on the real clock, are in
//! `gated_tests`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::lease::HeldLease;
use super::{DISPATCHER_LEASE, Dispatcher, DispatcherSettings, SweepOutcome};
use crate::config::{Config, SmtpConfig};
use crate::config_cache::{ConfigCache, MAX_AGE};
use crate::delivery::{ChannelSettings, Deliver, Turn};
use crate::domain::channel::{ListInput, NotificationList, SmtpSettings};
use crate::domain::delivery::AttemptOutcome;
use crate::domain::delivery::{Delivered, DeliveryError};
use crate::domain::status::Status;
use crate::domain::{NotificationId, NotificationType};
use crate::metrics::Metrics;
use crate::records::{ClaimedNotification, LeaseEpoch};
use crate::store::DispatchStore;
use crate::testing::{MemoryStore, Row, email, webhook};

/// The lease lasts 3 s and is renewed every second.
const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);

/// Virtual time after which a wait fails the test: far beyond any case here, and reached in
/// milliseconds of real time if the dispatcher never does what is waited for.
const DEADLINE: Duration = Duration::from_secs(3600);

/// The timer wheel fires at whole milliseconds, so a timer can fire up to a millisecond after
/// the instant it was set for.
const TICK: Duration = Duration::from_millis(1);

/// One delivery as the script saw it start.
#[derive(Debug, Clone)]
struct Start {
    subject: String,
    attempt_no: u32,
    at: Instant,
}

#[derive(Debug, Default)]
struct Log {
    starts: Vec<Start>,
    /// When each delivery dropped before it answered (its task aborted or timed out) was
    /// dropped.
    cancelled: Vec<Instant>,
}

/// Delivers by script: every attempt is logged; one whose subject starts with "hold" waits
/// until the test releases the holds, anything else is delivered at once.
#[derive(Debug)]
struct Script {
    log: watch::Sender<Log>,
    released: watch::Sender<bool>,
}

impl Script {
    fn new() -> Self {
        Self {
            log: watch::Sender::new(Log::default()),
            released: watch::Sender::new(false),
        }
    }

    fn release_holds(&self) {
        self.released.send_replace(true);
    }

    fn starts(&self) -> Vec<Start> {
        self.log.borrow().starts.clone()
    }

    fn cancelled(&self) -> Vec<Instant> {
        self.log.borrow().cancelled.clone()
    }

    async fn until(&self, what: &str, check: impl FnMut(&Log) -> bool) {
        within(what, async {
            self.log.subscribe().wait_for(check).await.unwrap();
        })
        .await;
    }
}

/// Counts the delivery as cancelled if it is dropped while armed.
struct CancelWitness<'a> {
    log: &'a watch::Sender<Log>,
    armed: bool,
}

impl Drop for CancelWitness<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.log
                .send_modify(|log| log.cancelled.push(Instant::now()));
        }
    }
}

impl Deliver for Script {
    async fn deliver(
        &self,
        _channel: &ChannelSettings,
        _list: &NotificationList,
        n: &ClaimedNotification,
        _turn: Turn,
    ) -> Result<Delivered, DeliveryError> {
        let subject = n.content.subject.as_str().to_owned();
        let hold = subject.starts_with("hold");
        let slow = subject.starts_with("slow");
        self.log.send_modify(|log| {
            log.starts.push(Start {
                subject,
                attempt_no: n.attempt_no,
                at: Instant::now(),
            });
        });
        if hold {
            let mut witness = CancelWitness {
                log: &self.log,
                armed: true,
            };
            let _ = self.released.subscribe().wait_for(|r| *r).await;
            witness.armed = false;
        }
        if slow {
            tokio::time::sleep(SLOW_DELIVERY).await;
        }
        Ok(Delivered {
            resolved_targets: vec!["ops@plant.test".into()],
        })
    }
}

/// How long a delivery whose subject starts with "slow" takes: a relay a round trip or two away.
const SLOW_DELIVERY: Duration = Duration::from_millis(2);

/// Fails the test if `future` has not finished within [`DEADLINE`] of virtual time.
async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(DEADLINE, future).await {
        Ok(value) => value,
        Err(_) => panic!("never happened: {what}"),
    }
}

/// SMTP settings with this many connections and, optionally, a rate limit (per second, burst).
fn smtp(connections: u32, rate_limit: Option<(f64, u32)>) -> SmtpSettings {
    let mut smtp = SmtpConfig::new("127.0.0.1", 25, "outbox@plant.test");
    smtp.max_concurrent_connections = connections;
    smtp.rate_limit_per_second = rate_limit.map(|(per_second, _)| per_second);
    smtp.rate_limit_burst = rate_limit.map(|(_, burst)| burst);
    let config = Config {
        smtp: Some(smtp),
        ..Default::default()
    };
    config.validate().unwrap().smtp.unwrap()
}

/// A store with the email list "ops" and the webhook list "hooks" (rows of `email` and
/// `webhook`).
fn store(smtp: SmtpSettings) -> Arc<MemoryStore> {
    let ops = NotificationList::parse(ListInput {
        name: "ops".into(),
        recipients: vec!["ops@plant.test".into()],
        ..Default::default()
    })
    .unwrap();
    let hooks = NotificationList::parse(ListInput {
        name: "hooks".into(),
        kind: Some(NotificationType::Webhook),
        endpoints: vec!["http://127.0.0.1:9/hook".into()],
        ..Default::default()
    })
    .unwrap();
    Arc::new(MemoryStore::new(smtp, vec![ops, hooks]))
}

fn settings(claim_timeout: Duration) -> DispatcherSettings {
    DispatcherSettings {
        node_id: "node-under-test".into(),
        poll_interval: Duration::from_secs(1),
        lease_ttl: TTL,
        renew_interval: RENEW,
        claim_timeout,
        drain_timeout: Duration::from_secs(5),
        claim_batch: None,
        failover: Default::default(),
    }
}

fn dispatcher(
    store: &Arc<MemoryStore>,
    script: &Arc<Script>,
    settings: DispatcherSettings,
    wake: Arc<Notify>,
    config: Arc<ConfigCache>,
) -> Dispatcher<MemoryStore, Script> {
    Dispatcher::new(
        Arc::clone(store),
        Arc::new(Metrics::new()),
        Arc::clone(script),
        config,
        settings,
        wake,
    )
}

/// A dispatcher running its loop (and so its lease keeper) over a memory store.
struct Rig {
    store: Arc<MemoryStore>,
    script: Arc<Script>,
    /// What ingest would notify.
    wake: Arc<Notify>,
    /// The dispatcher's copy of the SMTP settings and lists.
    config: Arc<ConfigCache>,
    lease: watch::Receiver<Option<LeaseEpoch>>,
    /// Every value the dispatcher published as its lease, with when.
    leases_seen: watch::Receiver<Vec<(Instant, Option<LeaseEpoch>)>>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    started_at: Instant,
}

impl Rig {
    /// Starts the loop over `store` (whose rows are due already) and waits until it holds the
    /// lease.
    async fn start(store: Arc<MemoryStore>, settings: DispatcherSettings) -> Self {
        let script = Arc::new(Script::new());
        let wake = Arc::new(Notify::new());
        let started_at = Instant::now();
        let config = Arc::new(ConfigCache::new());
        let dispatcher = dispatcher(
            &store,
            &script,
            settings,
            Arc::clone(&wake),
            Arc::clone(&config),
        );
        let mut lease = dispatcher.lease_watch();
        let (record, leases_seen) = watch::channel(vec![(started_at, None)]);
        let mut follow = lease.clone();
        tokio::spawn(async move {
            while follow.changed().await.is_ok() {
                let now = *follow.borrow_and_update();
                record.send_modify(|seen| seen.push((Instant::now(), now)));
            }
        });
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(dispatcher.run(shutdown.clone()));
        within(
            "the dispatcher takes the lease",
            lease.wait_for(Option::is_some),
        )
        .await
        .unwrap();
        Self {
            store,
            script,
            wake,
            config,
            lease,
            leases_seen,
            shutdown,
            task,
            started_at,
        }
    }

    fn epoch(&self) -> LeaseEpoch {
        self.lease.borrow().expect("the dispatcher holds the lease")
    }

    /// Moves the paused clock to `offset` after the rig started.
    async fn at(&self, offset: Duration) {
        tokio::time::sleep_until(self.started_at + offset).await;
    }

    fn since_start(&self, at: Instant) -> Duration {
        at - self.started_at
    }

    async fn until_row(&self, id: NotificationId, what: &str, check: impl Fn(&Row) -> bool) -> Row {
        within(what, self.store.until_row(id, check)).await
    }

    async fn stop(self) {
        self.shutdown.cancel();
        within("the dispatcher stops", self.task).await.unwrap();
    }
}

fn delivered(row: &Row) -> bool {
    row.status == Status::Delivered
}

/// A delivery is under way when the database stops answering this node's renewals; the lease
/// lapses (the delivery goes on: nobody else has the lease yet), then another node takes it.
/// When the node learns so, it cancels the delivery: no outcome is recorded by the node that
/// lost the lease, the row stays claimed under the old epoch for the successor to redeliver
/// once the claim expires, and this node claims nothing more.
#[tokio::test(start_paused = true)]
async fn a_node_that_loses_the_lease_mid_delivery_cancels_it_and_records_nothing() {
    let store = store(smtp(1, None));
    let id = store.add(email("hold: slow relay"));
    let mut rig = Rig::start(store, settings(Duration::from_secs(60))).await;
    rig.script
        .until("the delivery starts", |log| log.starts.len() == 1)
        .await;
    let epoch = rig.epoch();

    rig.store.leases.close();
    within("the lease lapses", rig.lease.wait_for(Option::is_none))
        .await
        .unwrap();
    assert_eq!(
        rig.script.cancelled(),
        [],
        "a lapse alone must not cancel a delivery under way"
    );
    rig.at(Duration::from_secs(5)).await;
    let successor = rig
        .store
        .lease_taken_by(DISPATCHER_LEASE, "node-b", Duration::from_secs(3600));
    assert!(successor > epoch);
    let claims = rig.store.claims();
    rig.store.leases.open();
    rig.script
        .until("the delivery is cancelled", |log| !log.cancelled.is_empty())
        .await;
    // At once, when the held renewal answered that node-b holds the lease: not when the
    // attempt would have timed out (30 s, half the claim).
    assert_eq!(
        rig.script.cancelled(),
        [rig.started_at + Duration::from_secs(5)]
    );

    rig.script.release_holds();
    rig.at(Duration::from_secs(30)).await;
    let row = rig.store.row(id);
    assert!(row.outcomes.is_empty(), "recorded: {:?}", row.outcomes);
    assert_eq!(row.status, Status::Pending);
    assert_eq!(row.attempts, 1);
    assert_eq!(rig.store.claims(), claims, "claimed without the lease");
    assert_eq!(rig.script.starts().len(), 1);
    assert_eq!(*rig.lease.borrow(), None);
    rig.stop().await;
}

/// A renewal answers late, but within the TTL: the lease never lapses and keeps its epoch, and
/// a row ingested while the renewal is stuck is delivered at once (claims never wait for
/// renewals).
#[tokio::test(start_paused = true)]
async fn a_renewal_delayed_within_the_ttl_keeps_the_lease_and_deliveries_go_on() {
    let rig = Rig::start(store(smtp(1, None)), settings(Duration::from_secs(60))).await;
    let epoch = rig.epoch();
    // The renewal sent one second in waits until 2.5 s; the lease it renewed ran to 3 s.
    rig.store.leases.close();
    rig.at(Duration::from_millis(1500)).await;
    assert_eq!(
        rig.store
            .leases
            .waiting
            .load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the renewal is held"
    );
    let id = rig.store.add(email("while the renewal is stuck"));
    rig.wake.notify_one();
    let row = rig.until_row(id, "the row is delivered", delivered).await;
    assert_eq!(row.outcomes[0].epoch, epoch);
    assert_eq!(
        rig.since_start(rig.script.starts()[0].at),
        Duration::from_millis(1500),
        "the row waited for the renewal"
    );
    rig.at(Duration::from_millis(2500)).await;
    rig.store.leases.open();
    rig.at(Duration::from_secs(10)).await;
    let seen = rig.leases_seen.borrow().clone();
    let held: Vec<_> = seen.iter().skip(1).map(|(_, lease)| *lease).collect();
    assert_eq!(
        held,
        vec![Some(epoch)],
        "the lease lapsed or changed: {seen:?}"
    );
    rig.stop().await;
}

/// Renewals stop answering for longer than the TTL: the node stops claiming exactly when the
/// lease it last renewed runs out, claims nothing while it is lapsed (a row ingested meanwhile
/// waits), and once renewals answer again it holds the same epoch and delivers the row.
#[tokio::test(start_paused = true)]
async fn a_renewal_delayed_past_the_ttl_stops_claims_until_the_same_epoch_returns() {
    let store = store(smtp(1, None));
    let first = store.add(email("before the stall"));
    let mut rig = Rig::start(store, settings(Duration::from_secs(60))).await;
    let epoch = rig.epoch();
    rig.until_row(first, "the first row is delivered", delivered)
        .await;
    rig.store.leases.close();
    within("the lease lapses", rig.lease.wait_for(Option::is_none))
        .await
        .unwrap();
    // Valid from before the first renewal was sent: that was at the start.
    let lapsed = rig.since_start(Instant::now());
    assert!(
        lapsed >= TTL && lapsed <= TTL + TICK,
        "lapsed after {lapsed:?}"
    );

    let claims = rig.store.claims();
    let second = rig.store.add(email("during the lapse"));
    rig.wake.notify_one();
    rig.at(Duration::from_secs(20)).await;
    assert_eq!(
        rig.store.claims(),
        claims,
        "claimed while the lease was lapsed"
    );
    assert_eq!(rig.store.row(second).attempts, 0);

    rig.store.leases.open();
    let back = *within("the lease returns", rig.lease.wait_for(Option::is_some))
        .await
        .unwrap();
    assert_eq!(back, Some(epoch), "the lease came back under another epoch");
    let row = rig
        .until_row(
            second,
            "the row ingested during the lapse is delivered",
            delivered,
        )
        .await;
    assert_eq!(row.outcomes.len(), 1);
    assert_eq!(row.outcomes[0].epoch, epoch);
    rig.stop().await;
}

/// Six rows due on a channel limited to 2 deliveries a second with a burst of 2, with slots to
/// spare: the burst starts at once, then one delivery every half second, each as soon as its
/// token comes (a sweep woken by the token, not by the poll timer).
#[tokio::test(start_paused = true)]
async fn a_rate_limited_channel_starts_deliveries_at_its_rate() {
    let store = store(smtp(4, Some((2.0, 2))));
    let ids: Vec<_> = (0..6)
        .map(|i| store.add(email(&format!("row {i}"))))
        .collect();
    let rig = Rig::start(store, settings(Duration::from_secs(60))).await;
    rig.script
        .until("every row starts", |log| log.starts.len() == 6)
        .await;
    let starts = rig.script.starts();
    let first = starts[0].at;
    let expected_ms = [0, 0, 500, 1000, 1500, 2000];
    for (start, expected) in starts.iter().zip(expected_ms) {
        let offset = start.at - first;
        let expected = Duration::from_millis(expected);
        assert!(
            offset >= expected && offset <= expected + TICK,
            "{} started {offset:?} after the first, expected {expected:?}",
            start.subject
        );
    }
    for id in ids {
        rig.until_row(id, "every row is delivered", delivered).await;
    }
    rig.stop().await;
}

/// Rows claimed ahead wait in the queue behind a slow delivery; the lease lapses while they
/// wait, and by the time it is renewed they have waited more than half their claim, so they
/// could not finish before a successor may claim them. They are not started: their claims are
/// released at once, each with an attempt that says it was never sent and why (issue 33: they
/// used to be dropped with a log line, left InFlight and delayed by a whole claim timeout), and
/// they are delivered under a new attempt before their first claims would have expired. The
/// slow delivery's outcome, written during the lapse, stands.
#[tokio::test(start_paused = true)]
async fn queued_rows_that_waited_past_half_their_claim_are_given_back() {
    let claim_timeout = Duration::from_secs(10);
    let store = store(smtp(1, None));
    let slow = store.add(email("hold: slow relay"));
    let queued = [store.add(email("queued 1")), store.add(email("queued 2"))];
    let mut rig = Rig::start(store, settings(claim_timeout)).await;
    rig.script
        .until("the slow delivery starts", |log| log.starts.len() == 1)
        .await;
    for id in queued {
        assert_eq!(rig.store.row(id).attempts, 1, "claimed ahead and queued");
    }
    rig.store.leases.close();
    within("the lease lapses", rig.lease.wait_for(Option::is_none))
        .await
        .unwrap();
    rig.at(Duration::from_secs(4)).await;
    rig.script.release_holds();
    rig.until_row(slow, "the slow delivery's outcome is recorded", delivered)
        .await;
    rig.at(Duration::from_secs(6)).await;
    rig.store.leases.open();
    within("the lease returns", rig.lease.wait_for(Option::is_some))
        .await
        .unwrap();

    for id in queued {
        let row = rig
            .until_row(id, "the queued row is delivered", delivered)
            .await;
        assert_eq!(row.attempts, 2);
        assert_eq!(row.outcomes.len(), 2, "{:?}", row.outcomes);
        let released = &row.outcomes[0];
        assert_eq!(
            (released.attempt_no, released.outcome),
            (1, AttemptOutcome::NotSent)
        );
        let why = released.error.as_deref().unwrap_or_default();
        assert!(why.starts_with("not sent: waited"), "{why}");
        assert_eq!(
            (row.outcomes[1].attempt_no, row.outcomes[1].outcome),
            (2, AttemptOutcome::Delivered)
        );
    }
    let starts = rig.script.starts();
    assert_eq!(starts.len(), 3, "{starts:?}");
    for start in &starts[1..] {
        assert_eq!(start.attempt_no, 2, "{start:?}");
        assert!(
            rig.since_start(start.at) < claim_timeout,
            "released at once, not after the claim expired: {start:?}"
        );
    }
    rig.stop().await;
}

/// The database stops answering a channel's calls while rows claimed ahead wait in the queue:
/// the turn woken by an ingested row waits for its settings read, and meanwhile the queued rows
/// start as the slot frees up (a loop that waited for the read would hold them until they were
/// too old to start and gave them back). Once the database answers, the ingested row is claimed
/// and delivered.
#[tokio::test(start_paused = true)]
async fn rows_claimed_ahead_start_while_a_sweep_waits_for_the_database() {
    let claim_timeout = Duration::from_secs(10);
    let store = store(smtp(1, None));
    let first = store.add(email("hold: first"));
    let queued = [store.add(email("queued 1")), store.add(email("queued 2"))];
    let rig = Rig::start(store, settings(claim_timeout)).await;
    rig.script
        .until("the first delivery starts", |log| log.starts.len() == 1)
        .await;
    for id in queued {
        assert_eq!(rig.store.row(id).attempts, 1, "claimed ahead and queued");
    }

    rig.store.sweeps.close();
    rig.config.invalidate();
    let late = rig.store.add(email("ingested while the database is slow"));
    rig.wake.notify_one();
    rig.at(Duration::from_secs(1)).await;
    let waiting = || {
        rig.store
            .sweeps
            .waiting
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    // The email channel's settings read, and the webhook channel's own claim (each channel
    // claims on its own when a row may be due).
    assert_eq!(
        waiting(),
        2,
        "the settings read and the webhook claim are held"
    );

    rig.script.release_holds();
    for id in [first].into_iter().chain(queued) {
        let row = rig.until_row(id, "the row is delivered", delivered).await;
        assert_eq!(row.attempts, 1, "given back: {row:?}");
    }
    assert_eq!(
        rig.since_start(Instant::now()),
        Duration::from_secs(1),
        "the queued rows waited for the database"
    );
    assert_eq!(waiting(), 2, "a call answered while the gate was closed");
    assert_eq!(rig.store.row(late).attempts, 0);

    rig.store.sweeps.open();
    let row = rig
        .until_row(late, "the ingested row is delivered", delivered)
        .await;
    assert_eq!(row.attempts, 1);
    rig.stop().await;
}

/// The database stops answering list reads once the list has been read: a delivery after the
/// copy's `MAX_AGE` uses the copy while the list is read again, instead of waiting for the read
/// (on a slow database, long enough to run out its time bound before calling the relay).
#[tokio::test(start_paused = true)]
async fn a_delivery_uses_the_list_copy_while_the_list_is_read_again() {
    let store = store(smtp(1, None));
    let first = store.add(email("first"));
    let rig = Rig::start(store, settings(Duration::from_secs(60))).await;
    rig.until_row(first, "the first row is delivered", delivered)
        .await;

    rig.store.list_reads.close();
    let later = MAX_AGE + Duration::from_secs(1);
    rig.at(later).await;
    let second = rig.store.add(email("after the copy aged"));
    rig.wake.notify_one();
    let row = rig
        .until_row(second, "the second row is delivered", delivered)
        .await;
    assert_eq!(row.attempts, 1);
    assert_eq!(
        rig.since_start(Instant::now()),
        later,
        "the delivery waited for the list read"
    );
    let waiting = rig
        .store
        .list_reads
        .waiting
        .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(waiting, 1, "one read of the list is under way");
    rig.store.list_reads.open();
    rig.stop().await;
}

/// A channel whose claim came back short is not claimed again for every finished delivery:
/// twenty deliveries on one connection cost the idle webhook channel one empty claim, not
/// twenty, and the email channel one at the end. A row ingested afterwards wakes the loop and
/// is claimed and delivered at once.
#[tokio::test(start_paused = true)]
async fn finished_deliveries_do_not_claim_a_channel_that_had_nothing_due() {
    let store = store(smtp(1, None));
    let ids: Vec<_> = (0..20)
        .map(|i| store.add(email(&format!("row {i}"))))
        .collect();
    let mut settings = settings(Duration::from_secs(60));
    settings.poll_interval = Duration::from_secs(3600);
    let rig = Rig::start(Arc::clone(&store), settings).await;
    for id in &ids {
        rig.until_row(*id, "every row is delivered", delivered)
            .await;
    }
    // Claims of 3 (the free slot plus two per connection) until the rows run out.
    assert_eq!(store.claims(), 7);
    let empty = store.empty_claims();
    assert!(
        empty <= 2,
        "{empty} empty claims for 20 deliveries: finished deliveries claimed idle channels"
    );

    let late = store.add(email("after the backlog"));
    rig.wake.notify_one();
    rig.until_row(late, "the ingested row is delivered", delivered)
        .await;
    assert_eq!(store.claims(), 8);
    rig.stop().await;
}

/// Stepping `dispatch_once` by hand: without the lease a sweep does nothing; with it, a sweep
/// on a channel with two connections claims the free slots plus two rows per connection and
/// starts two; the next sweep, with both slots busy and rows queued, neither claims nor starts.
#[tokio::test(start_paused = true)]
async fn a_sweep_claims_free_slots_plus_two_per_connection_and_starts_the_free_slots() {
    let store = store(smtp(2, None));
    let ids: Vec<_> = (0..10).map(|_| store.add(email("hold"))).collect();
    let script = Arc::new(Script::new());
    let mut dispatcher = dispatcher(
        &store,
        &script,
        settings(Duration::from_secs(60)),
        Arc::new(Notify::new()),
        Arc::new(ConfigCache::new()),
    );
    assert_eq!(
        dispatcher.dispatch_once().await.unwrap(),
        SweepOutcome::NotLeader
    );
    assert_eq!(store.claims(), 0);

    let epoch = store
        .acquire_lease(DISPATCHER_LEASE, "node-under-test", TTL)
        .await
        .unwrap()
        .unwrap();
    let tenure = dispatcher.lease.follow(Some(HeldLease {
        epoch,
        valid_until: Instant::now() + TTL,
    }));
    assert_eq!(tenure, super::lease::Tenure::Kept);
    assert_eq!(
        dispatcher.dispatch_once().await.unwrap(),
        SweepOutcome::Started(2)
    );
    let claimed = ids
        .iter()
        .filter(|id| store.row(**id).attempts == 1)
        .count();
    assert_eq!(claimed, 2 + 2 * 2);
    assert_eq!(
        dispatcher.dispatch_once().await.unwrap(),
        SweepOutcome::Started(0)
    );
    assert_eq!(store.claims(), 1);
    script
        .until("both deliveries are under way", |log| log.starts.len() == 2)
        .await;

    dispatcher.lease.expired();
    assert_eq!(
        dispatcher.dispatch_once().await.unwrap(),
        SweepOutcome::NotLeader
    );
    assert_eq!(store.claims(), 1);
}

/// A database whose claims take five times as long as a delivery (a busy MS SQL server, a relay
/// next door) does not leave the connections waiting for each claim: once the channel has
/// measured both, it claims the next rows while the queue still holds what the connections start
/// meanwhile. Four connections then deliver 400 rows of 2 ms in about 400 / 4 × 2 ms of (paused)
/// time, plus the first claims; claiming only once the queue ran dry took a claim's 10 ms for
/// every 12 rows on top (about 530 ms). Every row is still delivered once, in claim order.
#[tokio::test(start_paused = true)]
async fn a_slow_database_is_claimed_ahead_so_the_connections_never_wait_for_it() {
    const ROWS: usize = 400;
    const CONNECTIONS: u32 = 4;
    let store = store(smtp(CONNECTIONS, None));
    let claim_latency = SLOW_DELIVERY * 5;
    store.set_claim_latency(claim_latency);
    let ids: Vec<_> = (0..ROWS)
        .map(|i| store.add(email(&format!("slow {i:03}"))))
        .collect();
    let mut settings = settings(Duration::from_secs(60));
    settings.poll_interval = Duration::from_secs(3600);
    let rig = Rig::start(Arc::clone(&store), settings).await;
    for id in &ids {
        rig.until_row(*id, "every row is delivered", delivered)
            .await;
    }
    let starts = rig.script.starts();
    assert_eq!(starts.len(), ROWS, "each row is delivered once");
    let first = starts.first().unwrap().at;
    let last = starts.last().unwrap().at;
    // Busy connections the whole way: the last start comes one delivery per connection's
    // share after the first, give or take the few claims before both times were measured.
    let busy = SLOW_DELIVERY * (ROWS as u32 / CONNECTIONS);
    let spent = last - first;
    assert!(
        spent <= busy + claim_latency * 3,
        "{ROWS} deliveries of {SLOW_DELIVERY:?} on {CONNECTIONS} connections took {spent:?}: \
         the connections waited for claims (busy throughout: {busy:?})"
    );
    rig.stop().await;
}

/// A shutdown whose drain outlasts `drain_timeout` on one channel (a webhook delivery that
/// never answers) after the other channel's loop has already stopped: the delivery under way is
/// cancelled at the timeout, its row stays claimed with no outcome (due again once its claim
/// expires), and the dispatcher stops cleanly. It once panicked here, awaiting again the email
/// loop it had already seen finish, and the service's `run` then failed at shutdown.
#[tokio::test(start_paused = true)]
async fn a_drain_that_times_out_on_one_channel_cancels_it_and_stops_cleanly() {
    let store = store(smtp(1, None));
    let id = store.add(webhook("hold: an endpoint that never answers"));
    let settings = settings(Duration::from_secs(60));
    let drain_timeout = settings.drain_timeout;
    let rig = Rig::start(store, settings).await;
    rig.script
        .until("the delivery starts", |log| log.starts.len() == 1)
        .await;

    let stopped_at = Instant::now();
    rig.shutdown.cancel();
    let stopped = within("the dispatcher stops", rig.task).await;
    assert!(
        stopped.is_ok(),
        "the dispatcher failed to stop: {stopped:?}"
    );
    let cancelled = rig.script.cancelled();
    assert_eq!(cancelled.len(), 1, "the held delivery is cancelled once");
    let waited = cancelled[0] - stopped_at;
    assert!(
        waited >= drain_timeout && waited <= drain_timeout + TICK,
        "cancelled {waited:?} after the stop, not at the drain timeout ({drain_timeout:?})"
    );
    let row = rig.store.row(id);
    assert!(row.outcomes.is_empty(), "recorded: {:?}", row.outcomes);
    assert_eq!(row.status, Status::Pending);
    assert_eq!(row.attempts, 1);
}
