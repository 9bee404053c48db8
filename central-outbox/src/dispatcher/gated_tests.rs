//! The dispatcher and its lease against a real SQLite store whose bulk calls (claims, outcomes)
//! can be held at a gate: the lease must stay held, with one epoch, however long the bulk work
//! waits, and a graceful shutdown must keep it while deliveries drain.
//!
//! Every wait is for a condition (a renewal count, a row's status) with a deadline; the gate
//! makes "the database is slow" deterministic instead of a matter of timing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_domain::ScriptOrigin;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::config_cache::ConfigCache;
use crate::delivery::Adapters;
use crate::dispatcher::{DISPATCHER_LEASE, Dispatcher, DispatcherSettings};
use crate::domain::channel::{NotificationList, SmtpSettings, Stored, WebhookSettings};
use crate::domain::serve_order::ClaimLanes;
use crate::domain::status::Status;
use crate::domain::{
    ListName, NotificationContent, NotificationId, NotificationType, SiteId, Submission,
};
use crate::metrics::Metrics;
use crate::records::{
    AttemptRecord, ClaimedNotification, LeaseEpoch, NewNotification, PurgeReport,
};
use crate::store::sqlite::SqliteStore;
use crate::store::{
    AdminStore, ChannelSettingsStore, DispatchStore, IngestStore, ReadChannelSettings, Result,
};
use crate::testing::{Gate, email};

/// Far longer than a healthy run needs; reaching it fails the test.
const DEADLINE: Duration = Duration::from_secs(30);

/// SQLite with gates in front of claims, outcomes and lease renewals, counting renewals. It
/// stands in for the store's dispatch capability, all the dispatcher uses; the tests put rows
/// in and look at them through the SQLite store itself (`inner`).
#[derive(Debug)]
struct GatedStore {
    inner: SqliteStore,
    claims: Gate,
    outcomes: Gate,
    leases: Gate,
    renewals: AtomicUsize,
    /// Outcome writes still to fail, as SQLite's fail on a full disk.
    failing_outcome_writes: AtomicUsize,
    /// Reads of the SMTP settings, and claims of email rows, still to fail.
    failing_smtp_reads: AtomicUsize,
    failing_email_claims: AtomicUsize,
}

/// Takes one of `failures` if any is left: the call it stands for fails.
fn fails(failures: &AtomicUsize) -> Result<()> {
    match failures.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)) {
        Ok(_) => Err(crate::store::StoreError::Unavailable(
            "database or disk is full".into(),
        )),
        Err(_) => Ok(()),
    }
}

impl ReadChannelSettings for GatedStore {
    async fn list(&self, name: &ListName) -> Result<Option<Stored<NotificationList>>> {
        self.inner.list(name).await
    }
    async fn smtp_settings(&self) -> Result<Option<Stored<SmtpSettings>>> {
        fails(&self.failing_smtp_reads)?;
        self.inner.smtp_settings().await
    }
    async fn webhook_settings(&self) -> Result<Option<Stored<WebhookSettings>>> {
        self.inner.webhook_settings().await
    }
}

