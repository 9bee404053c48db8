//! Behaviours of condition keys: a newer notification with the same key, list and site
//! supersedes the older waiting ones; clearing a key ends a site's waiting ones; a row the site
//! cleared before forwarding it is stored Cleared and never delivered. Delivered rows and rows
//! being delivered are never touched, and every ending has its history entry.

use std::time::Duration;

use central_outbox::domain::history::{Actor, HistoryEvent};
use central_outbox::domain::query::{NotificationFilter, PageRequest};
use central_outbox::domain::serve_order::ClaimLanes;
use central_outbox::domain::status::Status;
use central_outbox::domain::{ConditionKey, NotificationId, NotificationType, SiteId};
use central_outbox::records::{ClaimedNotification, InsertOutcome, LeaseEpoch, NewNotification};
use central_outbox::store::OutboxStore;
use chrono::Utc;

use crate::seed::{self, End, LEASE, Spec};

const KEY: &str = "tank4.level.high";

fn keyed(site: &'static str, list: &'static str, subject: &str, key: &str) -> NewNotification {
    seed::submission(&Spec::new(site, list, subject, End::Pending).condition_key(key))
}

async fn submit<S: OutboxStore>(store: &S, row: &NewNotification) {
    assert_eq!(
        store.submit(vec![row.clone()]).await.unwrap(),
        [InsertOutcome::Accepted]
    );
}

async fn status<S: OutboxStore>(store: &S, row: &NewNotification) -> Status {
    store
        .state(row.submission.id)
        .await
        .unwrap()
        .unwrap()
        .status
}

async fn last_event<S: OutboxStore>(store: &S, row: &NewNotification) -> HistoryEvent {
    let detail = store.detail(row.submission.id).await.unwrap().unwrap();
    detail
        .history
        .last()
        .expect("a history entry")
        .event
        .clone()
}

/// Claims up to `rows` due email rows in turn, for long enough not to expire in a test.
async fn claim<S: OutboxStore>(
    store: &S,
    epoch: LeaseEpoch,
    rows: usize,
) -> Vec<ClaimedNotification> {
    store
        .claim_due(
            LEASE,
            epoch,
            NotificationType::Email,
            ClaimLanes::in_turn(rows),
            Duration::from_secs(600),
        )
        .await
        .unwrap()
}

/// Two rows of the key to start with: one delivered, then one being delivered (claimed). Each
/// is claimed before the next is stored, or the second would supersede the first.
async fn delivered_and_in_flight<S: OutboxStore>(store: &S) -> (NewNotification, NewNotification) {
    let delivered = keyed("north", "ops", "delivered", KEY);
    let in_flight = keyed("north", "ops", "in flight", KEY);
    let epoch = seed::lease(store).await;
    for row in [&delivered, &in_flight] {
        submit(store, row).await;
        let claimed = claim(store, epoch, 2).await;
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].id, row.submission.id);
        if row.submission.id == delivered.submission.id {
            seed::record(store, &claimed[0], End::Delivered).await;
        }
    }
    (delivered, in_flight)
}

pub async fn a_newer_keyed_notification_supersedes_the_older_waiting_ones<S: OutboxStore>(
    store: &S,
) {
    let (delivered, in_flight) = delivered_and_in_flight(store).await;
    let older = [
        keyed("north", "ops", "older 1", KEY),
        keyed("north", "ops", "older 2", KEY),
    ];
    let untouched = [
        keyed("north", "ops-webhook", "other list", KEY),
        keyed("north", "ops", "other key", "tank4.level.low"),
        keyed("south", "ops", "other site", KEY),
        seed::submission(&Spec::new("north", "ops", "no key", End::Pending)),
    ];
    for row in older.iter().chain(&untouched) {
        submit(store, row).await;
    }
    let newer = keyed("north", "ops", "newer", KEY);
    submit(store, &newer).await;

    // Each is superseded by the next one of its key as that arrives: older 1 by older 2, older
    // 2 by the newer one.
    let successors = [older[1].submission.id, newer.submission.id];
    for (row, by) in older.iter().zip(successors) {
        assert_eq!(status(store, row).await, Status::Superseded);
        assert_eq!(
            last_event(store, row).await,
            HistoryEvent::Superseded { by }
        );
        let state = store.state(row.submission.id).await.unwrap().unwrap();
        assert!(state.resolved_at.is_some());
        assert_eq!(state.next_attempt_at, None);
        assert_eq!(state.condition_key.as_deref(), Some(KEY));
    }
    for row in untouched.iter().chain([&newer, &in_flight]) {
        assert_eq!(
            status(store, row).await,
            Status::Pending,
            "{}",
            row.submission.content.subject.as_str()
        );
    }
    assert_eq!(status(store, &delivered).await, Status::Delivered);

    // Superseded rows are never claimed: what is due is the untouched rows and the newer one.
    let epoch = seed::lease(store).await;
    let claimed = claim(store, epoch, 20).await;
    let mut subjects: Vec<&str> = claimed.iter().map(|c| c.content.subject.as_str()).collect();
    subjects.sort();
    assert_eq!(
        subjects,
        ["newer", "no key", "other key", "other list", "other site"]
    );
}

