//! A link that goes silent: a proxy stops passing bytes without closing anything.
//!
//! - Between a site-forwarder process and central: the site must declare the link dead within
//!   its configured keepalive bound (`GetBufferStats.central_reachable` false), keep taking
//!   Sends, and once the link is back reconnect and drain, every acked Send stored and mailed
//!   once.
//! - Between the standby and the active of a pair: the active must drop the standby's stream
//!   within the pair's bound (`peer_connected` false, the lag still counting), and once the link
//!   is back the pair must settle again with nothing lost.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_proto::v1;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use outbox_tests::link::Link;
use outbox_tests::smtp_sink::SmtpSink;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::harness::{
    Central, Db, Process, binary, central_config, channel, eventually, free_addr, send_request,
    smtp_sink, wait_until_serving, wait_until_stored,
};
use crate::standby_lag::{spawn_node, stats};

/// The link settings a site runs with in these tests and in `link_reset`: what they are about.
pub(crate) struct SiteLink {
    pub forward_retry_interval: Duration,
    pub connect_timeout: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// `[central] ack_timeout`; `None`: the default.
    pub ack_timeout: Option<Duration>,
}

/// A site-forwarder process for `site-a` forwarding to `central` with `link`'s settings.
pub(crate) async fn spawn_linked_site(
    dir: &Path,
    central: SocketAddr,
    link: &SiteLink,
) -> (Process, SocketAddr) {
    let addr = free_addr().await;
    let config: PathBuf = dir.join("site-a.toml");
    let ack_timeout = link
        .ack_timeout
        .map(|t| format!("ack_timeout = \"{}ms\"\n", t.as_millis()))
        .unwrap_or_default();
    std::fs::write(
        &config,
        format!(
            "site_id = \"site-a\"\nlisten_addr = \"{addr}\"\nbuffer_path = \"{}\"\n\
             central_url = \"http://{central}\"\nforward_retry_interval = \"{}ms\"\n\
             connect_timeout = \"{}ms\"\n\
             [central]\nkeepalive_interval = \"{}ms\"\nkeepalive_timeout = \"{}ms\"\n\
             {ack_timeout}",
            dir.join("site-a.db").display(),
            link.forward_retry_interval.as_millis(),
            link.connect_timeout.as_millis(),
            link.keepalive_interval.as_millis(),
            link.keepalive_timeout.as_millis(),
        ),
    )
    .unwrap();
    let process = Process::spawn(
        &binary("site-forwarder"),
        &["serve", "--config", config.to_str().unwrap()],
    );
    wait_until_serving(addr).await;
    (process, addr)
}

/// This test's link: short pings, so the dead link is seen quickly (declared dead at most
/// `keepalive_interval + keepalive_timeout` after central was last heard), and an ack deadline
/// far beyond the test, so only the pings can notice the silence.
const LINK: SiteLink = SiteLink {
    forward_retry_interval: Duration::from_millis(200),
    connect_timeout: Duration::from_secs(1),
    keepalive_interval: Duration::from_millis(300),
    keepalive_timeout: Duration::from_millis(500),
    ack_timeout: Some(Duration::from_secs(120)),
};

/// After a link fault: once the site's buffer has drained, central holds exactly the `acked`
/// Sends, each once, and the sink received exactly one mail for each.
pub(crate) async fn assert_each_acked_send_stored_and_mailed_once(
    client: &SiteNotifyClient<Channel>,
    db: &Db,
    sink: &SmtpSink,
    acked: &HashSet<String>,
) {
    eventually("the buffer drains", || {
        let mut client = client.clone();
        async move { (stats(&mut client).await.depth == 0).then_some(()) }
    })
    .await;
    wait_until_stored(db, acked).await;
    let stored = db.strings("SELECT NotificationId FROM Notifications");
    assert_eq!(
        stored.iter().collect::<HashSet<_>>().len(),
        stored.len(),
        "a notification stored twice"
    );
    assert_eq!(
        &stored.iter().cloned().collect::<HashSet<_>>(),
        acked,
        "central holds exactly the acked Sends"
    );
    eventually("every stored notification is mailed", || {
        let done = sink.messages().len() >= stored.len();
        async move { done.then_some(()) }
    })
    .await;
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for mail in sink.messages() {
        let message_id = mail.message_id().unwrap();
        let id = acked
            .iter()
            .find(|id| message_id.contains(id.as_str()))
            .unwrap_or_else(|| panic!("a mail for nothing acked: {message_id}"));
        *per_id.entry(id.clone()).or_default() += 1;
    }
    let twice: Vec<_> = per_id.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "mailed more than once: {twice:?}");
    assert_eq!(per_id.len(), acked.len(), "every acked Send is mailed");
}

