//! Behaviours of the site status feed: once a site watches, every final status one of its
//! notifications reaches is kept for it (by whatever path: an attempt's outcome, an operator's
//! discard after a park, a supersede, a clear), oldest first, with the reason and whom a
//! delivery went to, until it confirms them; other sites' and earlier statuses are not; old
//! ones are purged.

use std::time::Duration;

use central_outbox::domain::history::Actor;
use central_outbox::domain::status::Status;
use central_outbox::domain::{ConditionKey, NotificationId, SiteId};
use central_outbox::store::OutboxStore;

use crate::poll::Asks;
use crate::seed::{self, End, Rows, Spec};

fn site(name: &str) -> SiteId {
    SiteId::parse(name.to_owned()).unwrap()
}

/// The site's unconfirmed changes as (id, status) pairs, oldest first.
async fn changes<S: OutboxStore>(store: &S, name: &str) -> Vec<(NotificationId, Status)> {
    store
        .site_status_changes(&site(name), 100)
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.state.id, c.state.status))
        .collect()
}

pub(crate) async fn a_watching_site_gets_each_final_status_once_in_order<S: OutboxStore + Rows>(
    store: &S,
) {
    // Decided before the site watched: not fed.
    let before = seed::seed(
        store,
        &[Spec::new("north", "ops", "before", End::Delivered)],
    )
    .await;
    store.watch_site_status(&site("north")).await.unwrap();
    assert_eq!(changes(store, "north").await, []);

    let seeded = seed::seed(
        store,
        &[
            Spec::new("north", "ops", "delivered", End::Delivered),
            Spec::new("north", "ops", "parked", End::Parked),
            Spec::new("north", "ops", "discarded", End::Discarded),
            Spec::new("south", "ops", "other site", End::Delivered),
        ],
    )
    .await;
    let id = |subject: &str| seed::id_of(&seeded, subject);
    // Keyed rows: the second supersedes the first; a clear ends the second.
    let key = ConditionKey::parse("tank4.level.high".to_owned(), "condition_key").unwrap();
    let first = seed::seed(
        store,
        &[Spec::new("north", "ops", "first", End::Pending).condition_key(key.as_str())],
    )
    .await;
    let second = seed::seed(
        store,
        &[Spec::new("north", "ops", "second", End::Pending).condition_key(key.as_str())],
    )
    .await;
    let cleared = store
        .clear_condition(&site("north"), &key, Actor::new("conformance"))
        .await
        .unwrap();
    assert_eq!(cleared, [second[0].id]);

    let fed = store
        .site_status_changes(&site("north"), 100)
        .await
        .unwrap();
    let got: Vec<(NotificationId, Status)> =
        fed.iter().map(|c| (c.state.id, c.state.status)).collect();
    // Claimed and recorded in the order the store handed them out, so compare the set of the
    // attempts' outcomes and the order of the discarded row's two changes.
    let mut attempts: Vec<(NotificationId, Status)> = got[..3].to_vec();
    attempts.sort_by_key(|(id, _)| *id);
    let mut expected = vec![
        (id("delivered"), Status::Delivered),
        (id("parked"), Status::Parked),
        (id("discarded"), Status::Parked),
    ];
    expected.sort_by_key(|(id, _)| *id);
    assert_eq!(attempts, expected, "{got:?}");
    assert_eq!(
        got[3..],
        [
            (id("discarded"), Status::Discarded),
            (first[0].id, Status::Superseded),
            (second[0].id, Status::Cleared),
        ]
    );
    assert!(got.iter().all(|(id, _)| *id != before[0].id));
    assert!(fed.windows(2).all(|w| w[0].seq < w[1].seq));
    // None was scheduled: a column read out of place would say otherwise.
    assert!(
        fed.iter().all(|c| c.state.deliver_after.is_none()),
        "{fed:?}"
    );

    // Each change says what central decided, when, and why or to whom.
    let delivered = fed.iter().find(|c| c.state.id == id("delivered")).unwrap();
    assert_eq!(delivered.delivered_to.as_deref(), Some("a@plant.test"));
    assert!(delivered.state.resolved_at.is_some());
    let parked = fed
        .iter()
        .find(|c| c.state.id == id("discarded") && c.state.status == Status::Parked)
        .unwrap();
    assert!(
        parked
            .state
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("550")),
        "{parked:?}"
    );
    assert_eq!(parked.delivered_to, None);
    assert_eq!(parked.state.subject, "discarded");

    // The other site is fed nothing (it does not watch); confirmed changes are gone, the rest
    // stay, and the heads name the site with changes after a seq.
    assert_eq!(changes(store, "south").await, []);
    let (sites, head) = store.site_status_heads(0).await.unwrap();
    assert_eq!(sites, [site("north")]);
    assert_eq!(head, fed.last().unwrap().seq);
    let (sites, _) = store.site_status_heads(head).await.unwrap();
    assert!(sites.is_empty());
    let confirmed: Vec<i64> = fed[..4].iter().map(|c| c.seq).collect();
    store
        .forget_site_status_changes(&site("north"), confirmed)
        .await
        .unwrap();
    assert_eq!(changes(store, "north").await, got[4..]);
    let limited = store.site_status_changes(&site("north"), 1).await.unwrap();
    assert_eq!(limited.len(), 1);
    assert_eq!(limited[0].state.id, first[0].id);
}

pub(crate) async fn the_purge_drops_old_changes_and_watches<S: OutboxStore + Rows>(store: &S) {
    store.watch_site_status(&site("north")).await.unwrap();
    seed::seed(
        store,
        &[Spec::new("north", "ops", "delivered", End::Delivered)],
    )
    .await;
    assert_eq!(changes(store, "north").await.len(), 1);

    let kept = store
        .purge_site_status(Duration::from_secs(3600), 100)
        .await
        .unwrap();
    assert_eq!((kept.changes, kept.watchers), (0, 0));
    assert_eq!(changes(store, "north").await.len(), 1);

    // Everything is older than no time at all, once the clock has moved past the
    // millisecond the change and the watch were stored at: purged again until it has.
    let mut dropped = (0, 0);
    let mut asks = Asks::within(Duration::from_secs(10));
    while dropped != (1, 1) {
        asks.next().await;
        let batch = store.purge_site_status(Duration::ZERO, 100).await.unwrap();
        dropped = (dropped.0 + batch.changes, dropped.1 + batch.watchers);
        assert!(!asks.overdue(), "the purge dropped {dropped:?} of (1, 1)");
    }
    assert_eq!(changes(store, "north").await, []);
    // With the watch gone, nothing more is fed until the site watches again.
    seed::seed(store, &[Spec::new("north", "ops", "later", End::Delivered)]).await;
    assert_eq!(changes(store, "north").await, []);
}
