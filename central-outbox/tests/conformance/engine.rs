//! Behaviours of the delivery engine's side of a store: idempotent submit, the leader lease and
//! its epochs, claims (exclusive, per channel, oldest first, rescued after their timeout) and
//! fenced outcomes.

use std::collections::HashSet;
use std::time::Duration;

use central_outbox::domain::delivery::{AttemptOutcome, Delivered, DeliveryError};
use central_outbox::domain::history::HistoryEvent;
use central_outbox::domain::retry::{Backoff, RetryPolicy, Transition};
use central_outbox::domain::serve_order::ClaimLanes;
use central_outbox::domain::status::Status;
use central_outbox::domain::{NotificationContent, NotificationId, NotificationType, Submission};
use central_outbox::records::{
    AttemptRecord, ClaimedNotification, InsertOutcome, LeaseEpoch, NewNotification,
};
use central_outbox::store::OutboxStore;
use chrono::Utc;

use crate::poll::until;
use crate::seed::{self, LEASE, Rows, Spec};

fn new_row(subject: &str) -> NewNotification {
    seed::submission(&Spec::new("north", "ops", subject, seed::End::Pending))
}

/// The same id with other content.
fn changed(original: &NewNotification, subject: &str) -> NewNotification {
    let c = &original.submission.content;
    let content = NotificationContent::parse(
        c.kind,
        c.list_name.as_str().to_owned(),
        subject.to_owned(),
        c.body.as_str().to_owned(),
        String::new(),
    )
    .unwrap();
    NewNotification::new(Submission {
        content,
        ..original.submission.clone()
    })
}

pub(crate) async fn submit_is_idempotent_and_refuses_other_content_under_an_id<S: OutboxStore>(
    store: &S,
) {
    let a = new_row("tank 1 high");
    let b = new_row("tank 2 high");
    let a_again = a.clone();
    let a_other = changed(&a, "tank 1 LOW");
    let outcomes = store
        .submit(vec![a.clone(), b.clone(), a_again, a_other.clone()])
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        [
            InsertOutcome::Accepted,
            InsertOutcome::Accepted,
            InsertOutcome::Duplicate,
            InsertOutcome::Conflict
        ]
    );
    // Later batches: the same content is a duplicate, other content a conflict, and the stored
    // row keeps what was accepted first.
    let outcomes = store
        .submit(vec![b.clone(), a_other, a.clone()])
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        [
            InsertOutcome::Duplicate,
            InsertOutcome::Conflict,
            InsertOutcome::Duplicate
        ]
    );
    // One row at a time (a backend may store a single row another way): each outcome again.
    let c = new_row("tank 3 high");
    for (row, expected) in [
        (c.clone(), InsertOutcome::Accepted),
        (c, InsertOutcome::Duplicate),
        (a.clone(), InsertOutcome::Duplicate),
        (changed(&a, "tank 1 EMPTY"), InsertOutcome::Conflict),
    ] {
        let subject = row.submission.content.subject.as_str().to_owned();
        assert_eq!(
            store.submit(vec![row]).await.unwrap(),
            [expected],
            "{subject}"
        );
    }
    let stored = store.detail(a.submission.id).await.unwrap().unwrap();
    assert_eq!(stored.state.subject, "tank 1 high");
    assert_eq!(stored.state.status, Status::Pending);
    assert_eq!(stored.body, a.submission.content.body.as_str());
    assert!(stored.history.is_empty());

    // A batch larger than any backend's statement chunk, with an old id in the middle.
    let mut many: Vec<NewNotification> = (0..250).map(|i| new_row(&format!("bulk {i}"))).collect();
    many.insert(125, b.clone());
    let outcomes = store.submit(many.clone()).await.unwrap();
    for (i, (outcome, row)) in outcomes.iter().zip(&many).enumerate() {
        let expected = if i == 125 {
            InsertOutcome::Duplicate
        } else {
            InsertOutcome::Accepted
        };
        assert_eq!(*outcome, expected, "row {i}");
        assert!(store.state(row.submission.id).await.unwrap().is_some());
    }
    assert!(
        store
            .state(NotificationId::generate())
            .await
            .unwrap()
            .is_none()
    );
}

