//! Behaviours of escalation (`EscalationStore`, rules in `domain::escalation`): an alarm of a
//! list with a policy opens an incident; unanswered, its pages fire in the policy's order, each
//! once, at its due time by the store's clock, then it is exhausted; an acknowledgement stops it
//! and the page notifications not yet handed to the relay; a keyed alarm joins its condition's
//! incident, and a clear or a discard ends it; a parked page escalates at once; an edit of the
//! policy leaves open incidents alone; only the lease's epoch fires anything; and under
//! acknowledgements racing the pages, no page is claimed for delivery after its incident was
//! acknowledged.
//!
//! The pages wait one or two seconds (the policy's least), so a behaviour asks the store until
//! the time has come, as the dispatcher's clock does.

use std::time::Duration;

use central_outbox::domain::channel::{ListInput, NotificationList};
use central_outbox::domain::escalation::{
    AckMeans, AckResult, Acknowledgement, EscalationPolicy, IncidentEvent, IncidentId,
    IncidentStatus, PagePlace, PolicyInput,
};
use central_outbox::domain::history::{Actor, HistoryEvent};
use central_outbox::domain::serve_order::ClaimLanes;
use central_outbox::domain::status::Status;
use central_outbox::domain::{ConditionKey, ListName, NotificationType, Priority, SiteId};
use central_outbox::records::{
    ClaimedNotification, EscalationTurn, IncidentDetail, IncidentQuery, LeaseEpoch, NewNotification,
};
use central_outbox::store::OutboxStore;

use crate::poll::{Asks, until};
use crate::seed::{self, End, LEASE, Spec};

const ALARMS: &str = "ops";
const SUPERVISORS: &str = "supervisors";
const MANAGER: &str = "manager";

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn policy(first_wait: u64, steps: &[(&[&str], u64)], repeat: u32, from: u32) -> EscalationPolicy {
    EscalationPolicy::parse(PolicyInput {
        acknowledge_within: secs(first_wait),
        steps: steps
            .iter()
            .map(|(lists, wait)| (lists.iter().map(|l| (*l).to_owned()).collect(), secs(*wait)))
            .collect(),
        repeat,
        repeat_from_step: Some(from),
        ..PolicyInput::default()
    })
    .unwrap()
}

pub(crate) fn list(name: &str, escalation: Option<EscalationPolicy>) -> NotificationList {
    NotificationList::parse(ListInput {
        name: name.into(),
        recipients: vec![format!("{name}@plant.test")],
        escalation,
        ..Default::default()
    })
    .unwrap()
}

/// The three lists, the alarms' with `escalation`.
async fn lists<S: OutboxStore>(store: &S, escalation: EscalationPolicy) {
    store
        .upsert_list(list(ALARMS, Some(escalation)))
        .await
        .unwrap();
    store.upsert_list(list(SUPERVISORS, None)).await.unwrap();
    store.upsert_list(list(MANAGER, None)).await.unwrap();
}

fn alarm(subject: &str, priority: Priority) -> NewNotification {
    seed::submission(&Spec::new("north", ALARMS, subject, End::Pending).priority(priority))
}

fn keyed_alarm(subject: &str, key: &str) -> NewNotification {
    seed::submission(
        &Spec::new("north", ALARMS, subject, End::Pending)
            .priority(Priority::Critical)
            .condition_key(key),
    )
}

async fn submit<S: OutboxStore>(store: &S, row: &NewNotification) {
    store.submit(vec![row.clone()]).await.unwrap();
}

