//! Behaviours of flood consolidation: the arrivals over a list's threshold in one window are
//! stored Held (critical ones never), are never claimed on their own, and are claimed together
//! as digests of at most the list's `max_per_digest` once their window ends, each with an
//! attempt row naming the digest; a failed digest leaves them Held for the next one. Held rows
//! are superseded and cleared like the other waiting ones, and counted in the queue depth.
//!
//! A submit batch is stored at one instant, so the rows of one batch arrive in one window
//! whatever the clock says: the tests submit each flood as one batch.

use std::time::Duration;

use central_outbox::domain::channel::{ListInput, NotificationList};
use central_outbox::domain::consolidation::{Consolidation, SETTLE};
use central_outbox::domain::delivery::AttemptOutcome;
use central_outbox::domain::history::{Actor, HistoryEvent};
use central_outbox::domain::kpi::KpiParams;
use central_outbox::domain::serve_order::ClaimLanes;
use central_outbox::domain::status::Status;
use central_outbox::domain::{ConditionKey, NotificationId, NotificationType, Priority, SiteId};
use central_outbox::records::{ClaimedNotification, InsertOutcome, LeaseEpoch, NewNotification};
use central_outbox::store::OutboxStore;
use chrono::Utc;

use crate::poll::until;
use crate::seed::{self, End, LEASE, Spec};

/// The list under test: more than 2 a second are held, digests of at most 3.
const FLOOD: &str = "flood";

async fn consolidating_list<S: OutboxStore>(store: &S, window: Duration) {
    let list = NotificationList::parse(ListInput {
        name: FLOOD.into(),
        recipients: vec!["ops@plant.test".into()],
        consolidation: Some(Consolidation::parse(2, window, 3).unwrap()),
        ..Default::default()
    })
    .unwrap();
    store.upsert_list(list).await.unwrap();
}

fn row(list: &'static str, subject: &str) -> NewNotification {
    seed::submission(&Spec::new("north", list, subject, End::Pending))
}

async fn submit_batch<S: OutboxStore>(store: &S, rows: &[NewNotification]) {
    let outcomes = store.submit(rows.to_vec()).await.unwrap();
    assert!(outcomes.iter().all(|o| *o == InsertOutcome::Accepted));
}

async fn status<S: OutboxStore>(store: &S, row: &NewNotification) -> Status {
    let state = store.state(row.submission.id).await.unwrap().unwrap();
    state.status
}

/// Claims a digest of email rows, polling until one is due (the window's end) or `deadline`.
async fn next_digest<S: OutboxStore>(
    store: &S,
    epoch: LeaseEpoch,
    digest: NotificationId,
) -> Vec<ClaimedNotification> {
    until("a digest became due", Duration::from_secs(20), || async {
        let rows = store
            .claim_digest(
                LEASE,
                epoch,
                NotificationType::Email,
                digest,
                Duration::from_secs(600),
            )
            .await
            .unwrap();
        (!rows.is_empty()).then_some(rows)
    })
    .await
}

fn ids(rows: &[ClaimedNotification]) -> Vec<NotificationId> {
    rows.iter().map(|r| r.id).collect()
}

fn ids_of(rows: &[&NewNotification]) -> Vec<NotificationId> {
    rows.iter().map(|r| r.submission.id).collect()
}

async fn last_event<S: OutboxStore>(store: &S, id: NotificationId) -> HistoryEvent {
    let detail = store.detail(id).await.unwrap().unwrap();
    detail
        .history
        .last()
        .expect("a history entry")
        .event
        .clone()
}