pub(crate) async fn leases_are_exclusive_and_epochs_only_grow<S: Rows>(store: &S) {
    let ttl = Duration::from_secs(600);
    let first = store.acquire_lease(LEASE, "node-a", ttl).await.unwrap();
    let Some(e1) = first else {
        panic!("a free lease is granted");
    };
    assert_eq!(
        store.acquire_lease(LEASE, "node-b", ttl).await.unwrap(),
        None
    );
    // Renewing keeps the epoch.
    assert_eq!(
        store.acquire_lease(LEASE, "node-a", ttl).await.unwrap(),
        Some(e1)
    );
    // Only the holder at its epoch can release, once.
    assert!(!store.release_lease(LEASE, "node-b", e1).await.unwrap());
    assert!(
        !store
            .release_lease(LEASE, "node-a", LeaseEpoch(e1.0 + 1))
            .await
            .unwrap()
    );
    assert!(store.release_lease(LEASE, "node-a", e1).await.unwrap());
    assert!(!store.release_lease(LEASE, "node-a", e1).await.unwrap());
    // A released lease is free, and changing hands bumps the epoch.
    let e2 = store
        .acquire_lease(LEASE, "node-b", ttl)
        .await
        .unwrap()
        .expect("a released lease is free");
    assert!(e2 > e1);
    assert_eq!(
        store.acquire_lease(LEASE, "node-a", ttl).await.unwrap(),
        None
    );
    assert!(store.release_lease(LEASE, "node-b", e2).await.unwrap());
    // Re-taking one's own released lease is a new tenure too.
    let e3 = store
        .acquire_lease(LEASE, "node-b", ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(e3 > e2);
    // Other lease names are independent.
    assert!(
        store
            .acquire_lease("other", "node-a", ttl)
            .await
            .unwrap()
            .is_some()
    );
}

/// A lease is read as stored, with the clock leases are judged by: absent before anyone took
/// it, held by its holder at its epoch until about a TTL after the read, and not held once
/// released.
pub(crate) async fn a_lease_is_read_as_stored<S: Rows>(store: &S) {
    let never = store.read_lease(LEASE).await.unwrap();
    assert_eq!(never.record, None);
    assert!(!never.is_held());
    let ttl = Duration::from_secs(600);
    let epoch = store
        .acquire_lease(LEASE, "node-a", ttl)
        .await
        .unwrap()
        .unwrap();
    let held = store.read_lease(LEASE).await.unwrap();
    assert!(held.is_held(), "{held:?}");
    let record = held.record.clone().unwrap();
    assert_eq!((record.holder.as_str(), record.epoch), ("node-a", epoch));
    // Compared with the read's own clock, not this process's (a database server's may differ).
    let left = (record.expires_at - held.read_at).to_std().unwrap();
    assert!(
        left <= ttl && left > ttl - Duration::from_secs(60),
        "{left:?} of a {ttl:?} lease left just after it was taken"
    );
    assert!(store.release_lease(LEASE, "node-a", epoch).await.unwrap());
    let released = store.read_lease(LEASE).await.unwrap();
    assert!(!released.is_held(), "{released:?}");
    assert!(released.record.unwrap().epoch > epoch);
    assert_eq!(store.read_lease("other").await.unwrap().record, None);
}

async fn claim<S: Rows>(
    store: &S,
    epoch: LeaseEpoch,
    kind: NotificationType,
    limit: usize,
    timeout: Duration,
) -> Vec<ClaimedNotification> {
    store
        .claim_due(LEASE, epoch, kind, ClaimLanes::in_turn(limit), timeout)
        .await
        .unwrap()
}

/// Claims (for a long time) as soon as an expired claim makes rows due again, polling with a
/// deadline rather than sleeping for the claim timeout.
async fn claim_once_due_again<S: Rows>(
    store: &S,
    epoch: LeaseEpoch,
    limit: usize,
) -> Vec<ClaimedNotification> {
    until(
        "an expired claim never became due",
        Duration::from_secs(20),
        || async {
            let again = claim(
                store,
                epoch,
                NotificationType::Email,
                limit,
                Duration::from_secs(600),
            )
            .await;
            (!again.is_empty()).then_some(again)
        },
    )
    .await
}

fn delivered(claim: &ClaimedNotification) -> AttemptRecord {
    outcome(
        claim,
        Ok(Delivered {
            resolved_targets: vec!["a@plant.test".into()],
        }),
    )
}

/// The outcome of `claim` under `result`, with the error text the result carries, handed to a
/// relay whose name has characters JSON escapes (the MS SQL store's outcome texts path).
fn outcome(claim: &ClaimedNotification, result: Result<Delivered, DeliveryError>) -> AttemptRecord {
    let policy = RetryPolicy::clamped(5, Duration::from_secs(30), Backoff::Fixed).0;
    AttemptRecord {
        row_id: claim.row_id,
        id: claim.id,
        attempt_no: claim.attempt_no,
        epoch: claim.epoch,
        outcome: AttemptOutcome::of(&result),
        error: result.as_ref().err().map(|e| e.message().to_owned()),
        duration: Duration::from_millis(42),
        transition: policy.transition(claim.retry_count, &result, Utc::now(), 0.5),
        provider: Some(format!("relay-{}\"%.plant.test:25", claim.attempt_no)),
    }
}

pub(crate) async fn claims_are_exclusive_per_channel_and_outcomes_are_fenced<S: Rows>(store: &S) {
    let mut emails = Vec::new();
    for i in 0..5 {
        let row = new_row(&format!("email {i}"));
        emails.push(row.submission.id);
        store.put(vec![row]).await;
    }
    let hooks: Vec<NewNotification> = (0..2)
        .map(|i| {
            seed::submission(
                &Spec::new("north", "hooks", &format!("hook {i}"), seed::End::Pending).webhook(),
            )
        })
        .collect();
    store.put(hooks.clone()).await;

    let long = Duration::from_secs(600);
    let e1 = store
        .acquire_lease(LEASE, "node-a", long)
        .await
        .unwrap()
        .unwrap();
    // Oldest due first, only the asked-for channel, each row once.
    let first = claim(store, e1, NotificationType::Email, 3, long).await;
    let first_ids: Vec<NotificationId> = first.iter().map(|c| c.id).collect();
    assert_eq!(first_ids, emails[..3]);
    assert!(first.iter().all(|c| c.attempt_no == 1 && c.epoch == e1));
    let rest = claim(store, e1, NotificationType::Email, 10, long).await;
    assert_eq!(rest.iter().map(|c| c.id).collect::<Vec<_>>(), emails[3..]);
    assert!(
        claim(store, e1, NotificationType::Email, 10, long)
            .await
            .is_empty()
    );
    assert_eq!(
        claim(store, e1, NotificationType::Webhook, 10, long)
            .await
            .len(),
        2
    );
    assert!(
        claim(store, e1, NotificationType::Email, 0, long)
            .await
            .is_empty()
    );
    // The InFlight attempt row is written with the claim.
    let history = store.row_detail(emails[0]).await.unwrap().history;
    assert_eq!(history.len(), 1);
    assert_eq!(
        history[0].event,
        HistoryEvent::Attempt {
            outcome: AttemptOutcome::InFlight,
            duration: None,
            lease_epoch: e1.0,
            digest: None,
            provider: None,
        }
    );

    // An outcome under the holding epoch applies.
    assert!(
        store
            .record_outcome(LEASE, delivered(&first[0]))
            .await
            .unwrap()
    );
    let state = store.row_state(emails[0]).await.unwrap();
    assert_eq!(state.status, Status::Delivered);
    assert!(state.delivered_at.is_some() && state.resolved_at.is_some());
    let history = store.row_detail(emails[0]).await.unwrap().history;
    assert!(matches!(
        history[0].event,
        HistoryEvent::Attempt {
            outcome: AttemptOutcome::Delivered,
            ..
        }
    ));
    // ... once: the claim is gone.
    assert!(
        !store
            .record_outcome(LEASE, delivered(&first[0]))
            .await
            .unwrap()
    );

    // The lease changes hands: the deposed epoch can neither record nor claim.
    assert!(store.release_lease(LEASE, "node-a", e1).await.unwrap());
    let e2 = store
        .acquire_lease(LEASE, "node-b", long)
        .await
        .unwrap()
        .unwrap();
    assert!(
        !store
            .record_outcome(LEASE, delivered(&first[1]))
            .await
            .unwrap()
    );
    let state = store.row_state(emails[1]).await.unwrap();
    assert_eq!(state.status, Status::Pending);
    let history = store.row_detail(emails[1]).await.unwrap().history;
    assert!(matches!(
        history[0].event,
        HistoryEvent::Attempt {
            outcome: AttemptOutcome::InFlight,
            ..
        }
    ));
    assert!(
        claim(store, e1, NotificationType::Email, 10, long)
            .await
            .is_empty()
    );
    // The old claims have not run out: the new holder finds nothing due yet.
    assert!(
        claim(store, e2, NotificationType::Email, 10, long)
            .await
            .is_empty()
    );
}

/// A lease that lapsed while nobody else took it is still its holder's: an outcome finished
/// meanwhile is recorded, and re-taking it keeps the epoch, so claims made before the lapse
/// can still be recorded (a slow database must not turn delivered mail into duplicates). Once
/// another node has taken it, the old epoch records nothing.
pub(crate) async fn a_lapsed_lease_stays_its_holders_until_another_takes_it<S: Rows>(store: &S) {
    let rows: Vec<NewNotification> = (0..3).map(|i| new_row(&format!("lapse {i}"))).collect();
    let ids: Vec<NotificationId> = rows.iter().map(|r| r.submission.id).collect();
    store.put(rows).await;
    let ttl = Duration::from_millis(1500);
    let long = Duration::from_secs(600);
    // Claimed under a long lease, so that however slow the server (Babelfish under load), the
    // claim is made while the lease holds.
    let e1 = store
        .acquire_lease(LEASE, "node-a", long)
        .await
        .unwrap()
        .unwrap();
    let claimed = claim(store, e1, NotificationType::Email, 3, long).await;
    assert_eq!(claimed.len(), 3);
    // A row due now, which a claim under a lapsed lease must not take.
    let due = new_row("due while lapsed");
    store.put(vec![due.clone()]).await;
    // The holder renews for no time at all (same holder: same epoch): the lease has lapsed the
    // moment the renewal commits, with nothing to wait out.
    assert_eq!(
        store
            .acquire_lease(LEASE, "node-a", Duration::ZERO)
            .await
            .unwrap(),
        Some(e1)
    );
    assert!(
        claim(store, e1, NotificationType::Email, 3, long)
            .await
            .is_empty(),
        "a lapsed lease claims nothing"
    );
    // Lapsed, nobody else took it: the outcome stands.
    assert!(
        store
            .record_outcome(LEASE, delivered(&claimed[0]))
            .await
            .unwrap()
    );
    // Its holder re-takes it with the same epoch, and the earlier claims still record.
    assert_eq!(
        store.acquire_lease(LEASE, "node-a", ttl).await.unwrap(),
        Some(e1)
    );
    assert!(
        store
            .record_outcome(LEASE, delivered(&claimed[1]))
            .await
            .unwrap()
    );
    // Lapsed again and taken by another node: the old epoch records nothing more. Another node
    // gets the lease once it has lapsed on the database's clock; asked until then, with a
    // deadline far past the TTL.
    let e2 = until(
        "a lapsed lease is free for another node",
        ttl + Duration::from_secs(20),
        || async { store.acquire_lease(LEASE, "node-b", long).await.unwrap() },
    )
    .await;
    assert!(e2 > e1);
    assert!(
        !store
            .record_outcome(LEASE, delivered(&claimed[2]))
            .await
            .unwrap()
    );
    let states = [
        store.row_state(ids[0]).await.unwrap().status,
        store.row_state(ids[1]).await.unwrap().status,
        store.row_state(ids[2]).await.unwrap().status,
    ];
    assert_eq!(
        states,
        [Status::Delivered, Status::Delivered, Status::Pending]
    );
    assert_eq!(
        store.row_state(due.submission.id).await.unwrap().status,
        Status::Pending
    );
}

/// An attempt's outcome applies only to the claim it was made under: once the row was claimed
/// again (its claim ran out and the same epoch re-claimed it), the older attempt records nothing.
pub(crate) async fn an_outcome_applies_only_to_its_own_attempt<S: Rows>(store: &S) {
    let row = new_row("two attempts");
    let id = row.submission.id;
    store.put(vec![row]).await;
    let long = Duration::from_secs(600);
    let e1 = store
        .acquire_lease(LEASE, "node-a", long)
        .await
        .unwrap()
        .unwrap();
    let short = Duration::from_millis(300);
    let first = claim(store, e1, NotificationType::Email, 1, short).await;
    assert_eq!(first.len(), 1);
    let second = claim_once_due_again(store, e1, 1).await;
    assert_eq!(second[0].attempt_no, first[0].attempt_no + 1);
    assert!(
        !store
            .record_outcome(LEASE, delivered(&first[0]))
            .await
            .unwrap(),
        "a stale attempt overwrote the claim of a newer one"
    );
    assert_eq!(store.row_state(id).await.unwrap().status, Status::Pending);
    assert!(
        store
            .record_outcome(LEASE, delivered(&second[0]))
            .await
            .unwrap()
    );
    assert_eq!(store.row_state(id).await.unwrap().status, Status::Delivered);
}

/// Outcomes written in one call each stand or fall on their own claim, come back in order, and
/// store their texts and instants exactly as one-at-a-time writes do: quotes, backslashes, line
/// breaks, control characters, percent signs and any Unicode included.
pub(crate) async fn outcomes_recorded_together_apply_each_on_its_own<S: Rows>(store: &S) {
    let rows: Vec<NewNotification> = (0..6).map(|i| new_row(&format!("group {i}"))).collect();
    store.put(rows).await;
    let epoch = seed::lease(store).await;
    let long = Duration::from_secs(600);
    let claimed = claim(store, epoch, NotificationType::Email, 10, long).await;
    assert_eq!(claimed.len(), 6);
    let tricky = "421 \"busy\" at C:\\relay\n\ttry later: Zürich é ✓ 😀 \u{1} \u{1b}[0m 100% %22 %";
    let plain = "550 5.1.1 <nobody@plant.test>: user unknown, é ✓";
    let targets = || {
        Ok(Delivered {
            resolved_targets: vec![
                "\"Ops \\ Desk\"\t<ops@plant.test>".into(),
                "b@plant.test".into(),
            ],
        })
    };
    let mut stale = outcome(&claimed[4], targets());
    stale.attempt_no += 1;
    let records = vec![
        outcome(&claimed[0], targets()),
        outcome(
            &claimed[1],
            Ok(Delivered {
                resolved_targets: vec!["a@plant.test".into()],
            }),
        ),
        outcome(&claimed[2], Err(DeliveryError::transient(tricky))),
        outcome(&claimed[3], Err(DeliveryError::permanent(plain))),
        stale,
        outcome(&claimed[5], Err(DeliveryError::transient("timed out"))),
        // The same attempt twice: its claim is gone after the first.
        outcome(&claimed[5], targets()),
    ];
    let expected: Vec<AttemptRecord> = records.clone();
    let applied = store.record_outcomes(LEASE, records).await.unwrap();
    assert_eq!(applied, [true, true, true, true, false, true, false]);

    let ids: Vec<NotificationId> = claimed.iter().map(|c| c.id).collect();
    let detail = |i: usize| store.row_detail(ids[i]);
    let close =
        |stored: Option<chrono::DateTime<Utc>>, wanted: Option<chrono::DateTime<Utc>>| match (
            stored, wanted,
        ) {
            (Some(s), Some(w)) => (s - w).num_microseconds().unwrap().abs() < 1_000,
            (s, w) => s.is_none() && w.is_none(),
        };
    for (i, status) in [
        (0, Status::Delivered),
        (1, Status::Delivered),
        (2, Status::Retrying),
        (3, Status::Parked),
        (4, Status::Pending),
        (5, Status::Retrying),
    ] {
        let d = detail(i).await.unwrap();
        assert_eq!(d.state.status, status, "row {i}");
        if i == 4 {
            continue;
        }
        let t = &expected[i].transition;
        assert_eq!(d.state.retry_count, t.retry_count, "row {i}");
        assert_eq!(d.state.last_error, t.last_error, "row {i}");
        assert_eq!(d.resolved_targets, t.resolved_targets, "row {i}");
        assert!(close(d.state.next_attempt_at, t.next_attempt_at), "row {i}");
        assert!(close(d.state.resolved_at, t.resolved_at), "row {i}");
        assert!(close(d.state.delivered_at, t.delivered_at()), "row {i}");
        let attempt = d.history.last().unwrap();
        assert_eq!(attempt.error, expected[i].error, "row {i}");
        assert_eq!(
            attempt.event,
            HistoryEvent::Attempt {
                outcome: expected[i].outcome,
                duration: Some(Duration::from_millis(42)),
                lease_epoch: epoch.0,
                digest: None,
                provider: expected[i].provider.clone(),
            },
            "row {i}"
        );
    }
    let d = detail(2).await.unwrap();
    assert_eq!(d.state.last_error.as_deref(), Some(tricky));
    assert_eq!(
        detail(0).await.unwrap().resolved_targets.as_deref(),
        Some("\"Ops \\ Desk\"\t<ops@plant.test>, b@plant.test")
    );
}

pub(crate) async fn an_expired_claim_is_due_again<S: Rows>(store: &S) {
    let row = new_row("rescue me");
    let id = row.submission.id;
    store.put(vec![row]).await;
    let long = Duration::from_secs(600);
    let e1 = store
        .acquire_lease(LEASE, "node-a", long)
        .await
        .unwrap()
        .unwrap();
    let short = Duration::from_millis(300);
    let claimed = claim(store, e1, NotificationType::Email, 10, short).await;
    assert_eq!(claimed.len(), 1);
    // Its dispatcher "dies"; once the claim runs out, the row is claimed again.
    let again = claim_once_due_again(store, e1, 10).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, id);
    assert_eq!(again[0].attempt_no, 2);
    assert!(
        store
            .record_outcome(LEASE, delivered(&again[0]))
            .await
            .unwrap()
    );
    // Both attempts are in the history: the first stays InFlight, a possible duplicate.
    let history = store.row_detail(id).await.unwrap().history;
    let outcomes: Vec<AttemptOutcome> = history
        .iter()
        .map(|e| match &e.event {
            HistoryEvent::Attempt { outcome, .. } => *outcome,
            other => panic!("only attempts happened: {other:?}"),
        })
        .collect();
    assert_eq!(
        outcomes,
        [AttemptOutcome::InFlight, AttemptOutcome::Delivered]
    );
}