impl DispatchStore for GatedStore {
    async fn acquire_lease(
        &self,
        name: &'static str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<LeaseEpoch>> {
        self.leases.pass().await;
        let held = self.inner.acquire_lease(name, holder, ttl).await;
        if matches!(held, Ok(Some(_))) {
            self.renewals.fetch_add(1, Ordering::SeqCst);
        }
        held
    }
    async fn release_lease(
        &self,
        name: &'static str,
        holder: &str,
        epoch: LeaseEpoch,
    ) -> Result<bool> {
        self.inner.release_lease(name, holder, epoch).await
    }
    async fn read_lease(&self, name: &'static str) -> Result<crate::records::LeaseReading> {
        self.inner.read_lease(name).await
    }
    async fn claim_due(
        &self,
        lease: &'static str,
        epoch: LeaseEpoch,
        kind: NotificationType,
        lanes: ClaimLanes,
        claim_timeout: Duration,
    ) -> Result<Vec<ClaimedNotification>> {
        self.claims.pass().await;
        if kind == NotificationType::Email {
            fails(&self.failing_email_claims)?;
        }
        self.inner
            .claim_due(lease, epoch, kind, lanes, claim_timeout)
            .await
    }
    async fn next_due_in(&self, kind: NotificationType) -> Result<Option<Duration>> {
        // Not gated: part of a claim's answer, which these tests hold at the claim itself.
        self.inner.next_due_in(kind).await
    }
    async fn claim_digest(
        &self,
        lease: &'static str,
        epoch: LeaseEpoch,
        kind: NotificationType,
        digest: NotificationId,
        claim_timeout: Duration,
    ) -> Result<Vec<ClaimedNotification>> {
        // Not gated: these tests hold the claims of rows, and no list here consolidates.
        self.inner
            .claim_digest(lease, epoch, kind, digest, claim_timeout)
            .await
    }
    async fn record_outcomes(
        &self,
        lease: &'static str,
        records: Vec<AttemptRecord>,
    ) -> Result<Vec<bool>> {
        self.outcomes.pass().await;
        fails(&self.failing_outcome_writes)?;
        self.inner.record_outcomes(lease, records).await
    }
    async fn purge_terminal(
        &self,
        resolved_before: DateTime<Utc>,
        batch: u32,
    ) -> Result<PurgeReport> {
        self.inner.purge_terminal(resolved_before, batch).await
    }
    async fn forget_silent_nodes(&self, silent_for: Duration) -> Result<Vec<(SiteId, SiteId)>> {
        self.inner.forget_silent_nodes(silent_for).await
    }
}

/// A running dispatcher over a gated store with one due email notification. No SMTP relay is
/// configured, so its delivery parks it at once: every delay comes from the gates.
struct Rig {
    store: Arc<GatedStore>,
    metrics: Arc<Metrics>,
    id: NotificationId,
    lease: watch::Receiver<Option<LeaseEpoch>>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// The lease lasts 300 ms and is renewed every 100 ms, so a renewal held up behind bulk work
/// would lose it within a few hundred milliseconds.
const TTL: Duration = Duration::from_millis(300);

async fn start() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let inner = SqliteStore::open(
        &dir.path().join("central.db"),
        group_commit::Durability::Full,
    )
    .unwrap();
    let store = Arc::new(GatedStore {
        inner,
        claims: Gate::closed(),
        outcomes: Gate::closed(),
        leases: Gate::closed(),
        renewals: AtomicUsize::new(0),
        failing_outcome_writes: AtomicUsize::new(0),
        failing_smtp_reads: AtomicUsize::new(0),
        failing_email_claims: AtomicUsize::new(0),
    });
    let content = NotificationContent::parse(
        NotificationType::Email,
        "ops".into(),
        "Tank 4 high level".into(),
        "level 97%".into(),
        String::new(),
    )
    .unwrap();
    let origin = ScriptOrigin::parse("node-1".into(), "alarm.py".into(), None, None).unwrap();
    let id = NotificationId::generate();
    store
        .inner
        .submit(vec![NewNotification::new(Submission {
            id,
            content,
            provenance: origin.at_site(SiteId::parse("site-a".into()).unwrap(), Utc::now()),
            priority: Default::default(),
            condition_key: None,
            cleared_at_site: None,
            deliver_after: None,
        })])
        .await
        .unwrap();
    let settings = DispatcherSettings {
        node_id: "node-under-test".into(),
        poll_interval: Duration::from_millis(50),
        lease_ttl: TTL,
        renew_interval: TTL / 3,
        claim_timeout: Duration::from_secs(60),
        drain_timeout: Duration::from_secs(20),
        claim_batch: None,
        failover: Default::default(),
    };
    let metrics = Arc::new(Metrics::new());
    let dispatcher = Dispatcher::new(
        Arc::clone(&store),
        Arc::clone(&metrics),
        Arc::new(Adapters::new().unwrap()),
        Arc::new(ConfigCache::new()),
        settings,
        Arc::new(Notify::new()),
    );
    let lease = dispatcher.lease_watch();
    store.leases.open();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(dispatcher.run(shutdown.clone()));
    Rig {
        store,
        metrics,
        id,
        lease,
        shutdown,
        task,
        _dir: dir,
    }
}

