//! The retention purge: only terminal rows resolved before the cutoff go, with their history;
//! the Parked ones among them are counted apart.

use chrono::Utc;

use central_outbox::domain::status::Status;

use crate::seed::{self, End, Rows, Spec};

pub(crate) async fn purge_removes_only_terminal_rows_past_retention<S: Rows>(store: &S) {
    let ends = [
        End::Pending,
        End::Retrying(3600),
        End::Retrying(-5),
        End::Delivered,
        End::Parked,
        End::Discarded,
    ];
    let specs: Vec<Spec> = (0..30)
        .map(|i| {
            Spec::new(
                "north",
                "ops",
                &format!("purge row {i}"),
                ends[i % ends.len()],
            )
        })
        .collect();
    let seeded = seed::seed(store, &specs).await;

    // A cutoff before everything resolved deletes nothing.
    let early = store
        .purge_terminal(Utc::now() - chrono::Duration::hours(1), 1000)
        .await
        .unwrap();
    assert_eq!(early.notifications, 0);

    // What should go, and how much history it has.
    let mut doomed = Vec::new();
    let mut doomed_history = 0;
    let mut doomed_parked = 0;
    for s in &seeded {
        let detail = store.row_detail(s.id).await.unwrap();
        if matches!(
            detail.state.status,
            Status::Delivered | Status::Parked | Status::Discarded
        ) {
            doomed_history += detail.history.len() as u64;
            doomed_parked += u64::from(detail.state.status == Status::Parked);
            doomed.push(s.id);
        }
    }
    assert_eq!(doomed.len(), 15);

    // In small batches, as the purge task runs it: each batch is bounded.
    let cutoff = Utc::now() + chrono::Duration::seconds(1);
    let (mut notifications, mut parked, mut history) = (0, 0, 0);
    loop {
        let batch = store.purge_terminal(cutoff, 4).await.unwrap();
        assert!(batch.notifications <= 4);
        notifications += batch.notifications;
        parked += batch.parked;
        history += batch.history_entries;
        if batch.notifications < 4 {
            break;
        }
    }
    assert_eq!(notifications, doomed.len() as u64);
    assert_eq!(history, doomed_history);
    assert_eq!(doomed_parked, 5);
    assert_eq!(
        parked, doomed_parked,
        "Parked rows purged are counted apart"
    );

    for s in &seeded {
        let detail = store.row_detail(s.id).await;
        if doomed.contains(&s.id) {
            assert!(detail.is_none(), "{} should be purged", s.spec.subject);
        } else {
            let detail = detail.expect("live rows are never purged");
            assert_eq!(detail.state.status, s.spec.status());
            if s.spec.end != End::Pending {
                assert!(!detail.history.is_empty(), "live rows keep their history");
            }
        }
    }
}