/// Claims take the oldest due row first, whatever made it due: a retry that came due before a
/// backlog of new rows arrived is claimed before them (new rows sorted first used to starve
/// retries for as long as new rows kept coming).
pub(crate) async fn a_due_retry_is_claimed_before_newer_rows<S: Rows>(store: &S) {
    let failing = new_row("failed once");
    let retry_id = failing.submission.id;
    store.put(vec![failing]).await;
    let long = Duration::from_secs(600);
    let epoch = store
        .acquire_lease(LEASE, "node-a", long)
        .await
        .unwrap()
        .unwrap();
    let first = claim(store, epoch, NotificationType::Email, 1, long).await;
    assert_eq!(first.len(), 1);
    // A transient failure whose retry is already due (a second ago).
    let error = "451 4.3.0 try later";
    let failed = AttemptRecord {
        row_id: first[0].row_id,
        id: retry_id,
        attempt_no: first[0].attempt_no,
        epoch,
        outcome: AttemptOutcome::TransientFailure,
        error: Some(error.into()),
        duration: Duration::from_millis(5),
        transition: Transition {
            status: Status::Retrying,
            retry_count: 1,
            next_attempt_at: Some(Utc::now() - chrono::Duration::seconds(1)),
            last_error: Some(error.into()),
            resolved_at: None,
            resolved_targets: None,
        },
        provider: None,
    };
    assert!(store.record_outcome(LEASE, failed).await.unwrap());
    let backlog: Vec<NewNotification> = (0..3).map(|i| new_row(&format!("new {i}"))).collect();
    let backlog_ids: Vec<NotificationId> = backlog.iter().map(|r| r.submission.id).collect();
    for row in backlog {
        // One by one, so "arrived first" is well defined on every backend.
        store.put(vec![row]).await;
    }

    let next = claim(store, epoch, NotificationType::Email, 1, long).await;
    assert_eq!(next.len(), 1);
    assert_eq!(
        next[0].id, retry_id,
        "a newer row was claimed before the due retry"
    );
    let rest = claim(store, epoch, NotificationType::Email, 10, long).await;
    let rest: Vec<NotificationId> = rest.iter().map(|c| c.id).collect();
    assert_eq!(
        rest, backlog_ids,
        "new rows are claimed in the order they arrived"
    );
}

pub(crate) async fn concurrent_claims_never_hand_out_a_row_twice<S>(store: &S)
where
    S: Rows + Clone,
{
    let rows: Vec<NewNotification> = (0..60).map(|i| new_row(&format!("race {i}"))).collect();
    let submitted: HashSet<NotificationId> = rows.iter().map(|r| r.submission.id).collect();
    store.put(rows).await;
    let long = Duration::from_secs(600);
    let epoch = store
        .acquire_lease(LEASE, "node-a", long)
        .await
        .unwrap()
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let batch = store
                    .claim_due(
                        LEASE,
                        epoch,
                        NotificationType::Email,
                        ClaimLanes::in_turn(4),
                        long,
                    )
                    .await
                    .unwrap();
                if batch.is_empty() {
                    return mine;
                }
                mine.extend(batch.into_iter().map(|c| c.id));
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let unique: HashSet<NotificationId> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len(), "a row was claimed twice");
    assert_eq!(unique, submitted);
}
