//! Behaviours of scheduled delivery (`domain::schedule`): a notification with a `deliver_after`
//! still ahead is stored Pending, due at that time, and no claim takes it before (while
//! `next_due_in` says when it comes due); its time is not content and is kept once it is due;
//! one whose time passed before it arrived is due at once; the "scheduled" filter, the stuck
//! filter and the KPIs count it as waiting for its time, not as late; a condition key
//! supersedes and clears it like any waiting row; and it is neither held for a flood digest nor
//! escalated.
//!
//! Times are whole milliseconds, the precision every store keeps, so a stored time compares
//! equal to the one submitted. The one wait for a time to come is a second and a half.

use std::time::Duration;

use central_outbox::domain::channel::{ListInput, NotificationList};
use central_outbox::domain::consolidation::Consolidation;
use central_outbox::domain::escalation::{EscalationPolicy, PolicyInput};
use central_outbox::domain::history::{Actor, HistoryEvent};
use central_outbox::domain::kpi::KpiParams;
use central_outbox::domain::query::{NotificationFilter, PageRequest};
use central_outbox::domain::serve_order::ClaimLanes;
use central_outbox::domain::status::Status;
use central_outbox::domain::{ConditionKey, NotificationId, NotificationType, Priority, SiteId};
use central_outbox::records::{
    ClaimedNotification, IncidentQuery, InsertOutcome, LeaseEpoch, NewNotification,
};
use central_outbox::store::OutboxStore;
use chrono::{DateTime, Utc};

use crate::poll::until;
use crate::seed::{self, End, LEASE, Rows, Spec};

/// `at` cut to whole milliseconds.
fn millis(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap()
}

/// A notification of `spec`, scheduled `ahead` after now (whole milliseconds).
fn scheduled(spec: &Spec, ahead: chrono::Duration) -> NewNotification {
    let mut row = seed::submission(spec);
    row.submission.deliver_after = Some(millis(Utc::now() + ahead));
    row
}

fn pending(site: &'static str, list: &'static str, subject: &str) -> Spec {
    Spec::new(site, list, subject, End::Pending)
}

async fn claim<S: central_outbox::store::DispatchStore>(
    store: &S,
    epoch: LeaseEpoch,
) -> Vec<ClaimedNotification> {
    store
        .claim_due(
            LEASE,
            epoch,
            NotificationType::Email,
            ClaimLanes::in_turn(10),
            Duration::from_secs(600),
        )
        .await
        .unwrap()
}

fn ids(rows: &[ClaimedNotification]) -> Vec<NotificationId> {
    rows.iter().map(|r| r.id).collect()
}

async fn submit<S: OutboxStore>(store: &S, rows: &[&NewNotification]) -> Vec<InsertOutcome> {
    store
        .submit(rows.iter().map(|r| (*r).clone()).collect())
        .await
        .unwrap()
}

async fn status<S: OutboxStore>(store: &S, row: &NewNotification) -> Status {
    store
        .state(row.submission.id)
        .await
        .unwrap()
        .unwrap()
        .status
}

/// A dispatch behaviour (every store, the memory store too): the scheduled row waits Pending,
/// due at its time, while a row due now beside it is claimed; `next_due_in` says when it comes
/// due; no claim takes it before its time, and one does once it has come.
pub(crate) async fn a_scheduled_row_is_not_claimed_before_its_time<S: Rows>(store: &S) {
    let later = scheduled(
        &pending("north", "ops", "shift handover"),
        chrono::Duration::milliseconds(1500),
    );
    let due = later.submission.deliver_after.unwrap();
    let now = seed::submission(&pending("north", "ops", "tank 4 high"));
    store.put(vec![later.clone(), now.clone()]).await;
    let epoch = seed::lease(store).await;
    assert_eq!(ids(&claim(store, epoch).await), [now.submission.id]);

    let state = store.row_state(later.submission.id).await.unwrap();
    assert_eq!(state.status, Status::Pending);
    assert_eq!(state.deliver_after, Some(due));
    assert_eq!(state.next_attempt_at, Some(due), "due at its time");
    let due_in = store
        .next_due_in(NotificationType::Email)
        .await
        .unwrap()
        .expect("the scheduled row comes due next");
    assert!(due_in <= Duration::from_millis(1500), "{due_in:?}");
    assert_eq!(
        store.next_due_in(NotificationType::Webhook).await.unwrap(),
        None
    );

    let claimed = until(
        "the scheduled row is claimed",
        Duration::from_secs(20),
        || async {
            let claimed = claim(store, epoch).await;
            (!claimed.is_empty()).then_some(claimed)
        },
    )
    .await;
    assert_eq!(ids(&claimed), [later.submission.id]);
    let state = store.row_state(later.submission.id).await.unwrap();
    let attempted = state.last_attempt_at.unwrap();
    assert!(
        attempted >= due,
        "claimed at {attempted}, before its time {due}"
    );
    assert_eq!(state.deliver_after, Some(due), "the time is kept");
    assert_eq!(
        store.next_due_in(NotificationType::Email).await.unwrap(),
        None,
        "a claimed row is not waiting for a time"
    );
}