/// Polls `check` every few milliseconds until it holds, or fails after [`DEADLINE`].
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let started = tokio::time::Instant::now();
    while !check() {
        assert!(
            started.elapsed() < DEADLINE,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Records every lease value the dispatcher publishes.
fn watch_lease(
    mut lease: watch::Receiver<Option<LeaseEpoch>>,
) -> Arc<std::sync::Mutex<Vec<Option<LeaseEpoch>>>> {
    let seen = Arc::new(std::sync::Mutex::new(vec![*lease.borrow_and_update()]));
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        while lease.changed().await.is_ok() {
            let now = *lease.borrow_and_update();
            record.lock().unwrap().push(now);
        }
    });
    seen
}

/// Waits until the rig's row is Parked, where its one attempt takes it (the rig stores no list
/// "ops"), failing with `what` after [`DEADLINE`].
async fn until_parked(rig: &Rig, what: &str) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while status(&rig.store, rig.id).await != Status::Parked {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn status(store: &GatedStore, id: NotificationId) -> Status {
    store.inner.state(id).await.unwrap().unwrap().status
}

/// A claim stuck in the database for many lease lifetimes: renewals go on meanwhile, the lease
/// never lapses and keeps its epoch, and the row is delivered (here: parked) once the claim
/// gets through. Before the lease had a task of its own, the sweep waiting on the claim held
/// up renewal and the node lost its lease after one TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_kept_while_a_claim_is_stalled() {
    let rig = start().await;
    let seen = watch_lease(rig.lease.clone());
    until("the dispatcher is waiting on its claim", || {
        rig.store.claims.waiting.load(Ordering::SeqCst) > 0
    })
    .await;
    let renewed = rig.store.renewals.load(Ordering::SeqCst);
    // Ten renewals: over three lease lifetimes with the claim still held.
    until("ten more renewals", || {
        rig.store.renewals.load(Ordering::SeqCst) >= renewed + 10
    })
    .await;
    assert!(rig.store.claims.waiting.load(Ordering::SeqCst) > 0);
    rig.store.claims.open();
    rig.store.outcomes.open();
    until_parked(&rig, "never delivered").await;
    let seen = seen.lock().unwrap().clone();
    let held: Vec<Option<LeaseEpoch>> = seen.into_iter().skip_while(Option::is_none).collect();
    assert!(
        held.iter().all(|l| *l == held[0] && l.is_some()),
        "the lease was lost or re-taken: {held:?}"
    );
    rig.shutdown.cancel();
    rig.task.await.unwrap();
}

/// A graceful shutdown while an outcome is still being written: the lease is renewed during
/// the drain, the outcome is recorded, and then the lease is released (another node gets it at
/// once, with a new epoch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_keeps_the_lease_while_draining_then_releases_it() {
    let rig = start().await;
    rig.store.claims.open();
    until("the outcome is waiting to be written", || {
        rig.store.outcomes.waiting.load(Ordering::SeqCst) > 0
    })
    .await;
    let epoch = rig.lease.borrow().expect("the dispatcher holds the lease");
    rig.shutdown.cancel();
    let renewed = rig.store.renewals.load(Ordering::SeqCst);
    until("renewals go on while draining", || {
        rig.store.renewals.load(Ordering::SeqCst) >= renewed + 6
    })
    .await;
    assert!(
        !rig.task.is_finished(),
        "shutdown did not wait for the drain"
    );
    rig.store.outcomes.open();
    rig.task.await.unwrap();
    assert_eq!(status(&rig.store, rig.id).await, Status::Parked);
    let successor = rig
        .store
        .acquire_lease(DISPATCHER_LEASE, "successor", TTL)
        .await
        .unwrap()
        .expect("the lease was released at shutdown");
    assert!(successor > epoch);
}

