//! The whole path: site `Send` -> SQLite buffer -> gRPC stream -> central SQLite -> SMTP.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use outbox_proto::v1;
use tokio::net::TcpListener;
use tonic::Code;

use crate::harness::{
    Central, DEADLINE, Db, RECIPIENTS, Site, central_config, eventually, free_addr, send_request,
    smtp_sink,
};

/// Sends `count` notifications from `callers` concurrent tasks; returns id -> (subject, body).
async fn send_concurrently(
    site: &Site,
    callers: usize,
    count: usize,
) -> HashMap<String, (String, String)> {
    let client = site.client().await;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..callers {
        let mut client = client.clone();
        let next = Arc::clone(&next);
        tasks.spawn(async move {
            let mut sent = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= count {
                    return sent;
                }
                let subject = format!("Tank {i} high level");
                let body = format!("Level {}% at sensor {i}", i % 100);
                let id = client
                    .send(send_request(&subject, &body))
                    .await
                    .unwrap()
                    .into_inner()
                    .notification_id;
                sent.push((id, (subject, body)));
            }
        });
    }
    let mut all = HashMap::new();
    while let Some(sent) = tasks.join_next().await {
        for (id, content) in sent.unwrap() {
            assert!(all.insert(id, content).is_none(), "ids are unique");
        }
    }
    assert_eq!(all.len(), count);
    all
}