/// The time is not content: a resubmit that differs only in it is a duplicate and the stored
/// time stands. A row whose time passed before it reached central (it waited in its site's
/// buffer) is due at once, with its time still shown.
pub(crate) async fn a_scheduled_time_is_kept_and_one_passed_on_arrival_is_due_at_once<
    S: OutboxStore,
>(
    store: &S,
) {
    let row = scheduled(
        &pending("north", "ops", "reminder"),
        chrono::Duration::hours(1),
    );
    assert_eq!(submit(store, &[&row]).await, [InsertOutcome::Accepted]);
    let mut moved = row.clone();
    moved.submission.deliver_after = Some(millis(Utc::now() + chrono::Duration::hours(5)));
    assert_eq!(submit(store, &[&moved]).await, [InsertOutcome::Duplicate]);
    let state = store.state(row.submission.id).await.unwrap().unwrap();
    assert_eq!(state.deliver_after, row.submission.deliver_after);
    assert_eq!(state.next_attempt_at, row.submission.deliver_after);

    let mut late = seed::submission(&pending("north", "ops", "buffered past its time"));
    let enqueued = millis(Utc::now() - chrono::Duration::hours(1));
    late.submission.provenance.site_enqueued_at = enqueued;
    let was_due = enqueued + chrono::Duration::minutes(50);
    late.submission.deliver_after = Some(was_due);
    assert_eq!(submit(store, &[&late]).await, [InsertOutcome::Accepted]);
    let epoch = seed::lease(store).await;
    assert_eq!(ids(&claim(store, epoch).await), [late.submission.id]);
    let state = store.state(late.submission.id).await.unwrap().unwrap();
    assert_eq!(state.deliver_after, Some(was_due));
    assert!(
        state
            .next_attempt_at
            .is_some_and(|at| at >= state.created_at),
        "due from its arrival, not from its passed time: {state:?}"
    );
}

/// Only rows still waiting for their time match the "scheduled" filter; such a row is not
/// stuck and not the oldest pending, and once its time has passed, its ages count from then.
pub(crate) async fn a_scheduled_row_waiting_for_its_time_is_neither_stuck_nor_late<
    S: OutboxStore,