pub async fn clearing_a_condition_ends_only_that_sites_waiting_rows<S: OutboxStore>(store: &S) {
    let (delivered, in_flight) = delivered_and_in_flight(store).await;
    let waiting = [
        keyed("north", "ops", "waiting 1", KEY),
        keyed("north", "ops-webhook", "waiting 2", KEY),
    ];
    let untouched = [
        keyed("north", "ops", "other key", "tank4.level.low"),
        keyed("south", "ops", "other site", KEY),
    ];
    for row in waiting.iter().chain(&untouched) {
        store.submit(vec![row.clone()]).await.unwrap();
    }
    let north = SiteId::parse("north".into()).unwrap();
    let key = ConditionKey::parse(KEY.into(), "condition_key").unwrap();
    let mut cleared = store
        .clear_condition(&north, &key, Actor::new("site north"))
        .await
        .unwrap();
    cleared.sort();
    let mut expected: Vec<NotificationId> = waiting.iter().map(|r| r.submission.id).collect();
    expected.sort();
    assert_eq!(cleared, expected);
    for row in &waiting {
        assert_eq!(status(store, row).await, Status::Cleared);
        assert_eq!(
            last_event(store, row).await,
            HistoryEvent::Cleared {
                actor: "site north".into()
            }
        );
    }
    for row in untouched.iter().chain([&in_flight]) {
        assert_eq!(status(store, row).await, Status::Pending);
    }
    assert_eq!(status(store, &delivered).await, Status::Delivered);
    // Clearing again ends nothing more.
    assert!(
        store
            .clear_condition(&north, &key, Actor::new("site north"))
            .await
            .unwrap()
            .is_empty()
    );

    // The key is a filter.
    let page = store
        .query(PageRequest {
            filter: NotificationFilter {
                condition_key: Some(KEY.into()),
                statuses: vec![Status::Cleared],
                ..Default::default()
            },
            after: None,
            size: 50,
        })
        .await
        .unwrap();
    let mut found: Vec<NotificationId> = page.rows.iter().map(|r| r.id).collect();
    found.sort();
    assert_eq!(found, expected);
}

pub async fn a_row_cleared_at_the_site_is_stored_cleared_and_never_delivered<S: OutboxStore>(
    store: &S,
) {
    let older = keyed("north", "ops", "older", KEY);
    submit(store, &older).await;
    let mut cleared = keyed("north", "ops", "cleared at the site", KEY);
    let cleared_at = Utc::now() - chrono::Duration::minutes(5);
    cleared.submission.cleared_at_site = Some(cleared_at);
    submit(store, &cleared).await;
    // Resubmitted (a reconnect) without the mark: the same notification.
    let mut again = cleared.clone();
    again.submission.cleared_at_site = None;
    assert_eq!(
        store.submit(vec![again]).await.unwrap(),
        [InsertOutcome::Duplicate]
    );

    let state = store.state(cleared.submission.id).await.unwrap().unwrap();
    assert_eq!(state.status, Status::Cleared);
    assert!(state.resolved_at.is_some());
    assert_eq!(state.next_attempt_at, None);
    let detail = store.detail(cleared.submission.id).await.unwrap().unwrap();
    assert_eq!(detail.history.len(), 1);
    assert_eq!(
        detail.history[0].event,
        HistoryEvent::Cleared {
            actor: "site north".into()
        }
    );
    let at = detail.history[0].at;
    assert!(
        (at - cleared_at).num_milliseconds().abs() <= 1,
        "{at} vs {cleared_at}"
    );
    // A row cleared at the site supersedes nothing: the site's own clear reaches central too.
    assert_eq!(status(store, &older).await, Status::Pending);

    let epoch = seed::lease(store).await;
    let claimed = claim(store, epoch, 10).await;
    let ids: Vec<NotificationId> = claimed.iter().map(|c| c.id).collect();
    assert_eq!(ids, [older.submission.id]);

    // Final rows are purged like the others.
    let report = store
        .purge_terminal(Utc::now() + chrono::Duration::seconds(5), 100)
        .await
        .unwrap();
    assert_eq!(report.notifications, 1);
    assert!(store.state(cleared.submission.id).await.unwrap().is_none());
}