/// The database stops answering lease renewals for longer than the TTL while a delivery's
/// outcome is being written. The node's lease lapses (it stops claiming), the outcome is still
/// recorded because nobody else took the lease, and when renewals come back the node re-takes
/// the lease with the same epoch: the delivered notification is not sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_written_while_the_lease_lapsed_stands() {
    let mut rig = start().await;
    rig.store.claims.open();
    until("the outcome is waiting to be written", || {
        rig.store.outcomes.waiting.load(Ordering::SeqCst) > 0
    })
    .await;
    let epoch = rig.lease.borrow().expect("the dispatcher holds the lease");
    rig.store.leases.close();
    rig.lease.wait_for(Option::is_none).await.unwrap();
    rig.store.outcomes.open();
    until_parked(&rig, "the outcome written during the lapse was refused").await;
    rig.store.leases.open();
    let back = *rig.lease.wait_for(Option::is_some).await.unwrap();
    assert_eq!(back, Some(epoch), "the lease came back under another epoch");
    let history = rig
        .store
        .inner
        .detail(rig.id)
        .await
        .unwrap()
        .unwrap()
        .history;
    assert_eq!(history.len(), 1, "attempted again: {history:?}");
    rig.shutdown.cancel();
    rig.task.await.unwrap();
}

/// An outcome write that fails for a while (the database's disk full, then freed) is tried
/// again, so the row is not delivered a second time once its claim expires: it reaches its end
/// status with a single attempt, long before the claim (60 s) could expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_whose_write_fails_for_a_while_is_written_when_it_can_be() {
    let rig = start().await;
    rig.store.failing_outcome_writes.store(3, Ordering::SeqCst);
    rig.store.claims.open();
    rig.store.outcomes.open();
    until_parked(&rig, "the outcome was not written after the failures").await;
    assert_eq!(rig.store.failing_outcome_writes.load(Ordering::SeqCst), 0);
    let history = rig
        .store
        .inner
        .detail(rig.id)
        .await
        .unwrap()
        .unwrap()
        .history;
    assert_eq!(history.len(), 1, "attempted again: {history:?}");
    rig.shutdown.cancel();
    rig.task.await.unwrap();
}

/// A claim the store refuses, and a read of the settings it claims with, are counted where an
/// alert rule sees them, and tried again: the row is settled once the store answers, in one
/// attempt.
#[tokio::test]
async fn claims_the_store_refuses_are_counted_and_tried_again() {
    let rig = start().await;
    rig.store.failing_smtp_reads.store(2, Ordering::SeqCst);
    rig.store.failing_email_claims.store(3, Ordering::SeqCst);
    rig.store.claims.open();
    rig.store.outcomes.open();
    until_parked(&rig, "the row was not claimed after the failures").await;
    let text = rig.metrics.render();
    for (step, failed) in [("settings", 2), ("claim", 3)] {
        let series = format!(
            "outbox_dispatcher_claim_failures_total{{channel=\"Email\",step=\"{step}\"}} {failed}\n"
        );
        assert!(text.contains(&series), "{series}{text}");
    }
    let history = rig
        .store
        .inner
        .detail(rig.id)
        .await
        .unwrap()
        .unwrap()
        .history;
    assert_eq!(history.len(), 1, "{history:?}");
    rig.shutdown.cancel();
    rig.task.await.unwrap();
}

/// Delivers by script, by subject: "panic" panics, "hold" waits until released, anything else
/// is delivered at once.
#[derive(Debug, Default)]
struct ScriptedDelivery {
    release: Notify,
    held: AtomicUsize,
}