>(
    store: &S,
) {
    let waiting = scheduled(
        &pending("south", "ops", "reminder"),
        chrono::Duration::hours(1),
    );
    let due = waiting.submission.deliver_after.unwrap();
    let plain = seed::submission(&pending("north", "ops", "tank 4 high"));
    assert_eq!(
        submit(store, &[&plain, &waiting]).await,
        [InsertOutcome::Accepted, InsertOutcome::Accepted]
    );
    let now = millis(Utc::now());
    let page = |filter: NotificationFilter| PageRequest {
        filter,
        after: None,
        size: 50,
    };
    let found = store
        .query(page(NotificationFilter {
            scheduled_after: Some(now),
            ..Default::default()
        }))
        .await
        .unwrap();
    let found: Vec<NotificationId> = found.rows.iter().map(|r| r.id).collect();
    assert_eq!(found, [waiting.submission.id]);
    let stuck = store
        .query(page(NotificationFilter {
            stuck_before: Some(now + chrono::Duration::minutes(1)),
            ..Default::default()
        }))
        .await
        .unwrap();
    let stuck: Vec<NotificationId> = stuck.rows.iter().map(|r| r.id).collect();
    assert_eq!(
        stuck,
        [plain.submission.id],
        "waiting for its time is not stuck"
    );
    let past_its_time = store
        .query(page(NotificationFilter {
            scheduled_after: Some(due + chrono::Duration::seconds(1)),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert!(past_its_time.rows.is_empty(), "{:?}", past_its_time.rows);

    // Seen a minute from now, the scheduled row's site has a queue but nothing late.
    let soon = KpiParams {
        now: now + chrono::Duration::minutes(1),
        stuck_age_threshold: Duration::from_secs(30),
        delivered_window: Duration::from_secs(60),
    };
    let kpis = store.kpis(soon).await.unwrap();
    assert_eq!((kpis.global.queue_depth, kpis.global.stuck_count), (2, 1));
    let south = |kpis: &central_outbox::domain::kpi::Kpis| {
        kpis.sites
            .iter()
            .find(|(site, _)| site == "south")
            .map(|(_, values)| values.clone())
            .expect("south has a figure")
    };
    let waiting_site = south(&kpis);
    assert_eq!(waiting_site.queue_depth, 1);
    assert_eq!(waiting_site.stuck_count, 0);
    assert_eq!(waiting_site.oldest_pending_age, None);
    assert_eq!(waiting_site.oldest_retry_wait_age, None);

    // Seen two hours from now, its time has come an hour ago: it is late by that hour, not by
    // the two since it arrived.
    let later = KpiParams {
        now: now + chrono::Duration::hours(2),
        ..soon
    };
    let late_site = south(&store.kpis(later).await.unwrap());
    assert_eq!(late_site.stuck_count, 1);
    assert_eq!(
        late_site.oldest_pending_age,
        Some((later.now - due).to_std().unwrap())
    );
}

/// A condition key ends a scheduled row like any waiting one: a newer notification of the key
/// supersedes it, a clear ends it; and a scheduled row, the newest state of its key, supersedes
/// the older waiting ones as it arrives.
pub(crate) async fn a_scheduled_row_is_superseded_and_cleared_like_a_waiting_one<S: OutboxStore>(
    store: &S,
) {
    let hour = chrono::Duration::hours(1);
    let waiting = scheduled(
        &pending("north", "ops", "check again").condition_key("tank4.level.high"),
        hour,
    );
    assert_eq!(submit(store, &[&waiting]).await, [InsertOutcome::Accepted]);
    let newer =
        seed::submission(&pending("north", "ops", "high again").condition_key("tank4.level.high"));
    assert_eq!(submit(store, &[&newer]).await, [InsertOutcome::Accepted]);
    assert_eq!(status(store, &waiting).await, Status::Superseded);
    let history = store
        .detail(waiting.submission.id)
        .await
        .unwrap()
        .unwrap()
        .history;
    assert_eq!(
        history.last().map(|h| h.event.clone()),
        Some(HistoryEvent::Superseded {
            by: newer.submission.id
        })
    );
    assert_eq!(status(store, &newer).await, Status::Pending);

    let to_clear = scheduled(
        &pending("north", "ops", "pump 7 reminder").condition_key("pump7.trip"),
        hour,
    );
    assert_eq!(submit(store, &[&to_clear]).await, [InsertOutcome::Accepted]);
    let cleared = store
        .clear_condition(
            &SiteId::parse("north".into()).unwrap(),
            &ConditionKey::parse("pump7.trip".into(), "condition_key").unwrap(),
            Actor::new("site north"),
        )
        .await
        .unwrap();
    assert_eq!(cleared, [to_clear.submission.id]);
    assert_eq!(status(store, &to_clear).await, Status::Cleared);

    let older = seed::submission(&pending("north", "ops", "valve open").condition_key("valve3"));
    assert_eq!(submit(store, &[&older]).await, [InsertOutcome::Accepted]);
    let reminder = scheduled(
        &pending("north", "ops", "valve still open?").condition_key("valve3"),
        hour,
    );
    assert_eq!(submit(store, &[&reminder]).await, [InsertOutcome::Accepted]);
    assert_eq!(status(store, &older).await, Status::Superseded);
    assert_eq!(status(store, &reminder).await, Status::Pending);
}

/// A scheduled row is delivered on its own when due: a list's flood does not hold it for a
/// digest, and a list's escalation opens no incident for it (a row due at once on those lists
/// is held, and escalated).
pub(crate) async fn a_scheduled_row_is_neither_held_nor_escalated<S: OutboxStore>(store: &S) {
    let flood = NotificationList::parse(ListInput {
        name: "flood".into(),
        recipients: vec!["ops@plant.test".into()],
        consolidation: Some(Consolidation::parse(1, Duration::from_secs(60), 10).unwrap()),
        ..Default::default()
    })
    .unwrap();
    store.upsert_list(flood).await.unwrap();
    let first = seed::submission(&pending("north", "flood", "alarm 1"));
    let over = seed::submission(&pending("north", "flood", "alarm 2"));
    let later = scheduled(
        &pending("north", "flood", "reminder"),
        chrono::Duration::hours(1),
    );
    submit(store, &[&first, &over, &later]).await;
    assert_eq!(
        status(store, &over).await,
        Status::Held,
        "the flood is held"
    );
    assert_eq!(status(store, &later).await, Status::Pending);
    let state = store.state(later.submission.id).await.unwrap().unwrap();
    assert_eq!(state.next_attempt_at, later.submission.deliver_after);

    for name in ["supervisors", "alarms"] {
        let escalation = (name == "alarms").then(|| {
            EscalationPolicy::parse(PolicyInput {
                acknowledge_within: Duration::from_secs(60),
                steps: vec![(vec!["supervisors".into()], Duration::from_secs(60))],
                repeat: 1,
                ..PolicyInput::default()
            })
            .unwrap()
        });
        let list = NotificationList::parse(ListInput {
            name: name.into(),
            recipients: vec![format!("{name}@plant.test")],
            escalation,
            ..Default::default()
        })
        .unwrap();
        store.upsert_list(list).await.unwrap();
    }
    let alarm = |subject: &str| pending("north", "alarms", subject).priority(Priority::Critical);
    let reminder = scheduled(&alarm("scheduled test page"), chrono::Duration::hours(1));
    let now = seed::submission(&alarm("tank 4 high"));
    submit(store, &[&reminder, &now]).await;
    let incidents = store
        .incidents(IncidentQuery {
            limit: 10,
            ..IncidentQuery::default()
        })
        .await
        .unwrap()
        .incidents;
    let alarms: Vec<NotificationId> = incidents.iter().map(|i| i.alarm_id).collect();
    assert_eq!(
        alarms,
        [now.submission.id],
        "only the row due now escalates"
    );
    assert_eq!(status(store, &reminder).await, Status::Pending);
}
