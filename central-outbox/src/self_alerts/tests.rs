//! The watch against a real SQLite store: what it stores, where, and once. A missing leader
//! noticed by two replicas is one alert, and one recovery that supersedes it while it waits; a
//! failing channel goes out on the other channel's list; a watch started afresh (a restart, a
//! new leader) takes up what is raised instead of raising it again, and recovers it.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::{Notify, watch};

use super::{SelfAlertSettings, SelfWatch, WatchParts};
use crate::dispatcher::DISPATCHER_LEASE;
use crate::domain::delivery::AttemptOutcome;
use crate::domain::query::{NotificationFilter, PageRequest};
use crate::domain::self_alert::Routes;
use crate::domain::{ListName, NotificationType, SiteId};
use crate::kpi_gauges::{Figures, KpiGauges, ReadKpis};
use crate::metrics::Metrics;
use crate::records::LeaseEpoch;
use crate::store::sqlite::SqliteStore;
use crate::store::{AdminStore, DispatchStore};
use crate::tls::WatchedCertificate;

fn settings() -> SelfAlertSettings {
    SelfAlertSettings {
        routes: Routes {
            email: Some(ListName::parse("ops".into()).unwrap()),
            webhook: Some(ListName::parse("hooks".into()).unwrap()),
        },
        check_interval: Duration::from_millis(100),
        recover_after: Duration::ZERO,
        channel_failures: 3,
        channel_max_wait: Duration::from_secs(3600),
        parked_rise: 10,
        parked_window: Duration::from_secs(60),
        held_grace: Duration::from_secs(60),
        task_restarts: 3,
        task_restart_window: Duration::from_secs(60),
        no_leader_after: Duration::ZERO,
        certificate_expiry: Duration::from_secs(14 * 24 * 3600),
        heartbeat: None,
    }
}

struct Node {
    watch: SelfWatch<SqliteStore>,
    metrics: Arc<Metrics>,
}

/// A watch of node `node` on `store`; it dispatches while `lease` says so.
fn node(
    store: &Arc<SqliteStore>,
    node: &str,
    lease: watch::Receiver<Option<LeaseEpoch>>,
    certificates: Vec<WatchedCertificate>,
) -> Node {
    let metrics = Arc::new(Metrics::new());
    let read: ReadKpis = Box::new(|| Box::pin(async { Ok(Figures::default()) }));
    let kpis = KpiGauges::new(read, Arc::clone(&metrics));
    let watch = SelfWatch::new(WatchParts {
        store: Arc::clone(store),
        metrics: Arc::clone(&metrics),
        kpis,
        settings: settings(),
        site_offline_after: Duration::from_secs(180),
        node_id: node.into(),
        lease,
        certificates,
        wake: Arc::new(Notify::new()),
    });
    Node { watch, metrics }
}

fn store() -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(
        &dir.path().join("central.db"),
        group_commit::Durability::Full,
    )
    .unwrap();
    (dir, Arc::new(store))
}

/// Central's rows of `key`, oldest first: (list, subject, status).
async fn rows(store: &SqliteStore, key: &str) -> Vec<(String, String, String)> {
    let page = store
        .query(PageRequest {
            filter: NotificationFilter {
                source_site_id: Some(SiteId::CENTRAL.into()),
                condition_key: Some(key.into()),
                ..NotificationFilter::default()
            },
            after: None,
            size: 100,
        })
        .await
        .unwrap();
    page.rows
        .into_iter()
        .rev()
        .map(|r| (r.list_name, r.subject, r.status.as_str().to_owned()))
        .collect()
}

fn row(list: &str, subject: &str, status: &str) -> (String, String, String) {
    (list.into(), subject.into(), status.into())
}