/// Every id is in central's table exactly once, and nothing else is.
fn assert_exactly_once_in_central(db: &Db, ids: &HashMap<String, (String, String)>) {
    let stored = db.strings("SELECT NotificationId FROM Notifications");
    assert_eq!(stored.len(), ids.len(), "one row per sent notification");
    let stored: HashSet<String> = stored.into_iter().collect();
    let sent: HashSet<String> = ids.keys().cloned().collect();
    assert_eq!(stored, sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_sends_reach_central_once_and_are_mailed_once() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let site = Site::start(dir.path(), central.addr).await;

    let sent = send_concurrently(&site, 50, 1000).await;

    let mails = sink.wait_for_messages(1000, DEADLINE).await;
    assert_eq!(mails.len(), 1000);
    let mut seen = HashSet::new();
    for mail in &mails {
        let message_id = mail.message_id().unwrap();
        let id = message_id
            .trim_start_matches('<')
            .split('@')
            .next()
            .unwrap()
            .to_owned();
        let (subject, body) = sent
            .get(&id)
            .expect("every mail is for a sent notification");
        assert!(seen.insert(id.clone()), "{id} was mailed twice");
        assert_eq!(mail.subject().as_deref(), Some(subject.as_str()));
        assert_eq!(&mail.body_text(), body);
        let mut rcpt = mail.rcpt_to.clone();
        rcpt.sort();
        assert_eq!(rcpt, RECIPIENTS);
    }

    let db = Db::open(&central.db);
    assert_exactly_once_in_central(&db, &sent);
    eventually("every row is Delivered", || {
        let delivered = db.count("SELECT COUNT(*) FROM Notifications WHERE Status = 'Delivered'");
        async move { (delivered == 1000).then_some(()) }
    })
    .await;
    eventually("the site buffer drains", || async {
        (site.depth().await == 0).then_some(())
    })
    .await;
    site.stop().await;
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_are_kept_while_central_is_down_and_drain_when_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central_addr = free_addr().await;
    let site = Site::start(dir.path(), central_addr).await;
    let mut client = site.client().await;

    // Central is not running: Send still answers, after the durable commit.
    let sent = send_concurrently(&site, 8, 200).await;
    assert_eq!(site.depth().await, 200);
    let some_id = sent.keys().next().unwrap().clone();
    let status = client
        .get_status(v1::GetNotificationStatusRequest {
            notification_id: some_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.status(), v1::NotificationStatus::Forwarding);
    let stats = client
        .get_buffer_stats(v1::GetBufferStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!stats.central_reachable);
    assert!(stats.oldest_enqueued_at.is_some());
    // An id the site does not hold needs central, which is down.
    let unavailable = client
        .get_status(v1::GetNotificationStatusRequest {
            notification_id: uuid::Uuid::new_v4().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(unavailable.code(), Code::Unavailable);

    // Central comes up on the address the site was told about.
    let listener = TcpListener::bind(central_addr).await.unwrap();
    let central = Central::start_on(central_config(dir.path(), Some(sink.addr())), listener).await;
    eventually("the site buffer drains", || async {
        (site.depth().await == 0).then_some(())
    })
    .await;
    assert_exactly_once_in_central(&Db::open(&central.db), &sent);
    assert_eq!(sink.wait_for_messages(200, DEADLINE).await.len(), 200);

    // Once forwarded, the site answers status from central.
    let view = eventually("status comes from central", || {
        let mut client = client.clone();
        let id = some_id.clone();
        async move {
            let view = client
                .get_status(v1::GetNotificationStatusRequest {
                    notification_id: id,
                })
                .await
                .ok()?
                .into_inner();
            (view.status() == v1::NotificationStatus::Delivered).then_some(view)
        }
    })
    .await;
    assert_eq!(view.notification_id, some_id);
    site.stop().await;
    central.stop().await;
}

#[tokio::test]
async fn bad_sends_are_invalid_argument_and_nothing_is_buffered() {
    let dir = tempfile::tempdir().unwrap();
    let site = Site::start(dir.path(), free_addr().await).await;
    let mut client = site.client().await;
    type Breaker = fn(&mut v1::SendRequest);
    let cases: &[(&str, Breaker)] = &[
        ("list_name", |m| m.list_name.clear()),
        ("subject", |m| m.subject.clear()),
        ("subject", |m| m.subject = "a\r\nBcc: x@evil.test".into()),
        ("subject", |m| m.subject = "s".repeat(501)),
        ("body", |m| m.body.clear()),
        ("body", |m| m.body = "b".repeat(256 * 1024 + 1)),
        ("type", |m| m.r#type = 77),
        ("origin_execution_id", |m| {
            m.origin_execution_id = Some("nope".into())
        }),
    ];
    for (field, break_it) in cases {
        let mut request = send_request("Tank 4 high level", "Level 97%");
        break_it(&mut request);
        let status = client.send(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{field}");
        assert!(
            status.message().contains(field),
            "{field}: {:?}",
            status.message()
        );
    }
    assert_eq!(site.depth().await, 0);
    let malformed = client
        .get_status(v1::GetNotificationStatusRequest {
            notification_id: "not-a-uuid".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);
    site.stop().await;
}

/// A site-forwarder process with `test_faults` (debug builds only) set through its environment.
fn site_with_faults(
    dir: &std::path::Path,
    site_id: &str,
    addr: std::net::SocketAddr,
    central: std::net::SocketAddr,
    faults: &str,
) -> crate::harness::Process {
    crate::harness::Process(
        tokio::process::Command::new(crate::harness::binary("site-forwarder"))
            .args(["serve", "--site-id", site_id, "--listen"])
            .arg(addr.to_string())
            .arg("--buffer")
            .arg(dir.join(format!("{site_id}.db")))
            .arg("--central")
            .arg(format!("http://{central}"))
            .env("RUST_LOG", "warn")
            .env("OUTBOX_SITE_TEST_FAULTS", faults)
            .env("OUTBOX_SITE_FORWARD_RETRY_INTERVAL", "100ms")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap(),
    )
}

/// Supervision at the site (docs/guarantees.md, "Supervised tasks"): the node's task (the forwarder
/// and the pair's roles) fails at its first two starts (injected); the supervisor restarts it, and
/// a Send still reaches central and is delivered. A node whose task fails at every start takes
/// itself out of service and exits non-zero, for its service manager (or its pair's standby) to
/// take over, instead of taking Sends it would never forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_site_task_is_restarted_and_one_that_keeps_failing_stops_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;

    let addr = free_addr().await;
    let _site = site_with_faults(dir.path(), "site-a", addr, central.addr, "node=2");
    crate::harness::wait_until_serving(addr).await;
    let mut client =
        v1::site_notify_client::SiteNotifyClient::new(crate::harness::channel(addr).await);
    let id = client
        .send(send_request("Tank 4 high level", "Level 97%"))
        .await
        .unwrap()
        .into_inner()
        .notification_id;
    crate::harness::wait_for_status(&central.db, &id, "Delivered").await;

    let doomed_addr = free_addr().await;
    let mut doomed = site_with_faults(
        dir.path(),
        "site-b",
        doomed_addr,
        central.addr,
        "node=always",
    );
    let status = tokio::time::timeout(DEADLINE, doomed.0.wait())
        .await
        .expect("the node stops on its own")
        .unwrap();
    assert!(
        !status.success(),
        "a node out of service exits non-zero: {status}"
    );
    central.stop().await;
}
