//! Scheduled delivery end to end: a site script's `Send` with a `deliver_after` goes through a
//! real site-forwarder (in this process) to central (real SQLite, or MS SQL under `make
//! test-mssql`), which delivers to a real SMTP sink. Seen from outside: no mail before its
//! time, the notification Pending and scheduled until then (the site's GetStatus, the admin
//! API's status and scheduled filter, `outboxctl list --scheduled`), and the mail within about
//! a second after it. Central's poll is set far longer than that, so only the dispatcher's
//! wake-up for the row's time can deliver it so soon. A `deliver_after` past the 30-day limit
//! is refused at the Send and at central's ingest, naming the field, and nothing is stored.
//! The console lists, filters and details a scheduled notification with its time.
//!
//! Only "not before its time" and the bound after it are timings here; every other wait is for
//! a condition, with a deadline.

use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_proto::time::{from_timestamp, to_timestamp};
use outbox_proto::v1;
use tonic::Code;

use crate::console::Browser;
use crate::harness::{
    Central, DEADLINE, Site, binary, central_config, eventually, send_request, smtp_sink, submit,
    with_console,
};
use crate::operations::run;

/// How long after its time a scheduled mail may arrive: the second the wake-up aims for, and
/// slack for a loaded machine (a database busy with other tests, a relay round trip). A
/// dispatcher that waited for its poll (30 s here) would be far past it.
const LATE_BOUND: Duration = Duration::from_secs(3);

/// Central's poll in these tests: longer than any wait here, so a row is delivered at its time
/// only if the dispatcher wakes for that time.
const SLOW_POLL: Duration = Duration::from_secs(30);

/// `at` cut to whole milliseconds, the precision a site's buffer keeps.
fn millis(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap()
}

fn scheduled_send(subject: &str, at: DateTime<Utc>) -> v1::SendRequest {
    v1::SendRequest {
        deliver_after: Some(to_timestamp(at)),
        ..send_request(subject, "Hand over the log book to the next shift.")
    }
}

fn deliver_after(view: &v1::NotificationStatusView) -> Option<DateTime<Utc>> {
    view.deliver_after.as_ref().and_then(from_timestamp)
}

async fn central_status(central: &Central, id: &str) -> Result<v1::NotificationStatusView, Code> {
    central
        .outbox()
        .await
        .get_notification_status(v1::GetNotificationStatusRequest {
            notification_id: id.into(),
        })
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| status.code())
}

