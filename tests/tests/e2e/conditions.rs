//! Condition keys end to end: a newer notification with the same key, list and site supersedes
//! the older undelivered ones, and ClearCondition ends a site's undelivered ones, at central and
//! (while central is down) at the site, so a condition that cleared is never mailed. Delivered
//! notifications are never touched. (That a site may clear only its own keys is checked with
//! the other certificate identities, in `tls`.)
//!
//! The relay holds its replies while the keyed notifications arrive, so they are still waiting
//! when the newer one or the clear comes: the dispatcher has only the rows it claimed before
//! the hold (the three attempts it keeps under way on the one connection), and those are
//! fillers without a key.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use outbox_proto::v1;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use outbox_tests::smtp_sink::{Behaviour, SmtpSink};
use tokio::net::TcpListener;

use crate::harness::{
    Central, DEADLINE, Db, binary, central_config, channel, free_addr, send_request, smtp_sink,
    spawn_site, submit, wait_for_attempts_under_way, wait_for_status,
};

/// A submit from site `site` about `key` (empty: none).
fn keyed(subject: &str, site: &str, key: &str) -> v1::NotificationSubmit {
    let mut msg = submit(subject, "level 97%");
    msg.source_site_id = site.into();
    msg.condition_key = key.into();
    msg
}

/// Central delivering over one SMTP connection, with attempt timeouts far beyond any hold.
async fn start_central(dir: &Path, smtp: SocketAddr) -> Central {
    let mut config = central_config(dir, Some(smtp));
    let email = config.smtp.as_mut().unwrap();
    email.max_concurrent_connections = 1;
    email.timeout = Duration::from_secs(60);
    email.overall_timeout = Duration::from_secs(60);
    Central::start(config).await
}

/// Holds the relay with fillers under way: one at the relay and two lined up behind it on the
/// connection. While their slots are busy the channel claims nothing more, so every row
/// submitted from now on waits unclaimed until the relay answers.
async fn hold_the_relay(central: &Central, sink: &SmtpSink) -> Vec<String> {
    sink.pause_replies();
    let mut ingest = central.ingest().await;
    let mut fillers = Vec::new();
    for i in 1..=3 {
        let msg = keyed(&format!("filler {i}"), "site-a", "");
        fillers.push(msg.notification_id.clone());
        ingest.submit_notification(msg).await.unwrap();
    }
    assert!(
        sink.wait_for_held_replies(1, DEADLINE).await,
        "the first filler reached the relay"
    );
    wait_for_attempts_under_way(&central.db, 3).await;
    fillers
}

