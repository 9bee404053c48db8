//! Who goes first when the relay is the bottleneck, seen from outside: real site-forwarder
//! processes send through their local `Send`, central (in this process, real sockets, a real
//! SQLite file) delivers to a real SMTP sink over one connection, and the order the mails
//! arrive in is what is checked.
//!
//! The relay is made the bottleneck without timing: the sink holds its replies while a backlog
//! is built and stored, so the dispatcher can have only the rows it claimed before the hold
//! under way ([`UNDER_WAY`]); when the sink answers again, every later row goes in the serve
//! order. Nothing here depends on how fast the machine is.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use outbox_proto::v1;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use tonic::transport::Channel;

use crate::harness::{
    Central, Db, central_config, channel, eventually, send_request, smtp_sink, spawn_site,
};

/// Rows a site has waiting before the other notification is sent: far more than the
/// dispatcher can have claimed while the relay holds its replies (three, see the module docs).
const BACKLOG: usize = 30;

async fn send(
    client: &mut SiteNotifyClient<Channel>,
    subject: &str,
    priority: v1::NotificationPriority,
) {
    let mut request = send_request(subject, "level 97%");
    request.priority = priority.into();
    client.send(request).await.unwrap();
}

/// Central delivering over a single SMTP connection, with attempt timeouts far longer than the
/// test holds the relay.
/// Rows the dispatcher can have under way when the relay holds its replies: three attempts on
/// the one connection (the one being sent and two lined up behind it, whose envelopes ride
/// behind the message before them) and two claimed ahead.
const UNDER_WAY: usize = 5;

async fn start_central(dir: &Path, smtp: SocketAddr) -> Central {
    let mut config = central_config(dir, Some(smtp));
    let email = config.smtp.as_mut().unwrap();
    email.max_concurrent_connections = 1;
    email.timeout = Duration::from_secs(60);
    email.overall_timeout = Duration::from_secs(60);
    Central::start(config).await
}

async fn wait_until_stored_count(db: &Db, n: i64) {
    eventually(
        &format!("{n} notifications stored at central"),
        || async move { (db.count("SELECT COUNT(*) FROM Notifications") >= n).then_some(()) },
    )
    .await;
}

/// Subjects in the order the sink received them, once `n` have arrived.
async fn arrival_order(sink: &outbox_tests::smtp_sink::SmtpSink, n: usize) -> Vec<String> {
    let mails = sink.wait_for_messages(n, crate::harness::DEADLINE).await;
    assert!(
        mails.len() >= n,
        "only {} of {n} mails arrived",
        mails.len()
    );
    mails
        .iter()
        .map(|m| m.subject().unwrap_or_default())
        .collect()
}

/// Central with its relay held, site A's [`BACKLOG`] of normal notifications stored while the
/// first is held at the relay; then `late` is sent from `late_site` at `priority`, and the order
/// the mails arrived in once the relay answers is returned (with central's database, and the
/// directory that holds it).
async fn backlog_then(
    late_site: &str,
    late: &str,
    priority: v1::NotificationPriority,
) -> (Vec<String>, Db, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.pause_replies();
    let central = start_central(dir.path(), sink.addr()).await;
    let db = Db::open(&central.db);
    let (_site_a, a_addr) = spawn_site(dir.path(), "site-a", central.addr).await;
    let mut a = SiteNotifyClient::new(channel(a_addr).await);
    for i in 1..=BACKLOG {
        let subject = format!("site-a {i}");
        send(&mut a, &subject, v1::NotificationPriority::Normal).await;
    }
    wait_until_stored_count(&db, BACKLOG as i64).await;
    assert!(
        sink.wait_for_held_replies(1, crate::harness::DEADLINE)
            .await,
        "the first delivery reached the relay"
    );
    let _late_site = if late_site == "site-a" {
        send(&mut a, late, priority).await;
        None
    } else {
        let (process, addr) = spawn_site(dir.path(), late_site, central.addr).await;
        let mut client = SiteNotifyClient::new(channel(addr).await);
        send(&mut client, late, priority).await;
        Some(process)
    };
    wait_until_stored_count(&db, BACKLOG as i64 + 1).await;
    sink.resume_replies();
    let order = arrival_order(&sink, BACKLOG + 1).await;
    central.stop().await;
    (order, db, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_notification_overtakes_a_normal_backlog() {
    let (order, db, _dir) =
        backlog_then("site-a", "critical", v1::NotificationPriority::Critical).await;
    let position = order.iter().position(|s| s == "critical").unwrap();
    // Behind at most the rows under way before the hold.
    assert!(
        position <= UNDER_WAY,
        "the critical notification came {}th of {}: {order:?}",
        position + 1,
        order.len()
    );
    // The normal rows kept their order among themselves.
    let normals: Vec<&String> = order.iter().filter(|s| *s != "critical").collect();
    let expected: Vec<String> = (1..=BACKLOG).map(|i| format!("site-a {i}")).collect();
    assert_eq!(normals, expected.iter().collect::<Vec<_>>());
    let stored =
        db.strings("SELECT CAST(Priority AS TEXT) FROM Notifications WHERE Subject = 'critical'");
    assert_eq!(stored, ["0"], "stored as critical (rank 0)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sites_fresh_notification_waits_one_turn_not_the_backlog() {
    let (order, _, _dir) =
        backlog_then("site-b", "site-b fresh", v1::NotificationPriority::Normal).await;
    let position = order.iter().position(|s| s == "site-b fresh").unwrap();
    // Behind the rows claimed before the hold and at most one turn of site A (its head row):
    // the backlog's other rows all come after it.
    assert!(
        position <= UNDER_WAY + 1,
        "site B's notification came {}th of {}: {order:?}",
        position + 1,
        order.len()
    );
    assert!(
        order.len() - position > BACKLOG - UNDER_WAY - 1,
        "most of site A's backlog goes after site B's notification: {order:?}"
    );
}