/// The ids QueryNotifications returns for `filter`.
async fn query(central: &Central, filter: v1::NotificationFilter) -> Vec<String> {
    let page = central
        .outbox()
        .await
        .query_notifications(v1::QueryNotificationsRequest {
            filter: Some(filter),
            page_size: 100,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    page.notifications
        .into_iter()
        .map(|n| n.notification_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_notification_is_not_delivered_before_its_time_and_is_within_a_second_after() {
    // Built before anything is timed: the first call builds the workspace's binaries.
    let outboxctl = binary("outboxctl");
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.dispatcher.poll_interval = SLOW_POLL;
    let central = Central::start(config).await;
    let site = Site::start(dir.path(), central.addr).await;
    let mut client = site.client().await;

    // One notification for tomorrow, whose views and filters the checks below read at leisure,
    // and one due in three seconds, whose delivery is timed.
    let tomorrow = millis(Utc::now() + chrono::Duration::days(1));
    let planned = client
        .send(scheduled_send("Maintenance window tomorrow", tomorrow))
        .await
        .unwrap()
        .into_inner()
        .notification_id;
    // Once central shows it, the path from the Send to central's views has been used once (a
    // fresh MS SQL connection pays seconds for its first statements on Babelfish), and what is
    // timed next is the schedule, not a cold start.
    eventually("central stores tomorrow's notification", || async {
        central_status(&central, &planned).await.ok()
    })
    .await;
    // The wall clock and the monotonic clock the sink stamps arrivals with, read together.
    let (anchor, anchor_at) = (std::time::Instant::now(), Utc::now());
    let due = millis(Utc::now() + chrono::Duration::seconds(3));
    let soon = client
        .send(scheduled_send("Shift handover at 06:00", due))
        .await
        .unwrap()
        .into_inner()
        .notification_id;

    // Up to just before its time: nothing at the relay, and the notification Pending at
    // central with its time. Each observation counts only if it ended before the time.
    let mut seen_waiting = 0;
    let mut look = tokio::time::interval(Duration::from_millis(50));
    loop {
        look.tick().await;
        let view = central_status(&central, &soon).await;
        let nothing_sent = sink.messages().is_empty();
        if Utc::now() >= due - chrono::Duration::milliseconds(100) {
            break;
        }
        assert!(nothing_sent, "a mail arrived before its time");
        if let Ok(view) = view {
            assert_eq!(view.status(), v1::NotificationStatus::Pending, "{view:?}");
            assert_eq!(deliver_after(&view), Some(due));
            seen_waiting += 1;
        }
    }
    assert!(seen_waiting > 0, "central never showed it waiting");

    // Then the mail, within about a second after its time.
    let mails = sink.wait_for_messages(1, DEADLINE).await;
    assert_eq!(mails.len(), 1, "exactly the one that was due");
    assert_eq!(
        mails[0].subject().as_deref(),
        Some("Shift handover at 06:00")
    );
    let arrived = sink.receipts()[0].at;
    let arrived_at = anchor_at + chrono::Duration::from_std(arrived - anchor).unwrap();
    let late = (arrived_at - due).to_std();
    assert!(
        late.is_ok(),
        "delivered at {arrived_at}, before its time {due}"
    );
    let late = late.unwrap();
    assert!(
        late <= LATE_BOUND,
        "delivered {late:?} after its time (at most {LATE_BOUND:?})"
    );
    let delivered = eventually("the scheduled mail is recorded Delivered", || async {
        central_status(&central, &soon)
            .await
            .ok()
            .filter(|v| v.status() == v1::NotificationStatus::Delivered)
    })
    .await;
    assert_eq!(deliver_after(&delivered), Some(due), "its time stays shown");

    // The one for tomorrow, as the site, the admin API and outboxctl show it: Pending,
    // scheduled, with its time; the scheduled filter holds it and no longer the delivered one.
    let at_site = client
        .get_status(v1::GetNotificationStatusRequest {
            notification_id: planned.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(at_site.status(), v1::NotificationStatus::Pending);
    assert_eq!(deliver_after(&at_site), Some(tomorrow));
    let scheduled_only = v1::NotificationFilter {
        scheduled_only: true,
        ..Default::default()
    };
    assert_eq!(
        query(&central, scheduled_only).await,
        std::slice::from_ref(&planned)
    );
    let addr = format!("http://{}", central.addr);
    let json = run(
        &outboxctl,
        &["--addr", &addr, "--json", "list", "--scheduled"],
        &[],
        None,
    )
    .await
    .json();
    let rows = json["notifications"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{json}");
    assert_eq!(rows[0]["notification_id"], planned.as_str());
    assert_eq!(rows[0]["status"], "pending");
    let shown: DateTime<Utc> = rows[0]["deliver_after"].as_str().unwrap().parse().unwrap();
    assert_eq!(shown, tomorrow);
    let table = run(
        &outboxctl,
        &["--addr", &addr, "list", "--scheduled"],
        &[],
        None,
    )
    .await;
    assert_eq!(table.code, Some(0), "{}{}", table.stdout, table.stderr);
    let line = table
        .stdout
        .lines()
        .find(|l| l.starts_with(&planned))
        .unwrap_or_else(|| panic!("no row for {planned}:\n{}", table.stdout));
    assert!(line.contains("pending (scheduled)"), "{line}");
    assert!(
        line.contains(&tomorrow.format("%Y-%m-%dT%H:%M:%SZ").to_string()),
        "{line}"
    );
    assert!(!table.stdout.contains(&soon), "delivered: {}", table.stdout);
    assert_eq!(sink.messages().len(), 1, "tomorrow's is not sent today");

    site.stop().await;
    central.stop().await;
}

/// 41 days ahead is past the 30-day limit: the site's Send and central's ingest both refuse it
/// with INVALID_ARGUMENT naming the field and the limit, and neither stores anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deliver_after_past_the_limit_is_refused_naming_the_field_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let central = Central::start(central_config(dir.path(), None)).await;
    let site = Site::start(dir.path(), central.addr).await;
    let mut client = site.client().await;

    let far = Utc::now() + chrono::Duration::days(41);
    let refused = client
        .send(scheduled_send("Too far ahead", far))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().starts_with("deliver_after: is 41 days"),
        "{}",
        refused.message()
    );
    assert!(
        refused.message().ends_with("the limit is 30 days"),
        "{}",
        refused.message()
    );
    assert_eq!(site.depth().await, 0, "nothing buffered");

    let mut msg = submit("Too far ahead", "body");
    msg.deliver_after = Some(to_timestamp(far));
    let id = msg.notification_id.clone();
    let refused = central
        .ingest()
        .await
        .submit_notification(msg)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().starts_with("deliver_after: "),
        "{}",
        refused.message()
    );
    assert!(
        refused.message().contains("the limit is 30 days"),
        "{}",
        refused.message()
    );
    assert_eq!(
        central_status(&central, &id).await.err(),
        Some(Code::NotFound)
    );
    let stored = v1::NotificationFilter {
        subject_contains: "Too far ahead".into(),
        ..Default::default()
    };
    assert!(query(&central, stored).await.is_empty());

    site.stop().await;
    central.stop().await;
}

/// The console lists a scheduled notification with its time and a "scheduled" badge, its
/// "Scheduled only" filter keeps just the ones waiting for their time, and the detail page says
/// when it is due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_and_filters_scheduled_notifications() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = central_config(dir.path(), None);
    with_console(&mut config).await;
    let central = Central::start(config).await;
    let tomorrow = millis(Utc::now() + chrono::Duration::days(1));
    let mut later = submit("Maintenance window tomorrow", "body");
    later.deliver_after = Some(to_timestamp(tomorrow));
    let planned = later.notification_id.clone();
    let now = submit("Tank 4 high level", "body");
    let other = now.notification_id.clone();
    let mut ingest = central.ingest().await;
    ingest.submit_notification(later).await.unwrap();
    ingest.submit_notification(now).await.unwrap();
    let shown = tomorrow.format("%Y-%m-%d %H:%M:%SZ").to_string();

    let mut browser = Browser::new(&central);
    let list = browser.get("/notifications?scheduled=on").await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert!(list.body.contains(&planned), "{}", list.body);
    assert!(!list.body.contains(&other), "{}", list.body);
    assert!(list.body.contains("badge-scheduled"), "{}", list.body);
    assert!(list.body.contains(&shown), "{}", list.body);
    assert!(
        list.body
            .contains(r#"<input type="checkbox" name="scheduled" value="on" checked>"#),
        "the filter shows as set: {}",
        list.body
    );
    let all = browser.get("/notifications").await;
    assert!(all.body.contains(&planned) && all.body.contains(&other));

    let detail = browser.get(&format!("/notifications/{planned}")).await;
    assert_eq!(detail.status, 200, "{}", detail.body);
    assert!(
        detail
            .body
            .contains(&format!("<tr><th>Deliver after</th><td>{shown}</td></tr>")),
        "{}",
        detail.body
    );
    assert!(detail.body.contains("badge-scheduled"), "{}", detail.body);
    central.stop().await;
}
