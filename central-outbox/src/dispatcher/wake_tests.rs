//! The dispatcher wakes for a row's due time: a scheduled notification goes out at its time
//! with no poll to find it. Real SQLite, the real clock, and a poll interval of an hour, so
//! only the wake-up can have claimed the row; the timing asserted is only "not before its
//! time", the rest is a generous deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use outbox_domain::ScriptOrigin;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config_cache::ConfigCache;
use crate::delivery::Adapters;
use crate::dispatcher::{Dispatcher, DispatcherSettings};
use crate::domain::status::Status;
use crate::domain::{NotificationContent, NotificationId, NotificationType, SiteId, Submission};
use crate::metrics::Metrics;
use crate::records::NewNotification;
use crate::store::sqlite::SqliteStore;
use crate::store::{AdminStore, DispatchStore, IngestStore};

/// Far longer than a healthy run needs; reaching it fails the test.
const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_row_is_claimed_at_its_time_without_a_poll() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        SqliteStore::open(
            &dir.path().join("central.db"),
            group_commit::Durability::Full,
        )
        .unwrap(),
    );
    let content = NotificationContent::parse(
        NotificationType::Email,
        "ops".into(),
        "Shift handover".into(),
        "Check the log book.".into(),
        String::new(),
    )
    .unwrap();
    let origin = ScriptOrigin::parse("node-1".into(), "handover.py".into(), None, None).unwrap();
    let now = Utc::now();
    // Whole milliseconds, the precision the store keeps.
    let deliver_after =
        chrono::DateTime::from_timestamp_millis(now.timestamp_millis() + 1500).unwrap();
    let id = NotificationId::generate();
    store
        .submit(vec![NewNotification::new(Submission {
            id,
            content,
            provenance: origin.at_site(SiteId::parse("site-a".into()).unwrap(), now),
            priority: Default::default(),
            condition_key: None,
            cleared_at_site: None,
            deliver_after: Some(deliver_after),
        })])
        .await
        .unwrap();
    let due_in = store
        .next_due_in(NotificationType::Email)
        .await
        .unwrap()
        .expect("the scheduled row is the next one due");
    assert!(due_in <= Duration::from_millis(1500), "{due_in:?}");
    assert_eq!(
        store.next_due_in(NotificationType::Webhook).await.unwrap(),
        None
    );

    let settings = DispatcherSettings {
        node_id: "node-under-test".into(),
        // Only the wake-up for the row's time can claim it.
        poll_interval: Duration::from_secs(3600),
        lease_ttl: Duration::from_secs(10),
        renew_interval: Duration::from_secs(3),
        claim_timeout: Duration::from_secs(60),
        drain_timeout: Duration::from_secs(5),
        claim_batch: None,
        failover: Default::default(),
    };
    let dispatcher = Dispatcher::new(
        Arc::clone(&store),
        Arc::new(Metrics::new()),
        Arc::new(Adapters::new().unwrap()),
        Arc::new(ConfigCache::new()),
        settings,
        Arc::new(Notify::new()),
    );
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(dispatcher.run(shutdown.clone()));

    // No SMTP relay is configured, so its one attempt parks it: the attempt is what shows the
    // row was claimed.
    let started = tokio::time::Instant::now();
    let state = loop {
        let state = store.state(id).await.unwrap().unwrap();
        if state.status != Status::Pending {
            break state;
        }
        assert!(started.elapsed() < DEADLINE, "never claimed: {state:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(state.status, Status::Parked, "{state:?}");
    let attempted = state.last_attempt_at.unwrap();
    assert!(
        attempted >= deliver_after,
        "attempted at {attempted}, before its time {deliver_after}"
    );
    assert_eq!(state.deliver_after, Some(deliver_after), "the time is kept");
    shutdown.cancel();
    task.await.unwrap();
}
