//! Site health: the store keeps the latest report per (site, node), stamped with the database's
//! clock, and reads them with that clock, so a node that goes silent turns offline once its
//! report is `site_offline_after` old and online again with its next report. It keeps at most
//! `MAX_NODES_PER_SITE` nodes a site, and forgets the nodes silent for the retention by the
//! same clock.

use std::time::Duration;

use chrono::{DateTime, Utc};

use central_outbox::domain::SiteId;
use central_outbox::domain::site_health::{
    MAX_NODES_PER_SITE, NodeHealth, NodeRole, SiteHealthReport, SiteHealthWrite,
};
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

pub(crate) async fn site_health_keeps_the_latest_report_per_node<S: OutboxStore>(store: &S) {
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

pub(crate) async fn a_silent_node_goes_offline_and_a_report_brings_it_back<S: OutboxStore>(
    store: &S,
) {
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

/// The (site, node) pairs stored, in the store's order (by site, then node).
async fn stored_nodes<S: OutboxStore>(store: &S) -> Vec<(String, String)> {
    store
        .site_health()
        .await
        .unwrap()
        .nodes
        .into_iter()
        .map(|n| {
            (
                n.report.site.as_str().to_owned(),
                n.report.node.as_str().to_owned(),
            )
        })
        .collect()
}

pub(crate) async fn a_site_keeps_at_most_its_bound_of_nodes_and_silent_ones_are_forgotten<
    S: OutboxStore,
>(
    store: &S,
) {
    let node = |i: usize| format!("north-{i:02}");
    for i in 0..MAX_NODES_PER_SITE {
        let written = store
            .record_site_health(report("north", &node(i), 1))
            .await
            .unwrap();
        assert_eq!(written, SiteHealthWrite::Stored, "{}", node(i));
    }
    // One more node of a full site: refused, nothing stored.
    let extra = node(MAX_NODES_PER_SITE);
    assert_eq!(
        store
            .record_site_health(report("north", &extra, 1))
            .await
            .unwrap(),
        SiteHealthWrite::SiteFull
    );
    assert_eq!(stored_nodes(store).await.len(), MAX_NODES_PER_SITE);
    // A node already stored still reports, and another site has its own places.
    assert_eq!(
        store
            .record_site_health(report("north", &node(3), 7))
            .await
            .unwrap(),
        SiteHealthWrite::Stored
    );
    assert_eq!(
        store
            .record_site_health(report("south", "south-a", 1))
            .await
            .unwrap(),
        SiteHealthWrite::Stored
    );

    // Nothing is silent for an hour yet.
    assert!(
        store
            .forget_silent_nodes(Duration::from_secs(3600))
            .await
            .unwrap()
            .is_empty()
    );
    // Wait (by the database's clock) until every report so far is older than `old`, then
    // report two nodes afresh: forgetting what is `retention` old takes the others only. The
    // margin between the two covers a slow server's statements in between.
    let (old, retention) = (Duration::from_secs(6), Duration::from_secs(4));
    until("the reports age", DEADLINE, || async {
        let snapshot = store.site_health().await.unwrap();
        let newest = snapshot.nodes.iter().map(|n| n.received_at).max().unwrap();
        (snapshot.read_at - newest >= chrono::Duration::from_std(old).unwrap()).then_some(())
    })
    .await;
    for (site, fresh) in [("north", node(0)), ("south", "south-a".to_owned())] {
        store
            .record_site_health(report(site, &fresh, 2))
            .await
            .unwrap();
    }
    let mut forgotten: Vec<(String, String)> = store
        .forget_silent_nodes(retention)
        .await
        .unwrap()
        .into_iter()
        .map(|(site, node)| (site.as_str().to_owned(), node.as_str().to_owned()))
        .collect();
    forgotten.sort();
    let expected: Vec<(String, String)> = (1..MAX_NODES_PER_SITE)
        .map(|i| ("north".to_owned(), node(i)))
        .collect();
    assert_eq!(forgotten, expected);
    assert_eq!(
        stored_nodes(store).await,
        [
            ("north".to_owned(), node(0)),
            ("south".to_owned(), "south-a".to_owned())
        ]
    );
    // The forgotten nodes' places are free again.
    assert_eq!(
        store
            .record_site_health(report("north", &extra, 1))
            .await
            .unwrap(),
        SiteHealthWrite::Stored
    );
}