pub(crate) async fn a_flood_is_held_and_claimed_as_digests_when_its_window_ends<S: OutboxStore>(
    store: &S,
) {
    consolidating_list(store, Duration::from_secs(1)).await;
    let critical = seed::submission(
        &Spec::new("north", FLOOD, "critical", End::Pending).priority(Priority::Critical),
    );
    let flood: Vec<NewNotification> = (1..=6).map(|i| row(FLOOD, &format!("alarm {i}"))).collect();
    let elsewhere: Vec<NewNotification> =
        (1..=4).map(|i| row("ops", &format!("ops {i}"))).collect();
    // Arrivals 1 and 2 are within the threshold; the critical one (3rd) is never held; the
    // 4th to 7th are held.
    let batch: Vec<NewNotification> = [&flood[0], &flood[1], &critical]
        .into_iter()
        .chain(&flood[2..])
        .chain(&elsewhere)
        .cloned()
        .collect();
    submit_batch(store, &batch).await;
    let held = [&flood[2], &flood[3], &flood[4], &flood[5]];
    for row in &held {
        assert_eq!(status(store, row).await, Status::Held);
        let state = store.state(row.submission.id).await.unwrap().unwrap();
        // Due two seconds (SETTLE) after the end of the 1-second, epoch-aligned window it
        // arrived in.
        let due = state
            .next_attempt_at
            .expect("a held row is due after its window's end");
        let window_end = due - chrono::Duration::from_std(SETTLE).unwrap();
        assert!(
            window_end > state.created_at
                && window_end <= state.created_at + chrono::Duration::seconds(1)
        );
        assert_eq!(window_end.timestamp_subsec_millis(), 0, "{due}");
    }
    for row in [&flood[0], &flood[1], &critical]
        .into_iter()
        .chain(&elsewhere)
    {
        assert_eq!(status(store, row).await, Status::Pending);
    }
    // Held rows are in the queue depth.
    let kpis = store
        .kpis(KpiParams {
            now: Utc::now(),
            stuck_age_threshold: Duration::from_secs(600),
            delivered_window: Duration::from_secs(60),
        })
        .await
        .unwrap()
        .global;
    assert_eq!(kpis.queue_depth, 11);
    assert_eq!(kpis.stuck_count, 0);
    // Still Held a stuck threshold after their window's end, nothing takes them out: they are
    // stuck (issue 33: they were counted neither stuck nor due, so no alert rule ever fired).
    // An hour on, every row here is stuck: the seven waiting by age, the four held by due time.
    let later = store
        .kpis(KpiParams {
            now: Utc::now() + chrono::Duration::hours(1),
            stuck_age_threshold: Duration::from_secs(600),
            delivered_window: Duration::from_secs(60),
        })
        .await
        .unwrap()
        .global;
    assert_eq!(later.stuck_count, 11);
    assert!(
        later.oldest_retry_wait_age.is_none(),
        "none waits any more: all are due"
    );

    // Claims of rows one by one never take a held row.
    let epoch = seed::lease(store).await;
    let claimed = store
        .claim_due(
            LEASE,
            epoch,
            NotificationType::Email,
            ClaimLanes::in_turn(50),
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    let mut got = ids(&claimed);
    got.sort();
    let mut expected = ids_of(&[&flood[0], &flood[1], &critical]);
    expected.extend(ids_of(&elsewhere.iter().collect::<Vec<_>>()));
    expected.sort();
    assert_eq!(got, expected);

    // At the window's end: a first digest of the list's maximum (3), longest due first, then
    // the rest.
    let first = NotificationId::generate();
    let digest = next_digest(store, epoch, first).await;
    assert_eq!(ids(&digest), ids_of(&held[..3]));
    for claimed in &digest {
        assert_eq!(claimed.content.list_name.as_str(), FLOOD);
        assert_eq!(
            last_event(store, claimed.id).await,
            HistoryEvent::Attempt {
                outcome: AttemptOutcome::InFlight,
                duration: None,
                lease_epoch: epoch.0,
                digest: Some(first),
                provider: None,
            }
        );
    }
    let second = NotificationId::generate();
    let rest = next_digest(store, epoch, second).await;
    assert_eq!(ids(&rest), ids_of(&held[3..]));
    let none = store
        .claim_digest(
            LEASE,
            epoch,
            NotificationType::Email,
            NotificationId::generate(),
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    assert!(none.is_empty(), "every held row is claimed");

    // The first digest is delivered: each row on its own, its attempt naming the digest.
    for claimed in &digest {
        seed::record(store, claimed, End::Delivered).await;
        match last_event(store, claimed.id).await {
            HistoryEvent::Attempt {
                outcome, digest, ..
            } => {
                assert_eq!(outcome, AttemptOutcome::Delivered);
                assert_eq!(digest, Some(first));
            }
            other => panic!("{other:?}"),
        }
    }
    for row in &held[..3] {
        assert_eq!(status(store, row).await, Status::Delivered);
    }
    // The second fails for now: its row stays Held, due again at the retry time, for the next
    // digest.
    seed::record(store, &rest[0], End::Retrying(30)).await;
    let state = store.state(held[3].submission.id).await.unwrap().unwrap();
    assert_eq!(state.status, Status::Held);
    assert_eq!(state.retry_count, 1);
    assert!(state.next_attempt_at.unwrap() > Utc::now() + chrono::Duration::seconds(20));
}

pub(crate) async fn held_rows_are_superseded_and_cleared_like_waiting_ones<S: OutboxStore>(
    store: &S,
) {
    consolidating_list(store, Duration::from_secs(3600)).await;
    let key = "pump7.trip";
    let keyed = |subject: &str| {
        seed::submission(&Spec::new("north", FLOOD, subject, End::Pending).condition_key(key))
    };
    let batch: Vec<NewNotification> = (1..=5).map(|i| keyed(&format!("trip {i}"))).collect();
    submit_batch(store, &batch).await;
    // Each keyed row supersedes the one before it as it arrives, whether that one was held or
    // not: only the last stands, held (it is the 5th arrival).
    for (older, newer) in batch.iter().zip(&batch[1..]) {
        assert_eq!(status(store, older).await, Status::Superseded);
        assert_eq!(
            last_event(store, older.submission.id).await,
            HistoryEvent::Superseded {
                by: newer.submission.id
            }
        );
    }
    assert_eq!(status(store, &batch[4]).await, Status::Held);

    let newest = keyed("trip 6");
    let other = row(FLOOD, "unkeyed");
    submit_batch(store, &[newest.clone(), other.clone()]).await;
    assert_eq!(status(store, &batch[4]).await, Status::Superseded);
    assert_eq!(status(store, &newest).await, Status::Held);
    assert_eq!(status(store, &other).await, Status::Held);
    let cleared = store
        .clear_condition(
            &SiteId::parse("north".into()).unwrap(),
            &ConditionKey::parse(key.into(), "condition_key").unwrap(),
            Actor::new("site north"),
        )
        .await
        .unwrap();
    assert_eq!(cleared, [newest.submission.id]);
    assert_eq!(status(store, &newest).await, Status::Cleared);
    assert_eq!(status(store, &other).await, Status::Held);
}

pub(crate) async fn consolidation_settings_round_trip<S: OutboxStore>(store: &S) {
    consolidating_list(store, Duration::from_secs(300)).await;
    let name = central_outbox::domain::ListName::parse(FLOOD.into()).unwrap();
    let stored = store.list(&name).await.unwrap().unwrap().value;
    let rules = stored.consolidation.expect("consolidation stored");
    assert_eq!(
        (rules.threshold(), rules.window(), rules.max_per_digest()),
        (2, Duration::from_secs(300), 3)
    );
    // Replacing the list without it turns it off, and a flood then goes out row by row.
    let plain = NotificationList {
        consolidation: None,
        ..stored
    };
    store.upsert_list(plain).await.unwrap();
    let stored = store.list(&name).await.unwrap().unwrap().value;
    assert_eq!(stored.consolidation, None);
    let batch: Vec<NewNotification> = (1..=5).map(|i| row(FLOOD, &format!("alarm {i}"))).collect();
    submit_batch(store, &batch).await;
    for row in &batch {
        assert_eq!(status(store, row).await, Status::Pending);
    }
}
