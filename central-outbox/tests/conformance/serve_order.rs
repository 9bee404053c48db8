//! Behaviours of the serve order (`central_outbox::domain::serve_order`): claims take the most
//! urgent rows first, the sites with due rows take turns within a priority, the longest-waiting
//! share takes the row due longest whatever its priority, and the priority is stored, shown and
//! filtered by.

use std::time::Duration;

use central_outbox::domain::query::{NotificationFilter, PageRequest};
use central_outbox::domain::serve_order::ClaimLanes;
use central_outbox::domain::{NotificationType, Priority};
use central_outbox::records::{ClaimedNotification, InsertOutcome, LeaseEpoch};
use central_outbox::store::{DispatchStore, OutboxStore};

use crate::seed::{self, End, LEASE, Rows, Spec};

const LONG: Duration = Duration::from_secs(600);

fn spec(site: &'static str, subject: &str, priority: Priority) -> Spec {
    Spec::new(site, "ops", subject, End::Pending).priority(priority)
}

/// Submits each group in its own call, in order, so "stored first" is well defined on every
/// backend; returns nothing (claims are compared by subject).
async fn submit_in_order<S: Rows>(store: &S, groups: &[Vec<Spec>]) {
    for group in groups {
        store
            .put(group.iter().map(seed::submission).collect())
            .await;
    }
}

async fn claim<S: DispatchStore>(
    store: &S,
    epoch: LeaseEpoch,
    lanes: ClaimLanes,
) -> Vec<ClaimedNotification> {
    store
        .claim_due(LEASE, epoch, NotificationType::Email, lanes, LONG)
        .await
        .unwrap()
}

fn subjects(claimed: &[ClaimedNotification]) -> Vec<&str> {
    claimed.iter().map(|c| c.content.subject.as_str()).collect()
}

/// Critical before high before normal before low, each priority in the order it arrived, and
/// each claimed row carries its priority.
pub(crate) async fn claims_take_the_most_urgent_first<S: Rows>(store: &S) {
    let normals: Vec<Spec> = (1..=3)
        .map(|i| spec("north", &format!("normal {i}"), Priority::Normal))
        .collect();
    submit_in_order(
        store,
        &[
            normals,
            vec![spec("north", "low", Priority::Low)],
            vec![spec("north", "critical", Priority::Critical)],
            vec![spec("south", "high", Priority::High)],
        ],
    )
    .await;
    let epoch = seed::lease(store).await;
    let claimed = claim(store, epoch, ClaimLanes::in_turn(10)).await;
    assert_eq!(
        subjects(&claimed),
        [
            "critical", "high", "normal 1", "normal 2", "normal 3", "low"
        ]
    );
    let priorities: Vec<Priority> = claimed.iter().map(|c| c.priority).collect();
    assert_eq!(
        priorities,
        [
            Priority::Critical,
            Priority::High,
            Priority::Normal,
            Priority::Normal,
            Priority::Normal,
            Priority::Low
        ]
    );
}

/// One site's backlog does not hold another site's rows: a site with nothing waiting joins
/// right behind the head, and its rows then alternate with the backlog's. Rows already served
/// do not count: a fresh row after part of the backlog went out joins behind what is left.
pub(crate) async fn sites_take_turns_within_a_priority<S: Rows>(store: &S) {
    let backlog: Vec<Spec> = (1..=20)
        .map(|i| spec("north", &format!("north {i}"), Priority::Normal))
        .collect();
    submit_in_order(
        store,
        &[
            backlog,
            vec![
                spec("south", "south 1", Priority::Normal),
                spec("south", "south 2", Priority::Normal),
            ],
            vec![spec("east", "east 1", Priority::Normal)],
        ],
    )
    .await;
    let epoch = seed::lease(store).await;
    let first = claim(store, epoch, ClaimLanes::in_turn(6)).await;
    // Turns: north 1..20 -> 1..20; south joins behind north's head (1): 2, 3; east: 2.
    assert_eq!(
        subjects(&first),
        [
            "north 1", "north 2", "south 1", "east 1", "north 3", "south 2"
        ]
    );
    for claimed in &first {
        seed::record(store, claimed, End::Delivered).await;
    }
    // South has nothing waiting now; its fresh row goes right behind north's new head (4).
    submit_in_order(store, &[vec![spec("south", "south 3", Priority::Normal)]]).await;
    let next = claim(store, epoch, ClaimLanes::in_turn(3)).await;
    assert_eq!(subjects(&next), ["north 4", "north 5", "south 3"]);
}

/// The longest-waiting share takes the row due longest, whatever its priority, ahead of the
/// rows taken in turn; a claim without that share never takes it while more urgent rows wait.
pub(crate) async fn the_longest_waiting_share_takes_the_oldest_due_row<S: Rows>(store: &S) {
    let urgent: Vec<Spec> = (1..=5)
        .map(|i| spec("north", &format!("critical {i}"), Priority::Critical))
        .collect();
    submit_in_order(
        store,
        &[
            vec![
                spec("north", "low 1", Priority::Low),
                spec("north", "low 2", Priority::Low),
            ],
            urgent,
        ],
    )
    .await;
    let epoch = seed::lease(store).await;
    let in_turn = claim(store, epoch, ClaimLanes::in_turn(2)).await;
    assert_eq!(subjects(&in_turn), ["critical 1", "critical 2"]);
    let shared = claim(
        store,
        epoch,
        ClaimLanes {
            in_turn: 2,
            longest_waiting: 1,
        },
    )
    .await;
    assert_eq!(subjects(&shared), ["low 1", "critical 3", "critical 4"]);
    // The share counts rows, not claims: a share alone takes the next-oldest.
    let alone = claim(
        store,
        epoch,
        ClaimLanes {
            in_turn: 0,
            longest_waiting: 1,
        },
    )
    .await;
    assert_eq!(subjects(&alone), ["low 2"]);
}

/// The priority is stored as submitted (normal when not said), shown in the state, filtered
/// by, and not part of the content: a resubmit that differs only in priority is a duplicate
/// and the stored priority stands.
pub(crate) async fn priority_is_stored_shown_and_filtered<S: OutboxStore>(store: &S) {
    let specs = [
        spec("north", "critical", Priority::Critical),
        spec("north", "high", Priority::High),
        spec("south", "normal", Priority::Normal),
        spec("south", "low", Priority::Low),
    ];
    let rows: Vec<_> = specs.iter().map(seed::submission).collect();
    store.submit(rows.clone()).await.unwrap();
    for (row, spec) in rows.iter().zip(&specs) {
        let state = store.state(row.submission.id).await.unwrap().unwrap();
        assert_eq!(state.priority, spec.priority, "{}", spec.subject);
    }

    let mut resubmit = rows[0].clone();
    resubmit.submission.priority = Priority::Low;
    assert_eq!(
        store.submit(vec![resubmit]).await.unwrap(),
        [InsertOutcome::Duplicate]
    );
    let state = store.state(rows[0].submission.id).await.unwrap().unwrap();
    assert_eq!(state.priority, Priority::Critical);

    let page = store
        .query(PageRequest {
            filter: NotificationFilter {
                priorities: vec![Priority::Critical, Priority::Low],
                ..Default::default()
            },
            after: None,
            size: 10,
        })
        .await
        .unwrap();
    let mut found: Vec<(&str, Priority)> = page
        .rows
        .iter()
        .map(|r| (r.subject.as_str(), r.priority))
        .collect();
    found.sort();
    assert_eq!(
        found,
        [("critical", Priority::Critical), ("low", Priority::Low)]
    );
}
