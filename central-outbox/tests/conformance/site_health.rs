//! Site health: the store keeps the latest report per (site, node), stamped with the database's
//! clock, and reads them with that clock, so a node that goes silent turns offline once its
//! report is `site_offline_after` old and online again with its next report.

use std::time::Duration;

use chrono::{DateTime, Utc};

use central_outbox::domain::SiteId;
use central_outbox::domain::site_health::{NodeHealth, NodeRole, SiteHealthReport};
use central_outbox::store::OutboxStore;

use crate::poll::until;

/// How long a test waits for the database's clock to move past a threshold.
const DEADLINE: Duration = Duration::from_secs(60);

fn report(site: &str, node: &str, depth: u64) -> SiteHealthReport {
    SiteHealthReport {
        site: SiteId::parse(site.into()).unwrap(),
        node: SiteId::parse(node.into()).unwrap(),
        role: NodeRole::Active,
        buffer_depth: depth,
        oldest_buffered_age: Duration::from_millis(1500),
        last_forward_at: None,
        standby_lag_rows: 0,
        standby_lag: Duration::ZERO,
        version: "0.1.0".into(),
        central_reachable: true,
        rejected: 0,
        sends_refused: false,
    }
}

/// A timestamp as the stores keep it (milliseconds).
fn millis(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap()
}

async fn node<S: OutboxStore>(store: &S, node: &str, offline_after: Duration) -> NodeHealth {
    let snapshot = store.site_health().await.unwrap();
    snapshot
        .assess(offline_after)
        .into_iter()
        .find(|n| n.stored.report.node.as_str() == node)
        .unwrap_or_else(|| panic!("no report of {node}"))
}

pub async fn site_health_keeps_the_latest_report_per_node<S: OutboxStore>(store: &S) {
    assert!(store.site_health().await.unwrap().nodes.is_empty());

    let first = report("north", "north-a", 5);
    store.record_site_health(first).await.unwrap();
    let standby = SiteHealthReport {
        role: NodeRole::Standby,
        central_reachable: false,
        ..report("north", "north-b", 4)
    };
    store.record_site_health(standby.clone()).await.unwrap();
    store
        .record_site_health(report("east", "east", 0))
        .await
        .unwrap();
    let before = store.site_health().await.unwrap();
    let first_received = before
        .nodes
        .iter()
        .find(|n| n.report.node.as_str() == "north-a")
        .unwrap()
        .received_at;

    // A newer report of the same node replaces the older one, every field of it.
    let forwarded = Utc::now() - chrono::Duration::seconds(3);
    let latest = SiteHealthReport {
        buffer_depth: 42,
        oldest_buffered_age: Duration::from_millis(61_250),
        last_forward_at: Some(millis(forwarded)),
        standby_lag_rows: 3,
        standby_lag: Duration::from_millis(750),
        version: "0.2.0".into(),
        central_reachable: false,
        rejected: 2,
        sends_refused: true,
        ..report("north", "north-a", 0)
    };
    store.record_site_health(latest.clone()).await.unwrap();

    let after = store.site_health().await.unwrap();
    let order: Vec<(&str, &str)> = after
        .nodes
        .iter()
        .map(|n| (n.report.site.as_str(), n.report.node.as_str()))
        .collect();
    assert_eq!(
        order,
        [("east", "east"), ("north", "north-a"), ("north", "north-b")],
        "one row per node, by site then node"
    );
    let north_a = &after.nodes[1];
    assert_eq!(north_a.report, latest);
    assert!(north_a.received_at >= first_received);
    assert!(after.read_at >= north_a.received_at);
    assert_eq!(after.nodes[2].report, standby);
}

pub async fn a_silent_node_goes_offline_and_a_report_brings_it_back<S: OutboxStore>(store: &S) {
    // Long enough for any read right after a write, on a slow server, to fall within it.
    let offline_after = Duration::from_secs(2);
    store
        .record_site_health(report("north", "north-a", 1))
        .await
        .unwrap();
    let fresh = node(store, "north-a", offline_after).await;
    assert!(fresh.online, "just reported: {fresh:?}");
    assert_eq!(fresh.offline_since, None);

    // Nothing is written while the node is silent; the database's clock alone makes it offline.
    let gone = until("the silent node goes offline", DEADLINE, || async {
        let now = node(store, "north-a", offline_after).await;
        (!now.online).then_some(now)
    })
    .await;
    assert!(gone.report_age >= offline_after);
    let since = gone.offline_since.unwrap();
    assert_eq!(
        since,
        gone.stored.received_at + chrono::Duration::from_std(offline_after).unwrap()
    );
    // Still known, with its last figures, while offline.
    assert_eq!(gone.stored.report.buffer_depth, 1);
    // Under the default threshold it is still online.
    assert!(
        node(store, "north-a", Duration::from_secs(180))
            .await
            .online
    );

    store
        .record_site_health(report("north", "north-a", 9))
        .await
        .unwrap();
    let back = node(store, "north-a", offline_after).await;
    assert!(back.online, "reported again: {back:?}");
    assert_eq!(back.offline_since, None);
    assert_eq!(back.stored.report.buffer_depth, 9);
    assert!(back.stored.received_at > gone.stored.received_at);
}