/// Sends one notification after another (subjects `"{subject} {i}"`) until `stop`, recording
/// each acked id.
pub(crate) fn keep_sending(
    mut client: SiteNotifyClient<Channel>,
    subject: &'static str,
    acked: Arc<Mutex<Vec<String>>>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // Paced so the test mails hundreds, not tens of thousands.
        let mut pace = tokio::time::interval(Duration::from_millis(10));
        let mut i = 0;
        while !stop.is_cancelled() {
            pace.tick().await;
            let reply = client
                .send(send_request(&format!("{subject} {i}"), "x"))
                .await
                .unwrap();
            acked
                .lock()
                .unwrap()
                .push(reply.into_inner().notification_id);
            i += 1;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_link_is_declared_dead_within_the_keepalive_bound_and_drains_once_healed() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let link = Link::start(central.addr).await.unwrap();
    let (_site, addr) = spawn_linked_site(dir.path(), link.addr(), &LINK).await;
    let mut client = SiteNotifyClient::new(channel(addr).await);
    let db = Db::open(&central.db);

    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = CancellationToken::new();
    let sender = keep_sending(
        SiteNotifyClient::new(channel(addr).await),
        "silent link",
        Arc::clone(&acked),
        stop.clone(),
    );
    eventually("Sends flow through the link to central", || {
        let stored = db.count("SELECT COUNT(*) FROM Notifications");
        async move { (stored >= 20).then_some(()) }
    })
    .await;
    assert!(stats(&mut client).await.central_reachable);

    link.black_hole();
    let silenced = Instant::now();
    // Dead at most interval + timeout after central was last heard, which is before the black
    // hole began; the margin is for a busy machine's scheduling, far below the 20 s this took
    // before the pings were configurable.
    let bound = LINK.keepalive_interval + LINK.keepalive_timeout;
    let deadline = silenced + bound * 4 + Duration::from_secs(2);
    let mut poll = tokio::time::interval(Duration::from_millis(20));
    loop {
        poll.tick().await;
        let now = stats(&mut client).await;
        if !now.central_reachable {
            assert_eq!(
                now.in_flight, 0,
                "nothing counts as in flight on a dead link"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "central still reported reachable {:?} after the link went silent (pings every \
             {:?}, answer within {:?})",
            silenced.elapsed(),
            LINK.keepalive_interval,
            LINK.keepalive_timeout,
        );
    }
    // Sends are still taken while the link is silent, and stay buffered.
    let during = acked.lock().unwrap().len();
    eventually("Sends are acked while the link is silent", || {
        let now = acked.lock().unwrap().len();
        async move { (now >= during + 20).then_some(()) }
    })
    .await;
    assert!(stats(&mut client).await.depth > 0);

    link.heal();
    eventually("the site reconnects once the link is back", || {
        let mut client = client.clone();
        async move { stats(&mut client).await.central_reachable.then_some(()) }
    })
    .await;
    stop.cancel();
    sender.await.unwrap();
    let acked: HashSet<String> = acked.lock().unwrap().iter().cloned().collect();
    assert_each_acked_send_stored_and_mailed_once(&client, &db, &sink, &acked).await;
    central.stop().await;
}

/// The pair's timing comes from `failover_timeout`: pings after a fifth of it without a byte,
/// unanswered for two fifths, drop a connection.
const PAIR_FAILOVER_TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_pair_link_drops_the_standby_stream_and_the_pair_settles_once_healed() {
    let dir = tempfile::tempdir().unwrap();
    // No central: every row stays buffered, so both buffers can be compared at the end.
    let central = free_addr().await;
    let (a_send, a_pair, b_send, b_pair) = (
        free_addr().await,
        free_addr().await,
        free_addr().await,
        free_addr().await,
    );
    // The standby reaches the active through the link; the active reaches it directly.
    let link = Link::start(a_pair).await.unwrap();
    let a = (a_send, a_pair, b_pair);
    let _a = spawn_node(dir.path(), "a", "active", a, central, PAIR_FAILOVER_TIMEOUT).await;
    let b = (b_send, b_pair, link.addr());
    let _b = spawn_node(
        dir.path(),
        "b",
        "standby",
        b,
        central,
        PAIR_FAILOVER_TIMEOUT,
    )
    .await;
    let mut a_client = SiteNotifyClient::new(channel(a_send).await);
    for i in 0..10 {
        a_client
            .send(send_request(&format!("before {i}"), "x"))
            .await
            .unwrap();
    }
    eventually("the standby follows through the link", || {
        let mut a = a_client.clone();
        async move {
            let s = stats(&mut a).await;
            (s.peer_connected && s.standby_lag_rows == 0).then_some(())
        }
    })
    .await;

    link.black_hole();
    let silenced = Instant::now();
    let heartbeat = PAIR_FAILOVER_TIMEOUT / 5;
    let bound = heartbeat + heartbeat * 2;
    // The margin is for a busy machine; the standby may promote itself meanwhile (it has heard
    // nothing for failover_timeout), which the end of the test allows for.
    let deadline = silenced + bound * 2 + Duration::from_secs(1);
    let mut poll = tokio::time::interval(Duration::from_millis(20));
    loop {
        poll.tick().await;
        if !stats(&mut a_client).await.peer_connected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the active still reported its standby connected {:?} after the pair link went \
             silent (pings after {heartbeat:?}, answer within {:?})",
            silenced.elapsed(),
            heartbeat * 2
        );
    }
    // What the active takes now is on no standby, and the lag says so.
    a_client
        .send(send_request("while silent", "x"))
        .await
        .unwrap();
    assert!(stats(&mut a_client).await.standby_lag_rows >= 1);

    // Healed, one node is active and the other follows it with everything, whether or not the
    // standby promoted itself meanwhile (the old active then hands its rows over).
    link.heal();
    let b_client = SiteNotifyClient::new(channel(b_send).await);
    let (active, standby) = eventually("the pair settles with the standby caught up", || {
        let (mut a, mut b) = (a_client.clone(), b_client.clone());
        async move {
            let (a, b) = (stats(&mut a).await, stats(&mut b).await);
            let active = i32::from(v1::NodeRole::Active);
            let standby = i32::from(v1::NodeRole::Standby);
            let settled = |x: &v1::BufferStats, y: &v1::BufferStats| {
                x.role == active
                    && y.role == standby
                    && x.peer_connected
                    && y.peer_connected
                    && x.standby_lag_rows == 0
                    && x.depth == 11
                    && y.depth == 11
            };
            if settled(&a, &b) {
                Some((a, b))
            } else if settled(&b, &a) {
                Some((b, a))
            } else {
                None
            }
        }
    })
    .await;
    assert_eq!(standby.active_node, active.node_name);
}
