//! Behaviours of the status callbacks' queue: every final status of a notification whose list
//! has an endpoint is queued (an attempt's outcome, an operator's discard after a park), one
//! notification's changes are handed out one at a time in order, a failed call makes its
//! change due again later, an answered or given-up one forgets it, and every call is an entry
//! of the notification's history after the status it told.

use std::time::Duration;

use central_outbox::domain::NotificationId;
use central_outbox::domain::channel::{ListInput, NotificationList};
use central_outbox::domain::history::HistoryEvent;
use central_outbox::domain::status::Status;
use central_outbox::domain::status_callback::CallOutcome;
use central_outbox::records::{DueStatusCallback, StatusCallbackCall};
use central_outbox::store::OutboxStore;
use chrono::Utc;

use crate::seed::{self, End, Rows, Spec};

const ENDPOINT: &str = "https://it.plant.test/outbox/status";

fn list(name: &str, callback: Option<&str>) -> NotificationList {
    NotificationList::parse(ListInput {
        name: name.into(),
        recipients: vec!["a@plant.test".into()],
        status_callback_url: callback.map(str::to_owned),
        ..Default::default()
    })
    .unwrap()
}

/// The due changes as (id, status) pairs, sorted (the store hands them out by due time).
async fn due<S: OutboxStore>(store: &S) -> Vec<DueStatusCallback> {
    let mut due = store.due_status_callbacks(100).await.unwrap().due;
    due.sort_by_key(|d| (d.change.state.id, d.change.seq));
    due
}

fn pairs(due: &[DueStatusCallback]) -> Vec<(NotificationId, Status)> {
    due.iter()
        .map(|d| (d.change.state.id, d.change.state.status))
        .collect()
}

fn call(
    due: &DueStatusCallback,
    outcome: CallOutcome,
    retry_in: Option<Duration>,
) -> StatusCallbackCall {
    let now = Utc::now();
    StatusCallbackCall {
        seq: due.change.seq,
        id: due.change.state.id,
        status: due.change.state.status,
        called_at: now,
        duration: Some(Duration::from_millis(12)),
        outcome,
        error: (outcome != CallOutcome::Answered).then(|| "HTTP 503".to_owned()),
        endpoint: Some("https://it.plant.test:443".to_owned()),
        retry_at: retry_in.map(|d| now + chrono::Duration::from_std(d).unwrap()),
    }
}

pub(crate) async fn each_final_status_is_queued_called_in_order_and_audited<
    S: OutboxStore + Rows,
>(
    store: &S,
) {
    store
        .upsert_list(list("ops", Some(ENDPOINT)))
        .await
        .unwrap();
    store.upsert_list(list("quiet", None)).await.unwrap();
    assert!(
        store
            .due_status_callbacks(100)
            .await
            .unwrap()
            .due
            .is_empty()
    );

    let seeded = seed::seed(
        store,
        &[
            Spec::new("north", "ops", "delivered", End::Delivered),
            Spec::new("north", "ops", "discarded", End::Discarded),
            Spec::new("north", "quiet", "no endpoint", End::Delivered),
            Spec::new("north", "ops", "waiting", End::Pending),
        ],
    )
    .await;
    let id = |subject: &str| seed::id_of(&seeded, subject);

    // The discarded row's second change waits for its first; the quiet list and the waiting
    // row queue nothing.
    let first = due(store).await;
    let mut expected = vec![
        (id("delivered"), Status::Delivered),
        (id("discarded"), Status::Parked),
    ];
    expected.sort_by_key(|(id, _)| *id);
    assert_eq!(pairs(&first), expected);
    for change in &first {
        assert_eq!(change.endpoint.as_ref().map(|u| u.as_str()), Some(ENDPOINT));
        assert_eq!(change.calls, 0);
    }
    let delivered = first
        .iter()
        .find(|d| d.change.state.id == id("delivered"))
        .unwrap();
    assert_eq!(
        delivered.change.delivered_to.as_deref(),
        Some("a@plant.test")
    );
    let parked = first
        .iter()
        .find(|d| d.change.state.id == id("discarded"))
        .unwrap();
    assert!(
        parked
            .change
            .state
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("550")),
        "{parked:?}"
    );

    let backlog = store.status_callback_backlog().await.unwrap();
    assert_eq!(backlog.waiting, 3);
    assert!(backlog.oldest_queued_at.is_some());

    // A failed call makes its change due an hour later; the answered one frees the next
    // change of its notification.
    store
        .record_status_callback(call(
            delivered,
            CallOutcome::Failed,
            Some(Duration::from_secs(3600)),
        ))
        .await
        .unwrap();
    store
        .record_status_callback(call(parked, CallOutcome::Answered, None))
        .await
        .unwrap();
    let second = store.due_status_callbacks(100).await.unwrap();
    assert_eq!(pairs(&second.due), [(id("discarded"), Status::Discarded)]);
    assert!(second.due[0].change.seq > parked.change.seq);

    // Given up: forgotten. Only the rescheduled change waits, due in about an hour.
    store
        .record_status_callback(call(&second.due[0], CallOutcome::GivenUp, None))
        .await
        .unwrap();
    let third = store.due_status_callbacks(100).await.unwrap();
    assert!(third.due.is_empty(), "{:?}", third.due);
    let next = third.next_due_in.expect("the rescheduled change waits");
    assert!(
        next > Duration::from_secs(3000) && next <= Duration::from_secs(3600),
        "{next:?}"
    );
    assert_eq!(store.status_callback_backlog().await.unwrap().waiting, 1);

    // Each call is on its notification's history, after the attempt whose status it told,
    // numbered with the attempts; none changed the notification's status.
    let detail = store.row_detail(id("delivered")).await.unwrap();
    assert_eq!(detail.state.status, Status::Delivered);
    let last = detail.history.last().unwrap();
    assert_eq!(last.sequence as usize, detail.history.len());
    assert_eq!(last.error.as_deref(), Some("HTTP 503"));
    assert_eq!(
        last.event,
        HistoryEvent::StatusCallback {
            outcome: CallOutcome::Failed,
            status: Status::Delivered,
            endpoint: Some("https://it.plant.test:443".to_owned()),
            duration: Some(Duration::from_millis(12)),
        }
    );
    let detail = store.row_detail(id("discarded")).await.unwrap();
    assert_eq!(detail.state.status, Status::Discarded);
    let calls: Vec<(CallOutcome, Status)> = detail
        .history
        .iter()
        .filter_map(|e| match &e.event {
            HistoryEvent::StatusCallback {
                outcome, status, ..
            } => Some((*outcome, *status)),
            _ => None,
        })
        .collect();
    assert_eq!(
        calls,
        [
            (CallOutcome::Answered, Status::Parked),
            (CallOutcome::GivenUp, Status::Discarded)
        ]
    );
    assert!(
        detail
            .history
            .iter()
            .enumerate()
            .all(|(i, e)| e.sequence as usize == i + 1),
        "{:?}",
        detail.history
    );
    let quiet = store.row_detail(id("no endpoint")).await.unwrap();
    assert!(
        quiet
            .history
            .iter()
            .all(|e| !matches!(e.event, HistoryEvent::StatusCallback { .. }))
    );
}