impl crate::delivery::Deliver for ScriptedDelivery {
    async fn deliver(
        &self,
        _channel: &crate::delivery::ChannelSettings,
        _list: &NotificationList,
        n: &ClaimedNotification,
        _turn: crate::delivery::Turn,
    ) -> std::result::Result<
        crate::domain::delivery::Delivered,
        crate::domain::delivery::DeliveryError,
    > {
        match n.content.subject.as_str() {
            "panic" => panic!("scripted adapter bug"),
            "hold" => {
                self.held.fetch_add(1, Ordering::SeqCst);
                self.release.notified().await;
            }
            _ => {}
        }
        Ok(crate::domain::delivery::Delivered {
            resolved_targets: vec!["ops@plant.test".into()],
        })
    }
}

/// A delivery that panics costs only its own attempt: with two slots, one held by a slow
/// delivery and one by the panicking one, the third row starts as soon as the panic is caught
/// (it used to wait for the slow delivery: the panicked task's slot was only recounted once
/// every delivery under way had finished). The panicked attempt is recorded as a transient
/// failure, so the row is retried later like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_delivery_frees_its_slot_and_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        SqliteStore::open(
            &dir.path().join("central.db"),
            group_commit::Durability::Full,
        )
        .unwrap(),
    );
    let list = NotificationList::parse(crate::domain::channel::ListInput {
        name: "ops".into(),
        recipients: vec!["ops@plant.test".into()],
        ..Default::default()
    })
    .unwrap();
    store.upsert_list(list).await.unwrap();
    let mut smtp = crate::config::SmtpConfig::new("127.0.0.1", 25, "outbox@plant.test");
    smtp.max_concurrent_connections = 2;
    smtp.retry_delay = Duration::from_secs(3600);
    let config = crate::config::Config {
        smtp: Some(smtp),
        ..Default::default()
    };
    let settings = config.validate().unwrap();
    store
        .put_smtp_settings(settings.smtp.clone().unwrap())
        .await
        .unwrap();
    let (held, panicking, after) = (email("hold"), email("panic"), email("after"));
    let ids = [
        held.submission.id,
        panicking.submission.id,
        after.submission.id,
    ];
    for row in [held, panicking, after] {
        // One by one: claims take the oldest first, so "hold" and "panic" take the two slots.
        store.submit(vec![row]).await.unwrap();
    }
    let delivery = Arc::new(ScriptedDelivery::default());
    let dispatcher = Dispatcher::new(
        Arc::clone(&store),
        Arc::new(Metrics::new()),
        Arc::clone(&delivery),
        Arc::new(ConfigCache::new()),
        DispatcherSettings {
            node_id: "node-under-test".into(),
            poll_interval: Duration::from_secs(3600),
            lease_ttl: Duration::from_secs(30),
            renew_interval: Duration::from_secs(10),
            claim_timeout: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(20),
            claim_batch: None,
            failover: Default::default(),
        },
        Arc::new(Notify::new()),
    );
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(dispatcher.run(shutdown.clone()));

    let state = |id| {
        let store = Arc::clone(&store);
        async move { store.state(id).await.unwrap().unwrap() }
    };
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while state(ids[2]).await.status != Status::Delivered {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the row after the panic never started while the slow delivery held its slot"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(delivery.held.load(Ordering::SeqCst), 1);
    assert_eq!(state(ids[0]).await.status, Status::Pending, "still held");
    let panicked = state(ids[1]).await;
    assert_eq!(panicked.status, Status::Retrying);
    assert_eq!(
        panicked.last_error.as_deref(),
        Some("the delivery attempt panicked: scripted adapter bug")
    );

    delivery.release.notify_one();
    while state(ids[0]).await.status != Status::Delivered {
        assert!(tokio::time::Instant::now() < deadline, "never delivered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    task.await.unwrap();
}
