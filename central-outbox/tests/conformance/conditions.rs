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

use crate::poll::Asks;
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

pub(crate) async fn a_newer_keyed_notification_supersedes_the_older_waiting_ones<S: OutboxStore>(
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

pub(crate) async fn clearing_a_condition_ends_only_that_sites_waiting_rows<S: OutboxStore>(
    store: &S,
) {
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

pub(crate) async fn a_row_cleared_at_the_site_is_stored_cleared_and_never_delivered<
    S: OutboxStore,
>(
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

/// A keyed row of `site`/`list` enqueued at the site at `at`.
fn keyed_at(
    list: &'static str,
    subject: &str,
    key: &str,
    at: chrono::DateTime<Utc>,
) -> NewNotification {
    let mut row = keyed("north", list, subject, key);
    row.submission.provenance.site_enqueued_at = at;
    row
}

/// The site's time in whole milliseconds, as both stores keep it, so that ties are exact.
fn site_now() -> chrono::DateTime<Utc> {
    chrono::DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).unwrap()
}

pub(crate) async fn a_late_older_keyed_notification_is_stored_superseded<S: OutboxStore>(
    store: &S,
) {
    let t = site_now();
    let five = chrono::Duration::seconds(5);

    // Waiting: the newer row (T) arrives first, the older one (T - 5 s) after it.
    let newer = keyed_at("ops", "99%", "a", t);
    submit(store, &newer).await;
    let late = keyed_at("ops", "95%", "a", t - five);
    submit(store, &late).await;
    // The same late row's key on another list is another condition: untouched.
    let other_list = keyed_at("ops-webhook", "95% elsewhere", "a", t - five);
    submit(store, &other_list).await;

    // Delivered: the newer row already went out; a late older one is stale all the same.
    let epoch = seed::lease(store).await;
    let sent = keyed_at("ops", "sent", "b", t);
    submit(store, &sent).await;
    let claimed = claim(store, epoch, 10).await;
    let sent_claim = claimed
        .iter()
        .find(|c| c.id == sent.submission.id)
        .expect("the newer row is claimed");
    seed::record(store, sent_claim, End::Delivered).await;
    // Release the other claims: they are looked at below, waiting.
    for c in claimed.iter().filter(|c| c.id != sent.submission.id) {
        seed::record(store, c, End::Retrying(0)).await;
    }
    let late_after_sent = keyed_at("ops", "late after sent", "b", t - five);
    submit(store, &late_after_sent).await;

    // One batch, newest first: the older row in it is stale when it is stored.
    let batch_newer = keyed_at("ops", "batch newer", "c", t);
    let batch_older = keyed_at("ops", "batch older", "c", t - five);
    assert_eq!(
        store
            .submit(vec![batch_newer.clone(), batch_older.clone()])
            .await
            .unwrap(),
        [InsertOutcome::Accepted, InsertOutcome::Accepted]
    );

    // A tie on the site's time: the later arrival wins.
    let first = keyed_at("ops", "tie first", "d", t);
    submit(store, &first).await;
    let second = keyed_at("ops", "tie second", "d", t);
    submit(store, &second).await;

    for (stale, by) in [
        (&late, &newer),
        (&late_after_sent, &sent),
        (&batch_older, &batch_newer),
        (&first, &second),
    ] {
        let subject = stale.submission.content.subject.as_str();
        assert_eq!(status(store, stale).await, Status::Superseded, "{subject}");
        assert_eq!(
            last_event(store, stale).await,
            HistoryEvent::Superseded {
                by: by.submission.id
            },
            "{subject}"
        );
        let state = store.state(stale.submission.id).await.unwrap().unwrap();
        assert!(state.resolved_at.is_some(), "{subject}");
        assert_eq!(state.next_attempt_at, None, "{subject}");
    }
    assert_eq!(status(store, &sent).await, Status::Delivered);

    // What is due is the latest state of each condition, and the other list's row.
    let claimed = claim(store, epoch, 20).await;
    let mut subjects: Vec<&str> = claimed.iter().map(|c| c.content.subject.as_str()).collect();
    subjects.sort();
    assert_eq!(
        subjects,
        ["95% elsewhere", "99%", "batch newer", "tie second"]
    );
}

pub(crate) async fn a_row_ended_while_being_delivered_ends_so_unless_its_attempt_delivers_it<
    S: OutboxStore,
>(
    store: &S,
) {
    let epoch = seed::lease(store).await;
    // Four keyed rows, each of its own key, all claimed (being delivered).
    let failing_superseded = keyed("north", "ops", "fails, superseded", "k1");
    let parking_cleared = keyed("north", "ops", "parks, cleared", "k2");
    let delivered_superseded = keyed("north", "ops", "delivered, superseded", "k3");
    let untouched = keyed("north", "ops", "fails, untouched", "k4");
    let rows = [
        &failing_superseded,
        &parking_cleared,
        &delivered_superseded,
        &untouched,
    ];
    for row in rows {
        submit(store, row).await;
    }
    let claimed = claim(store, epoch, 10).await;
    assert_eq!(claimed.len(), 4);
    let claim_of = |row: &NewNotification| {
        claimed
            .iter()
            .find(|c| c.id == row.submission.id)
            .expect("claimed")
            .clone()
    };

    // While they are out: a newer state of k1 and k3, and k2 cleared. The claimed rows are left
    // to their attempts.
    let newer_k1 = keyed("north", "ops", "newer k1", "k1");
    let newer_k3 = keyed("north", "ops", "newer k3", "k3");
    submit(store, &newer_k1).await;
    submit(store, &newer_k3).await;
    let north = SiteId::parse("north".into()).unwrap();
    let k2 = ConditionKey::parse("k2".into(), "condition_key").unwrap();
    let cleared = store
        .clear_condition(&north, &k2, Actor::new("operator ana"))
        .await
        .unwrap();
    assert!(
        cleared.is_empty(),
        "a row being delivered is not cleared then"
    );
    for row in rows {
        assert_eq!(status(store, row).await, Status::Pending);
    }

    // The attempts end: a transient failure, a permanent one, a delivery, a transient failure.
    seed::record(store, &claim_of(&failing_superseded), End::Retrying(60)).await;
    seed::record(store, &claim_of(&parking_cleared), End::Parked).await;
    seed::record(store, &claim_of(&delivered_superseded), End::Delivered).await;
    seed::record(store, &claim_of(&untouched), End::Retrying(60)).await;

    assert_eq!(status(store, &failing_superseded).await, Status::Superseded);
    assert_eq!(
        last_event(store, &failing_superseded).await,
        HistoryEvent::Superseded {
            by: newer_k1.submission.id
        }
    );
    assert_eq!(status(store, &parking_cleared).await, Status::Cleared);
    assert_eq!(
        last_event(store, &parking_cleared).await,
        HistoryEvent::Cleared {
            actor: "operator ana".into()
        }
    );
    for row in [&failing_superseded, &parking_cleared] {
        let detail = store.detail(row.submission.id).await.unwrap().unwrap();
        // The attempt, then the ending it made final.
        assert_eq!(detail.history.len(), 2);
        assert!(matches!(
            detail.history[0].event,
            HistoryEvent::Attempt { .. }
        ));
        assert_eq!(detail.state.next_attempt_at, None);
        assert!(detail.state.resolved_at.is_some());
    }
    // Delivered is delivered: its attempt was under way before the newer state arrived.
    assert_eq!(
        status(store, &delivered_superseded).await,
        Status::Delivered
    );
    assert_eq!(status(store, &untouched).await, Status::Retrying);
    for row in [&newer_k1, &newer_k3] {
        assert_eq!(status(store, row).await, Status::Pending);
    }
}

pub(crate) async fn a_row_ended_while_claimed_ends_when_its_claim_expires<S: OutboxStore>(
    store: &S,
) {
    let epoch = seed::lease(store).await;
    let row = keyed("north", "ops", "its node dies", KEY);
    submit(store, &row).await;
    let claimed = store
        .claim_due(
            LEASE,
            epoch,
            NotificationType::Email,
            ClaimLanes::in_turn(10),
            Duration::from_millis(300),
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let newer = keyed("north", "ops", "newer", KEY);
    submit(store, &newer).await;
    assert_eq!(status(store, &row).await, Status::Pending);

    // The node delivering it dies. The newer row is claimed (and kept) meanwhile; once the old
    // row's claim runs out, a claim ends it as recorded rather than claiming it again.
    let mut asks = Asks::within(Duration::from_secs(20));
    let mut claimed_ids = Vec::new();
    while status(store, &row).await == Status::Pending {
        assert!(!asks.overdue(), "the expired claim was never settled");
        asks.next().await;
        claimed_ids.extend(claim(store, epoch, 10).await.iter().map(|c| c.id));
    }
    assert_eq!(claimed_ids, [newer.submission.id]);
    assert_eq!(status(store, &row).await, Status::Superseded);
    assert_eq!(
        last_event(store, &row).await,
        HistoryEvent::Superseded {
            by: newer.submission.id
        }
    );
}