#[tokio::test]
async fn no_leader_is_one_alert_from_every_replica_and_one_recovery() {
    let (_dir, store) = store();
    let (_lease, none) = watch::channel(None);
    let a = node(&store, "a", none.clone(), Vec::new());
    let b = node(&store, "b", none.clone(), Vec::new());
    // Held, then given up, and nobody took it.
    let epoch = store
        .acquire_lease(DISPATCHER_LEASE, "old", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    assert!(
        store
            .release_lease(DISPATCHER_LEASE, "old", epoch)
            .await
            .unwrap()
    );
    for _ in 0..3 {
        a.watch.check_once(Utc::now()).await;
        b.watch.check_once(Utc::now()).await;
    }
    let alert = "[outbox ALERT] no dispatcher leader";
    let mut expected = vec![row("hooks", alert, "Pending"), row("ops", alert, "Pending")];
    let mut stored = rows(&store, "outbox/no-leader").await;
    stored.sort();
    assert_eq!(stored, expected, "one alert per list, from both replicas");

    // A node takes the lease: the alerts still waiting (nobody dispatched them) are superseded
    // by the recovery, which goes out.
    store
        .acquire_lease(DISPATCHER_LEASE, "new", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    for _ in 0..3 {
        b.watch.check_once(Utc::now()).await;
        a.watch.check_once(Utc::now()).await;
    }
    let recovered = "[outbox RECOVERED] no dispatcher leader";
    expected = vec![
        row("hooks", alert, "Superseded"),
        row("hooks", recovered, "Pending"),
        row("ops", alert, "Superseded"),
        row("ops", recovered, "Pending"),
    ];
    let mut stored = rows(&store, "outbox/no-leader").await;
    stored.sort();
    assert_eq!(stored, expected);
    let raised = |m: &Metrics| {
        metrics_endpoint::sample(
            &m.render(),
            "outbox_self_alerts_raised_total{condition=\"no_leader\"}",
        )
        .unwrap()
    };
    assert_eq!(
        raised(&a.metrics) + raised(&b.metrics),
        2.0,
        "two rows stored in all"
    );
}

#[tokio::test]
async fn a_failing_channel_goes_out_on_the_other_list_and_a_new_leader_recovers_it() {
    let (_dir, store) = store();
    let (lease, dispatching) = watch::channel(Some(LeaseEpoch(1)));
    let expiring = WatchedCertificate {
        key: "cert",
        subject: "central.plant".into(),
        not_after: Utc::now() + chrono::Duration::days(3),
        fingerprint: "ab".repeat(32),
    };
    let leader = node(&store, "a", dispatching.clone(), vec![expiring.clone()]);
    for _ in 0..3 {
        leader.metrics.attempt_finished(
            NotificationType::Email,
            AttemptOutcome::TransientFailure,
            Duration::ZERO,
        );
    }
    leader.watch.check_once(Utc::now()).await;
    leader.watch.check_once(Utc::now()).await;
    let key = "outbox/channel-failing/email";
    assert_eq!(
        rows(&store, key).await,
        vec![row(
            "hooks",
            "[outbox ALERT] channel Email failing",
            "Pending"
        )],
        "only through the webhook list"
    );
    let certificate = rows(&store, "outbox/certificate-expiring/abababababababab").await;
    assert_eq!(certificate.len(), 2, "{certificate:?}");
    assert!(
        certificate[0].1.contains("central.plant"),
        "{certificate:?}"
    );

    // The lease passes to another node, whose watch starts afresh: it takes up what is raised
    // (nothing sent again), and when its own deliveries go through it recovers it.
    lease.send_replace(None);
    leader.watch.check_once(Utc::now()).await;
    let (_next_lease, next_dispatching) = watch::channel(Some(LeaseEpoch(2)));
    let next = node(&store, "b", next_dispatching, vec![expiring]);
    next.watch.check_once(Utc::now()).await;
    assert_eq!(rows(&store, key).await.len(), 1, "not raised again");
    assert_eq!(
        rows(&store, "outbox/certificate-expiring/abababababababab")
            .await
            .len(),
        2
    );
    next.metrics.attempt_finished(
        NotificationType::Email,
        AttemptOutcome::Delivered,
        Duration::ZERO,
    );
    next.watch.check_once(Utc::now()).await;
    assert_eq!(
        rows(&store, key).await,
        vec![
            row(
                "hooks",
                "[outbox ALERT] channel Email failing",
                "Superseded"
            ),
            row(
                "hooks",
                "[outbox RECOVERED] channel Email failing",
                "Pending"
            ),
        ]
    );
    let active = metrics_endpoint::sample(
        &next.metrics.render(),
        "outbox_self_alerts_active{condition=\"certificate_expiring\"}",
    );
    assert_eq!(active, Some(1.0), "still expiring, still raised");
}