fn subjects(sink: &SmtpSink) -> BTreeSet<String> {
    sink.messages()
        .iter()
        .map(|m| m.subject().unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_notification_supersedes_and_a_clear_ends_the_undelivered_ones() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = start_central(dir.path(), sink.addr()).await;
    let fillers = hold_the_relay(&central, &sink).await;
    let mut ingest = central.ingest().await;

    let older = keyed("tank 4 high (1)", "site-a", "tank4.level.high");
    let newer = keyed("tank 4 high (2)", "site-a", "tank4.level.high");
    let other_site = keyed("tank 4 high at site b", "site-b", "tank4.level.high");
    let pump = [
        keyed("pump 7 tripped", "site-a", "pump7.trip"),
        keyed("pump 7 tripped again", "site-a", "pump7.trip"),
    ];
    for msg in [&older, &newer, &other_site] {
        ingest.submit_notification(msg.clone()).await.unwrap();
    }
    // The second pump notification supersedes the first; clearing the key ends the second.
    for msg in &pump {
        ingest.submit_notification(msg.clone()).await.unwrap();
    }
    let cleared = ingest
        .clear_condition(v1::ClearConditionRequest {
            condition_key: "pump7.trip".into(),
            source_site_id: "site-a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cleared.cleared, 1);
    // A bad key is refused by name, and changes nothing.
    let refused = ingest
        .clear_condition(v1::ClearConditionRequest {
            condition_key: "pump 7".into(),
            source_site_id: "site-a".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().starts_with("condition_key:"),
        "{}",
        refused.message()
    );

    sink.resume_replies();
    for id in fillers
        .iter()
        .chain([&newer.notification_id, &other_site.notification_id])
    {
        wait_for_status(&central.db, id, "Delivered").await;
    }
    for (msg, status) in [
        (&older, "Superseded"),
        (&pump[0], "Superseded"),
        (&pump[1], "Cleared"),
    ] {
        let (stored, _, _) = wait_for_status(&central.db, &msg.notification_id, status).await;
        assert_eq!(stored, status);
    }
    let mailed = subjects(&sink);
    let expected: BTreeSet<String> = [
        "filler 1",
        "filler 2",
        "filler 3",
        "tank 4 high (2)",
        "tank 4 high at site b",
    ]
    .map(String::from)
    .into();
    assert_eq!(
        mailed, expected,
        "only the notifications still standing are mailed"
    );

    // The history says what replaced the older one, and who cleared.
    let mut outbox = central.outbox().await;
    let detail = outbox
        .get_notification_detail(v1::GetNotificationDetailRequest {
            notification_id: older.notification_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let last = detail.history.last().unwrap();
    assert_eq!(last.kind(), v1::HistoryEntryKind::Superseded);
    assert_eq!(last.superseded_by, newer.notification_id);
    assert_eq!(
        detail.notification.unwrap().status(),
        v1::NotificationStatus::Superseded
    );
    let detail = outbox
        .get_notification_detail(v1::GetNotificationDetailRequest {
            notification_id: pump[1].notification_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let last = detail.history.last().unwrap();
    assert_eq!(last.kind(), v1::HistoryEntryKind::Cleared);
    assert_eq!(last.actor, "site site-a");

    // Clearing the key of a delivered notification changes nothing.
    let cleared = ingest
        .clear_condition(v1::ClearConditionRequest {
            condition_key: "tank4.level.high".into(),
            source_site_id: "site-a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cleared.cleared, 0);
    assert_eq!(
        Db::open(&central.db).row(&newer.notification_id).unwrap().0,
        "Delivered"
    );
    central.stop().await;
}

/// `msg` as enqueued at the site `age` before now.
fn enqueued_ago(mut msg: v1::NotificationSubmit, age: Duration) -> v1::NotificationSubmit {
    let at = chrono::Utc::now() - chrono::Duration::from_std(age).unwrap();
    msg.site_enqueued_at = Some(outbox_proto::time::to_timestamp(at));
    msg
}

/// A site pair's hand-over delivers the old active's rows after the new active's: a keyed
/// notification older by the site's clock arrives after a newer one of its condition. The latest
/// state wins by the site's time, whether the newer one is still waiting or already delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_older_notification_never_reaches_the_relay_after_the_newer_one() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = start_central(dir.path(), sink.addr()).await;
    let mut ingest = central.ingest().await;

    // Both waiting behind a busy relay: "99%" (now), then "95%" (5 s older at the site).
    let fillers = hold_the_relay(&central, &sink).await;
    let newer = keyed("tank 4 at 99%", "site-a", "tank4.level");
    let late = enqueued_ago(
        keyed("tank 4 at 95%", "site-a", "tank4.level"),
        Duration::from_secs(5),
    );
    for msg in [&newer, &late] {
        ingest.submit_notification(msg.clone()).await.unwrap();
    }
    sink.resume_replies();
    for id in fillers.iter().chain([&newer.notification_id]) {
        wait_for_status(&central.db, id, "Delivered").await;
    }
    wait_for_status(&central.db, &late.notification_id, "Superseded").await;

    // The newer one already delivered when the older one arrives.
    let delivered = keyed("pump 7 at 80 bar", "site-a", "pump7.pressure");
    ingest.submit_notification(delivered.clone()).await.unwrap();
    wait_for_status(&central.db, &delivered.notification_id, "Delivered").await;
    let late_after = enqueued_ago(
        keyed("pump 7 at 60 bar", "site-a", "pump7.pressure"),
        Duration::from_secs(5),
    );
    ingest
        .submit_notification(late_after.clone())
        .await
        .unwrap();
    wait_for_status(&central.db, &late_after.notification_id, "Superseded").await;
    // A notification after it is delivered, so the stale one had every chance to go out.
    let after = keyed("after", "site-a", "");
    ingest.submit_notification(after.clone()).await.unwrap();
    wait_for_status(&central.db, &after.notification_id, "Delivered").await;

    let mailed = subjects(&sink);
    for stale in ["tank 4 at 95%", "pump 7 at 60 bar"] {
        assert!(!mailed.contains(stale), "{stale} was mailed: {mailed:?}");
    }
    for current in ["tank 4 at 99%", "pump 7 at 80 bar", "after"] {
        assert!(mailed.contains(current), "{current} missing: {mailed:?}");
    }
    // The history names the state that replaced it.
    let mut outbox = central.outbox().await;
    for (stale, by) in [(&late, &newer), (&late_after, &delivered)] {
        let detail = outbox
            .get_notification_detail(v1::GetNotificationDetailRequest {
                notification_id: stale.notification_id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        let last = detail.history.last().unwrap();
        assert_eq!(last.kind(), v1::HistoryEntryKind::Superseded);
        assert_eq!(last.superseded_by, by.notification_id);
    }
    central.stop().await;
}

/// A keyed notification already at the relay when a newer state or a clear arrives is left to
/// its attempt; when that attempt fails for now, the notification ends Superseded or Cleared
/// rather than being retried and mailed after the newer state or the clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_ended_while_at_the_relay_is_not_retried_after_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = start_central(dir.path(), sink.addr()).await;
    let mut ingest = central.ingest().await;

    sink.pause_replies();
    let superseded = keyed("tank 4 high", "site-a", "tank4.level.high");
    let cleared = keyed("pump 7 tripped", "site-a", "pump7.trip");
    let plain = keyed("no key", "site-a", "");
    for msg in [&superseded, &cleared, &plain] {
        ingest.submit_notification(msg.clone()).await.unwrap();
    }
    wait_for_attempts_under_way(&central.db, 3).await;

    // While all three are out: a newer state of the first's condition, and the second's cleared.
    let newer = keyed("tank 4 high again", "site-a", "tank4.level.high");
    ingest.submit_notification(newer.clone()).await.unwrap();
    let response = ingest
        .clear_condition(v1::ClearConditionRequest {
            condition_key: "pump7.trip".into(),
            source_site_id: "site-a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        response.cleared, 0,
        "a notification at the relay is left to its attempt"
    );

    // The relay refuses the three for now, then accepts.
    sink.set_behaviour_for(
        3,
        Behaviour::RejectData {
            code: 451,
            text: "4.3.0 try again later".into(),
        },
    );
    sink.resume_replies();
    wait_for_status(&central.db, &superseded.notification_id, "Superseded").await;
    wait_for_status(&central.db, &cleared.notification_id, "Cleared").await;
    for msg in [&plain, &newer] {
        wait_for_status(&central.db, &msg.notification_id, "Delivered").await;
    }
    let mailed = subjects(&sink);
    let expected: BTreeSet<String> = ["no key", "tank 4 high again"].map(String::from).into();
    assert_eq!(mailed, expected);

    // Each history: the failed attempt, then the ending it made final.
    let mut outbox = central.outbox().await;
    for (msg, kind) in [
        (&superseded, v1::HistoryEntryKind::Superseded),
        (&cleared, v1::HistoryEntryKind::Cleared),
    ] {
        let detail = outbox
            .get_notification_detail(v1::GetNotificationDetailRequest {
                notification_id: msg.notification_id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        let kinds: Vec<v1::HistoryEntryKind> = detail.history.iter().map(|e| e.kind()).collect();
        assert_eq!(kinds, [v1::HistoryEntryKind::DeliveryAttempt, kind]);
    }
    central.stop().await;
}

/// Central is down while a condition comes and goes at the site: the notifications of the key
/// buffered before the clear (sent with `site-forwarder clear`, as a site script would) reach
/// central as Cleared and are never mailed; another key's, and the key's next notification
/// after the clear, are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_at_the_site_during_a_central_outage_is_never_mailed() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central_addr = free_addr().await;
    let config = central_config(dir.path(), Some(sink.addr()));
    let central = Central::start_on(
        config.clone(),
        TcpListener::bind(central_addr).await.unwrap(),
    )
    .await;
    let (_site, site_addr) = spawn_site(dir.path(), "site-a", central_addr).await;
    let mut client = SiteNotifyClient::new(channel(site_addr).await);
    let send = |subject: &str, key: &str| {
        let mut request = send_request(subject, "level 97%");
        request.condition_key = key.into();
        request
    };

    // Before the outage: delivered as usual.
    let before = client
        .send(send("tank 4 high (before)", "tank4.level.high"))
        .await
        .unwrap()
        .into_inner()
        .notification_id;
    wait_for_status(&central.db, &before, "Delivered").await;
    central.stop().await;

    let mut ids = Vec::new();
    for (subject, key) in [
        ("tank 4 high (1)", "tank4.level.high"),
        ("pump 7 tripped", "pump7.trip"),
        ("tank 4 high (2)", "tank4.level.high"),
    ] {
        let id = client
            .send(send(subject, key))
            .await
            .unwrap()
            .into_inner()
            .notification_id;
        ids.push(id);
    }
    let output = tokio::process::Command::new(binary("site-forwarder"))
        .args(["clear", "--key", "tank4.level.high", "--addr"])
        .arg(format!("http://{site_addr}"))
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "2");
    let after = client
        .send(send("tank 4 high (after the clear)", "tank4.level.high"))
        .await
        .unwrap()
        .into_inner()
        .notification_id;

    let central = Central::start_on(config, TcpListener::bind(central_addr).await.unwrap()).await;
    for (id, status) in [
        (&ids[0], "Cleared"),
        (&ids[1], "Delivered"),
        (&ids[2], "Cleared"),
        (&after, "Delivered"),
        (&before, "Delivered"),
    ] {
        wait_for_status(&central.db, id, status).await;
    }
    let mailed = subjects(&sink);
    let expected: BTreeSet<String> = [
        "tank 4 high (before)",
        "pump 7 tripped",
        "tank 4 high (after the clear)",
    ]
    .map(String::from)
    .into();
    assert_eq!(mailed, expected);
    let db = Db::open(&central.db);
    let history = db.attempts(&ids[0]);
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(history[0].1, "Cleared");
    central.stop().await;
}