async fn only_incident<S: OutboxStore>(store: &S) -> IncidentDetail {
    let list = store
        .incidents(IncidentQuery {
            limit: 10,
            ..IncidentQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(list.incidents.len(), 1, "{list:?}");
    store.incident(list.incidents[0].id).await.unwrap().unwrap()
}

async fn turn<S: OutboxStore>(store: &S, epoch: LeaseEpoch) -> EscalationTurn {
    let turn = store.escalate_due(LEASE, epoch, 100).await.unwrap();
    assert!(turn.held, "the test's epoch holds the lease");
    turn
}

/// Asks the clock until a turn fires something, within `deadline`; returns that turn.
async fn next_firing<S: OutboxStore>(
    store: &S,
    epoch: LeaseEpoch,
    deadline: u64,
) -> EscalationTurn {
    until("the escalation clock to fire", secs(deadline), || async {
        let turn = turn(store, epoch).await;
        (turn.pages > 0 || turn.exhausted > 0).then_some(turn)
    })
    .await
}

fn ack(who: &str, means: AckMeans) -> Acknowledgement {
    Acknowledgement::new(Actor::new(who), means, Some("192.0.2.7"))
}

async fn claim<S: OutboxStore>(store: &S, epoch: LeaseEpoch) -> Vec<ClaimedNotification> {
    store
        .claim_due(
            LEASE,
            epoch,
            NotificationType::Email,
            ClaimLanes::in_turn(100),
            secs(600),
        )
        .await
        .unwrap()
}

fn events(detail: &IncidentDetail) -> Vec<IncidentEvent> {
    detail.history.iter().map(|h| h.event).collect()
}

pub(crate) async fn policies_round_trip_on_their_lists<S: OutboxStore>(store: &S) {
    let mut input = policy(30, &[(&[SUPERVISORS, MANAGER], 60)], 2, 2).to_input();
    input.priorities = vec![Priority::Normal];
    input.escalate_on_park = Some(false);
    input.acknowledgement_reminder = Some(secs(3600));
    let escalation = EscalationPolicy::parse(input).unwrap();
    store
        .upsert_list(list(ALARMS, Some(escalation.clone())))
        .await
        .unwrap();
    let stored = store
        .list(&ListName::parse(ALARMS.into()).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.value.escalation, Some(escalation));
    store.upsert_list(list(ALARMS, None)).await.unwrap();
    let stored = store
        .list(&ListName::parse(ALARMS.into()).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.value.escalation, None);
}

pub(crate) async fn unanswered_pages_fire_in_order_on_time_then_the_incident_is_exhausted<
    S: OutboxStore,
>(
    store: &S,
) {
    // Step 1 the alarm (1 s), step 2 the supervisors (1 s), then once more from step 2.
    lists(store, policy(1, &[(&[SUPERVISORS], 1)], 1, 2)).await;
    let epoch = seed::lease(store).await;
    let high = alarm("boiler 3 pressure high", Priority::High);
    let started = std::time::Instant::now();
    submit(store, &high).await;
    // Normal is not among the default priorities: no incident.
    submit(store, &alarm("boiler 3 pressure normal", Priority::Normal)).await;

    let opened = only_incident(store).await;
    let incident = &opened.incident;
    assert_eq!(incident.status, IncidentStatus::Open);
    assert_eq!(incident.alarm_id, high.submission.id);
    assert_eq!(incident.page_count, 1);
    let (next, due) = incident.next.unwrap();
    assert_eq!(next, Some(PagePlace { round: 0, step: 2 }));
    assert_eq!(due, incident.opened_at + secs(1));
    assert_eq!(events(&opened), [IncidentEvent::Opened]);
    assert_eq!(opened.messages.len(), 1);
    assert_eq!(opened.messages[0].page_no, Some(1));
    // Nothing is due yet, unless getting here took the machine longer than the wait (a loaded
    // one, or a slow database server): then the page was due, and fired.
    let early = turn(store, epoch).await;
    let first = if early.pages == 0 {
        assert_eq!(early.exhausted, 0);
        assert!(early.next_due_in.unwrap() <= secs(1));
        next_firing(store, epoch, 10).await
    } else {
        assert!(
            started.elapsed() >= secs(1),
            "a page fired before it was due: {early:?}"
        );
        early
    };
    assert_eq!((first.pages, first.messages, first.skipped), (1, 1, 0));
    let second = next_firing(store, epoch, 10).await;
    assert_eq!((second.pages, second.messages), (1, 1));
    let exhausted = next_firing(store, epoch, 10).await;
    assert_eq!((exhausted.pages, exhausted.exhausted), (0, 1));

    let done = only_incident(store).await;
    assert_eq!(done.incident.status, IncidentStatus::Exhausted);
    assert_eq!(done.incident.next, None);
    assert_eq!(
        events(&done),
        [
            IncidentEvent::Opened,
            IncidentEvent::Paged,
            IncidentEvent::Paged,
            IncidentEvent::Exhausted
        ]
    );
    let places: Vec<(u32, PagePlace)> = done.pages.iter().map(|p| (p.page_no, p.page)).collect();
    assert_eq!(
        places,
        [
            (1, PagePlace::FIRST),
            (2, PagePlace { round: 0, step: 2 }),
            (3, PagePlace { round: 1, step: 2 })
        ]
    );
    // Each page was due one wait after the one before: the cadence holds (none was late).
    for pair in done.pages.windows(2) {
        assert_eq!(pair[1].due_at, pair[0].due_at + secs(1), "{pair:?}");
        assert_eq!(pair[1].late_by, None);
        assert!(pair[1].fired_at >= pair[1].due_at);
        assert_eq!(pair[1].lease_epoch, epoch.0);
    }
    // The pages' messages went to the supervisors, as ordinary notifications at the alarm's
    // priority, and are claimed like any other.
    let messages: Vec<(&str, Option<u32>, Status)> = done
        .messages
        .iter()
        .map(|m| (m.list.as_str(), m.page_no, m.status))
        .collect();
    assert_eq!(
        messages,
        [
            (ALARMS, Some(1), Status::Pending),
            (SUPERVISORS, Some(2), Status::Pending),
            (SUPERVISORS, Some(3), Status::Pending)
        ]
    );
    let claimed = claim(store, epoch).await;
    let page_rows: Vec<&ClaimedNotification> = claimed
        .iter()
        .filter(|c| c.content.list_name.as_str() == SUPERVISORS)
        .collect();
    assert_eq!(page_rows.len(), 2);
    assert!(page_rows.iter().all(|c| c.priority == Priority::High));
    assert!(
        page_rows
            .iter()
            .all(|c| c.content.subject.as_str() == "boiler 3 pressure high")
    );
}

pub(crate) async fn an_acknowledgement_stops_the_escalation_and_its_unsent_pages<S: OutboxStore>(
    store: &S,
) {
    lists(store, policy(1, &[(&[SUPERVISORS, MANAGER], 1)], 3, 1)).await;
    let epoch = seed::lease(store).await;
    submit(store, &alarm("compressor 2 tripped", Priority::Critical)).await;
    next_firing(store, epoch, 10).await;
    let paged = only_incident(store).await;
    let id = paged.incident.id;
    // One page message is being delivered (claimed), the other waits.
    let claimed = claim(store, epoch).await;
    let in_flight = claimed
        .iter()
        .find(|c| c.content.list_name.as_str() == SUPERVISORS)
        .cloned()
        .unwrap();
    let manager_row = paged
        .messages
        .iter()
        .find(|m| m.list == MANAGER)
        .unwrap()
        .id;
    // The manager's message was claimed too (in turn); take it back as a transient failure so
    // that it waits, unclaimed, to be retried.
    let manager_claim = claimed.iter().find(|c| c.id == manager_row).unwrap();
    seed::record(store, manager_claim, End::Retrying(600)).await;

    let first = store
        .acknowledge_incident(id, ack("ann", AckMeans::Api))
        .await
        .unwrap();
    assert_eq!(first, AckResult::Acknowledged { stopped: 1 });
    let manager = store.detail(manager_row).await.unwrap().unwrap();
    assert_eq!(manager.state.status, Status::Acknowledged);
    assert_eq!(
        manager.history.last().unwrap().event,
        HistoryEvent::Acknowledged {
            actor: "ann".into()
        }
    );
    // The message being delivered ends Acknowledged unless its attempt delivers it.
    seed::record(store, &in_flight, End::Retrying(600)).await;
    assert_eq!(
        store.state(in_flight.id).await.unwrap().unwrap().status,
        Status::Acknowledged
    );

    let again = store
        .acknowledge_incident(id, ack("bob", AckMeans::Console))
        .await
        .unwrap();
    let AckResult::AlreadyAcknowledged { by, means, .. } = again else {
        panic!("{again:?}");
    };
    assert_eq!((by.as_str(), means), ("ann", AckMeans::Api));
    // Nothing more is due: the clock fires nothing, now or later.
    let detail = store.incident(id).await.unwrap().unwrap();
    assert_eq!(detail.incident.status, IncidentStatus::Acknowledged);
    assert_eq!(detail.incident.next, None);
    let ack_entry = detail
        .history
        .iter()
        .find(|h| h.event == IncidentEvent::Acknowledged)
        .unwrap();
    assert_eq!(ack_entry.actor, "ann");
    assert_eq!(ack_entry.means, Some(AckMeans::Api));
    assert_eq!(ack_entry.from.as_deref(), Some("192.0.2.7"));
    assert_eq!(
        events(&detail).last(),
        Some(&IncidentEvent::AcknowledgedAgain)
    );
    let quiet = turn(store, epoch).await;
    assert_eq!((quiet.pages, quiet.exhausted), (0, 0));
    assert_eq!(
        store
            .acknowledge_incident(IncidentId(i64::MAX), ack("ann", AckMeans::Api))
            .await
            .unwrap(),
        AckResult::NotFound
    );
}

pub(crate) async fn a_keyed_alarm_joins_its_conditions_incident_and_a_clear_ends_it<
    S: OutboxStore,
>(
    store: &S,
) {
    lists(store, policy(1, &[(&[SUPERVISORS], 1)], 0, 1)).await;
    let epoch = seed::lease(store).await;
    let first = keyed_alarm("tank 4 at 95%", "tank4.level");
    let newer = keyed_alarm("tank 4 at 99%", "tank4.level");
    submit(store, &first).await;
    submit(store, &newer).await;
    let joined = only_incident(store).await;
    assert_eq!(joined.incident.alarm_id, first.submission.id);
    assert_eq!(joined.incident.latest_id, newer.submission.id);
    assert_eq!(joined.incident.subject, "tank 4 at 99%");
    assert_eq!(
        events(&joined),
        [IncidentEvent::Opened, IncidentEvent::Joined]
    );
    // The page quotes the latest state of the condition.
    next_firing(store, epoch, 10).await;
    let claimed = claim(store, epoch).await;
    let page = claimed
        .iter()
        .find(|c| c.content.list_name.as_str() == SUPERVISORS)
        .unwrap();
    assert_eq!(page.content.subject.as_str(), "tank 4 at 99%");
    // Leave the page waiting (a retry) and clear the condition.
    seed::record(store, page, End::Retrying(600)).await;
    let site = SiteId::parse("north".into()).unwrap();
    let key = ConditionKey::parse("tank4.level".into(), "condition_key").unwrap();
    store
        .clear_condition(&site, &key, Actor::new("site north"))
        .await
        .unwrap();
    let cleared = only_incident(store).await;
    assert_eq!(cleared.incident.status, IncidentStatus::Cleared);
    assert_eq!(cleared.incident.next, None);
    assert_eq!(
        store.state(page.id).await.unwrap().unwrap().status,
        Status::Cleared
    );
    // An acknowledgement after the clear is recorded and reopens nothing.
    let late = store
        .acknowledge_condition(&site, &key, ack("site north", AckMeans::Site))
        .await
        .unwrap();
    assert!(
        late.is_empty(),
        "no incident of the condition is open: {late:?}"
    );
    let late = store
        .acknowledge_incident(cleared.incident.id, ack("ann", AckMeans::Link))
        .await
        .unwrap();
    assert!(
        matches!(
            late,
            AckResult::AlreadyEnded {
                status: IncidentStatus::Cleared,
                ..
            }
        ),
        "{late:?}"
    );
    let after = only_incident(store).await;
    assert_eq!(after.incident.status, IncidentStatus::Cleared);
    assert_eq!(
        events(&after).last(),
        Some(&IncidentEvent::AcknowledgedLate)
    );
    // A new alarm of the condition opens a new incident.
    submit(store, &keyed_alarm("tank 4 at 96%", "tank4.level")).await;
    let open = store
        .incidents(IncidentQuery {
            statuses: vec![IncidentStatus::Open],
            limit: 10,
            ..IncidentQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(open.incidents.len(), 1);
    // The site acknowledges its condition: that incident, on every list.
    let by_site = store
        .acknowledge_condition(&site, &key, ack("site north", AckMeans::Site))
        .await
        .unwrap();
    assert_eq!(
        by_site,
        [(open.incidents[0].id, AckResult::Acknowledged { stopped: 0 })]
    );
}

pub(crate) async fn a_discarded_alarm_ends_its_incident<S: OutboxStore>(store: &S) {
    lists(store, policy(600, &[(&[SUPERVISORS], 600)], 0, 1)).await;
    let epoch = seed::lease(store).await;
    let parked = alarm("feeder 7 lost", Priority::Critical);
    submit(store, &parked).await;
    let claimed = claim(store, epoch).await;
    seed::record(store, &claimed[0], End::Parked).await;
    store
        .act_on_ids(
            central_outbox::domain::history::OperatorAction::Discard,
            vec![parked.submission.id],
            Actor::new("ann"),
        )
        .await
        .unwrap()
        .pop()
        .unwrap()
        .unwrap();
    let detail = only_incident(store).await;
    assert_eq!(detail.incident.status, IncidentStatus::Discarded);
    assert_eq!(detail.incident.next, None);
    let discarded = detail
        .history
        .iter()
        .find(|h| h.event == IncidentEvent::Discarded)
        .unwrap();
    assert_eq!(discarded.actor, "ann");
}

/// With `notify_acknowledgement`, the first acknowledgement tells every list the incident
/// reached (its alarm delivered, its page being delivered) who acknowledged it, once; a list
/// whose page was still waiting (ended unsent by the acknowledgement) is not told, and a
/// second acknowledgement tells nobody again.
pub(crate) async fn an_acknowledgement_is_announced_to_the_lists_it_reached<S: OutboxStore>(
    store: &S,
) {
    let mut input = policy(1, &[(&[SUPERVISORS, MANAGER], 600)], 0, 1).to_input();
    input.notify_acknowledgement = Some(true);
    lists(store, EscalationPolicy::parse(input).unwrap()).await;
    let epoch = seed::lease(store).await;
    submit(store, &alarm("boiler 2 pressure high", Priority::Critical)).await;
    let alarm_claim = claim(store, epoch).await;
    assert_eq!(alarm_claim.len(), 1);
    seed::record(store, &alarm_claim[0], End::Delivered).await;
    next_firing(store, epoch, 10).await;
    // The supervisors' page is being delivered; the manager's waits, unclaimed.
    let pages = claim(store, epoch).await;
    let manager = pages
        .iter()
        .find(|c| c.content.list_name.as_str() == MANAGER)
        .unwrap();
    seed::record(store, manager, End::Retrying(600)).await;
    let id = only_incident(store).await.incident.id;
    let first = store
        .acknowledge_incident(id, ack("ann", AckMeans::Link))
        .await
        .unwrap();
    assert_eq!(first, AckResult::Acknowledged { stopped: 1 });

    let notices = claim(store, epoch).await;
    let mut told: Vec<(&str, &str)> = notices
        .iter()
        .map(|c| (c.content.list_name.as_str(), c.content.subject.as_str()))
        .collect();
    told.sort();
    assert_eq!(
        told,
        [
            (ALARMS, "Acknowledged by ann: boiler 2 pressure high"),
            (SUPERVISORS, "Acknowledged by ann: boiler 2 pressure high"),
        ]
    );
    for notice in &notices {
        assert!(
            notice
                .content
                .body
                .as_str()
                .starts_with("ann acknowledged incident"),
            "{}",
            notice.content.body.as_str()
        );
        assert_eq!(
            notice.incident, None,
            "a notice pages nobody and carries no link"
        );
        assert_eq!(notice.priority, Priority::Critical);
    }
    let detail = store.incident(id).await.unwrap().unwrap();
    let acknowledged = detail
        .history
        .iter()
        .find(|h| h.event == IncidentEvent::Acknowledged)
        .unwrap();
    assert!(
        acknowledged.detail.contains("told who acknowledged it"),
        "{}",
        acknowledged.detail
    );

    store
        .acknowledge_incident(id, ack("bob", AckMeans::Console))
        .await
        .unwrap();
    assert!(claim(store, epoch).await.is_empty(), "told once");
}

pub(crate) async fn a_parked_page_escalates_at_once<S: OutboxStore>(store: &S) {
    // The alarm would wait ten minutes; it parks, and the next page is due at once.
    lists(store, policy(600, &[(&[SUPERVISORS], 600)], 0, 1)).await;
    let epoch = seed::lease(store).await;
    submit(store, &alarm("pump 5 failed", Priority::Critical)).await;
    let claimed = claim(store, epoch).await;
    seed::record(store, &claimed[0], End::Parked).await;
    let escalated = only_incident(store).await;
    assert_eq!(
        events(&escalated),
        [IncidentEvent::Opened, IncidentEvent::Escalated]
    );
    let fired = next_firing(store, epoch, 5).await;
    assert_eq!((fired.pages, fired.messages), (1, 1));
    let paged = only_incident(store).await;
    assert_eq!(paged.incident.page_count, 2);
    assert_eq!(paged.pages[1].page, PagePlace { round: 0, step: 2 });
    // The page's message parks too: it is the latest page's, so the exhaustion comes at once
    // instead of after the step's ten minutes.
    let page_claim = claim(store, epoch).await;
    assert_eq!(page_claim.len(), 1);
    seed::record(store, &page_claim[0], End::Parked).await;
    let exhausted = next_firing(store, epoch, 5).await;
    assert_eq!(exhausted.exhausted, 1);
}

pub(crate) async fn an_edit_of_the_policy_leaves_open_incidents_alone<S: OutboxStore>(store: &S) {
    let before = policy(600, &[(&[SUPERVISORS], 600)], 0, 1);
    lists(store, before.clone()).await;
    submit(store, &alarm("line 2 stopped", Priority::High)).await;
    let opened = only_incident(store).await;
    let after = policy(1, &[(&[MANAGER], 1)], 9, 1);
    store
        .upsert_list(list(ALARMS, Some(after.clone())))
        .await
        .unwrap();
    let kept = only_incident(store).await;
    assert_eq!(kept.incident.policy, before);
    assert_eq!(kept.incident.next, opened.incident.next);
    // A new alarm opens under the new policy.
    submit(store, &alarm("line 3 stopped", Priority::High)).await;
    let all = store
        .incidents(IncidentQuery {
            limit: 10,
            ..IncidentQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(all.incidents.len(), 2);
    // Newest first.
    assert_eq!(all.incidents[0].policy, after);
    assert_eq!(all.incidents[1].policy, before);
}

pub(crate) async fn only_the_leases_epoch_fires_and_each_page_fires_once<S: OutboxStore>(
    store: &S,
) {
    lists(store, policy(1, &[(&[SUPERVISORS], 600)], 0, 1)).await;
    let old = seed::lease(store).await;
    submit(store, &alarm("conveyor 1 jammed", Priority::High)).await;
    // Another node takes the lease: the old epoch fires nothing, even when a page is due.
    store
        .release_lease(LEASE, "conformance", old)
        .await
        .unwrap();
    let new = store
        .acquire_lease(LEASE, "successor", secs(600))
        .await
        .unwrap()
        .unwrap();
    until("the page to be due", secs(10), || async {
        let detail = only_incident(store).await;
        let (_, due) = detail.incident.next.unwrap();
        (chrono::Utc::now() >= due).then_some(())
    })
    .await;
    let deposed = store.escalate_due(LEASE, old, 100).await.unwrap();
    assert!(!deposed.held);
    assert_eq!(deposed.pages, 0);
    // The successor's turns, many at once: the page fires once.
    let turns =
        futures_util::future::join_all((0..8).map(|_| store.escalate_due(LEASE, new, 100))).await;
    let pages: u32 = turns.into_iter().map(|t| t.unwrap().pages).sum();
    assert_eq!(pages, 1);
    let detail = only_incident(store).await;
    assert_eq!(detail.pages.len(), 2);
    assert_eq!(detail.pages[1].lease_epoch, new.0);
}

/// Incidents acknowledged at random moments around their pages' due times, while a "dispatcher"
/// claims what is due and the clock fires: no page message is ever claimed (handed towards the
/// relay) after its incident's acknowledgement was committed, and every acknowledged incident
/// stops paging.
pub(crate) async fn no_page_is_claimed_after_its_incident_was_acknowledged<S: OutboxStore>(
    store: &S,
) {
    const INCIDENTS: usize = 1000;
    lists(
        store,
        policy(1, &[(&[SUPERVISORS], 1), (&[MANAGER], 1)], 2, 1),
    )
    .await;
    let epoch = seed::lease(store).await;
    let alarms: Vec<NewNotification> = (0..INCIDENTS)
        .map(|i| alarm(&format!("alarm {i}"), Priority::High))
        .collect();
    for batch in alarms.chunks(100) {
        store.submit(batch.to_vec()).await.unwrap();
    }
    let mut all = Vec::with_capacity(INCIDENTS);
    let mut before = None;
    loop {
        let page = store
            .incidents(IncidentQuery {
                limit: 500,
                before,
                ..IncidentQuery::default()
            })
            .await
            .unwrap();
        all.extend(page.incidents);
        before = page.next_before;
        if before.is_none() {
            break;
        }
    }
    assert_eq!(all.len(), INCIDENTS);
    // Each incident is acknowledged after a random 0 to 4.5 s: before, between and after its
    // pages (due at 1 s, 2 s, 3 s, ...).
    let mut plan: Vec<(IncidentId, Duration)> = all
        .iter()
        .map(|i| (i.id, Duration::from_millis(fastrand::u64(0..4500))))
        .collect();
    plan.sort_by_key(|(_, at)| *at);
    let start = tokio::time::Instant::now();
    let acks = async {
        for (id, at) in &plan {
            until("the acknowledgement's moment", secs(10), || async {
                (start.elapsed() >= *at).then_some(())
            })
            .await;
            let result = store
                .acknowledge_incident(*id, ack("racer", AckMeans::Api))
                .await
                .unwrap();
            assert!(
                matches!(result, AckResult::Acknowledged { .. }),
                "{result:?}"
            );
        }
    };
    // The dispatcher's side: a turn of the clock and a claim at every ask, for six seconds.
    let work = async {
        let mut asks = Asks::within(secs(10));
        while start.elapsed() < secs(6) {
            asks.next().await;
            store.escalate_due(LEASE, epoch, 500).await.unwrap();
            claim(store, epoch).await;
        }
    };
    tokio::join!(acks, work);
    for (id, _) in &plan {
        let detail = store.incident(*id).await.unwrap().unwrap();
        assert_eq!(detail.incident.status, IncidentStatus::Acknowledged);
        let acked_at = detail.incident.acknowledged.as_ref().unwrap().at;
        for message in detail.messages.iter().filter(|m| m.page_no > Some(1)) {
            let row = store.detail(message.id).await.unwrap().unwrap();
            for entry in &row.history {
                if let HistoryEvent::Attempt { .. } = entry.event {
                    assert!(
                        entry.at <= acked_at,
                        "incident {id}: page message {} claimed at {} after the \
                         acknowledgement at {acked_at}",
                        message.id,
                        entry.at
                    );
                }
            }
            if !row
                .history
                .iter()
                .any(|e| matches!(e.event, HistoryEvent::Attempt { .. }))
            {
                assert_eq!(row.state.status, Status::Acknowledged, "{row:?}");
            }
        }
        // No page fired after the acknowledgement.
        assert!(
            detail.pages.iter().all(|p| p.fired_at <= acked_at),
            "{detail:?}"
        );
    }
}
