//! A site pair: an active site-forwarder and its standby. Failover (automatic after a kill -9,
//! and by an operator), a partition in which both nodes are active, and an old active that
//! rejoins. Whatever happens, every acked Send reaches central once and is mailed once.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_proto::v1;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use outbox_tests::link::Link;
use site_forwarder::config::{Config, PairConfig};
use site_forwarder::domain::Role;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::harness::{
    Central, Db, Process, binary, central_config, channel, eventually, free_addr, send_request,
    smtp_sink, wait_until_serving, wait_until_stored,
};

/// Short, so the tests see failovers quickly; heartbeats go every fifth of it.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(1);

/// One node of a pair: where it listens and who its peer is.
#[derive(Debug, Clone)]
struct NodeSpec {
    name: &'static str,
    role: Role,
    send: SocketAddr,
    pair: SocketAddr,
    peer: SocketAddr,
    buffer: PathBuf,
    central: SocketAddr,
    failover_timeout: Duration,
    /// TLS to central and between the nodes; plaintext when `None`.
    tls: Option<site_forwarder::tls::TlsConfig>,
}

impl NodeSpec {
    fn config(&self) -> Config {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut config = Config::new("site-a");
        config.listen_addr = self.send;
        config.buffer_path = self.buffer.clone();
        config.central_url = format!("{scheme}://{}", self.central);
        config.tls = self.tls.clone().unwrap_or_default();
        config.forward_retry_interval = Duration::from_millis(100);
        config.connect_timeout = Duration::from_secs(1);
        config.request_timeout = Duration::from_secs(5);
        config.pair = Some(PairConfig {
            node_name: self.name.into(),
            initial_role: self.role,
            listen: self.pair,
            peer_url: format!("{scheme}://{}", self.peer),
            peer_domain: None,
            send_addr: None,
            failover_timeout: self.failover_timeout,
        });
        config
    }

    /// The same configuration as a file, for a node run as a process.
    fn write_toml(&self, dir: &Path) -> PathBuf {
        let path = dir.join(format!("{}.toml", self.name));
        let role = match self.role {
            Role::Active => "active",
            Role::Standby => "standby",
        };
        std::fs::write(
            &path,
            format!(
                "site_id = \"site-a\"\nlisten_addr = \"{}\"\nbuffer_path = \"{}\"\n\
                 central_url = \"http://{}\"\nforward_retry_interval = \"100ms\"\n\
                 connect_timeout = \"1s\"\nrequest_timeout = \"5s\"\n\
                 [pair]\nnode_name = \"{}\"\ninitial_role = \"{role}\"\nlisten = \"{}\"\n\
                 peer_url = \"http://{}\"\nfailover_timeout = \"{}ms\"\n",
                self.send,
                self.buffer.display(),
                self.central,
                self.name,
                self.pair,
                self.peer,
                self.failover_timeout.as_millis(),
            ),
        )
        .unwrap();
        path
    }
}

/// Specs for nodes `a` (active) and `b` (standby) that reach each other directly.
async fn pair_specs(dir: &Path, central: SocketAddr) -> (NodeSpec, NodeSpec) {
    let (a_pair, b_pair) = (free_addr().await, free_addr().await);
    let a = NodeSpec {
        name: "a",
        role: Role::Active,
        send: free_addr().await,
        pair: a_pair,
        peer: b_pair,
        buffer: dir.join("a.db"),
        central,
        failover_timeout: FAILOVER_TIMEOUT,
        tls: None,
    };
    let b = NodeSpec {
        name: "b",
        role: Role::Standby,
        send: free_addr().await,
        pair: b_pair,
        peer: a_pair,
        buffer: dir.join("b.db"),
        ..a.clone()
    };
    (a, b)
}

/// A node running in this process.
struct Node {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Node {
    async fn start(spec: &NodeSpec) -> Node {
        let listener = TcpListener::bind(spec.send).await.unwrap();
        let stop = CancellationToken::new();
        let token = stop.clone();
        let config = spec.config();
        let task = tokio::spawn(async move {
            site_forwarder::run(config, listener, token).await.unwrap();
        });
        wait_until_serving(spec.send).await;
        Node { stop, task }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

/// A node run as a real process, so it can be killed with SIGKILL.
fn spawn_node(spec: &NodeSpec, dir: &Path) -> Process {
    let config = spec.write_toml(dir);
    Process::spawn(
        &binary("site-forwarder"),
        &["serve", "--config", config.to_str().unwrap()],
    )
}

async fn client(addr: SocketAddr) -> SiteNotifyClient<Channel> {
    SiteNotifyClient::new(channel(addr).await)
}

async fn stats(addr: SocketAddr) -> Option<v1::BufferStats> {
    let mut client = SiteNotifyClient::new(
        Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .ok()?,
    );
    Some(
        client
            .get_buffer_stats(v1::GetBufferStatsRequest {})
            .await
            .ok()?
            .into_inner(),
    )
}

/// Waits until the node at `addr` reports `role` with its peer connected.
async fn wait_for_role(addr: SocketAddr, role: v1::NodeRole) -> v1::BufferStats {
    eventually(
        &format!("{addr} is {role:?} with its peer connected"),
        || async {
            stats(addr)
                .await
                .filter(|s| s.role == i32::from(role) && s.peer_connected)
        },
    )
    .await
}

async fn wait_for_depth(addr: SocketAddr, depth: u64) {
    eventually(&format!("{addr} holds {depth} rows"), || async {
        stats(addr).await.filter(|s| s.depth == depth).map(drop)
    })
    .await;
}

async fn send_n(addr: SocketAddr, n: usize, tag: &str) -> Vec<String> {
    let mut client = client(addr).await;
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let reply = client
            .send(send_request(&format!("{tag} {i}"), "pair test"))
            .await
            .unwrap();
        ids.push(reply.into_inner().notification_id);
    }
    ids
}

/// The notification ids in a node's buffer file.
fn buffered_ids(buffer: &Path) -> HashSet<String> {
    ids_in(buffer, "SELECT notification_id FROM buffered")
}

/// The ids `sql` selects from a node's buffer file.
fn ids_in(buffer: &Path, sql: &str) -> HashSet<String> {
    let conn =
        rusqlite::Connection::open_with_flags(buffer, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut stmt = conn.prepare(sql).unwrap();
    stmt.query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Every id in `acked` is stored once at central and mailed once; nothing else is stored twice
/// or mailed twice. Waits for the mails.
async fn assert_each_stored_and_mailed_once(
    db: &Db,
    sink: &outbox_tests::smtp_sink::SmtpSink,
    acked: &HashSet<String>,
) {
    wait_until_stored(db, acked).await;
    // Sends acked just before a kill (whose answers the callers never saw) may still be on
    // their way: the stored set is read again until every stored row has its mail.
    let stored_ids = eventually("every stored notification is mailed", || {
        let stored: Vec<String> = db.strings("SELECT NotificationId FROM Notifications");
        let done = sink.messages().len() >= stored.len();
        async move { done.then_some(stored) }
    })
    .await;
    let unique: HashSet<&String> = stored_ids.iter().collect();
    assert_eq!(
        unique.len(),
        stored_ids.len(),
        "a notification stored twice"
    );
    let mails = sink.messages();
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for mail in sink.messages() {
        let message_id = mail.message_id().unwrap();
        let id = stored_ids
            .iter()
            .find(|id| message_id.contains(id.as_str()))
            .unwrap_or_else(|| panic!("a mail for nothing stored: {message_id}"));
        *per_id.entry(id.clone()).or_default() += 1;
    }
    let twice: Vec<_> = per_id.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "mailed more than once: {twice:?}");
    assert_eq!(
        mails.len(),
        stored_ids.len(),
        "one mail per stored notification"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_refuses_sends_naming_the_active_and_a_promotion_swaps_the_roles() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let (mut a, mut b) = pair_specs(dir.path(), central.addr).await;
    // No automatic failover here: only the operator's promotion changes roles.
    a.failover_timeout = Duration::from_secs(60);
    b.failover_timeout = a.failover_timeout;
    let node_a = Node::start(&a).await;
    let node_b = Node::start(&b).await;
    wait_for_role(b.send, v1::NodeRole::Standby).await;
    let active = wait_for_role(a.send, v1::NodeRole::Active).await;
    assert_eq!((active.term, active.node_name.as_str()), (1, "a"));

    let mut acked: HashSet<String> = send_n(a.send, 10, "before").await.into_iter().collect();
    let refused = client(b.send)
        .await
        .send(send_request("to the standby", "x"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    let message = refused.message();
    assert!(
        message.contains("(b) is the standby")
            && message.contains(&format!("node a at {}", a.send)),
        "{message}"
    );
    // A script given both addresses reaches the active whichever comes first.
    let both = vec![format!("http://{}", b.send), format!("http://{}", a.send)];
    let args = || site_forwarder::cli::SendArgs {
        list: crate::harness::LIST.into(),
        subject: "via either".into(),
        body: "pair test".into(),
        ..Default::default()
    };
    acked.insert(site_forwarder::cli::send(&both, args()).await.unwrap());
    eventually(
        "the standby has the active's rows and the lag is zero",
        || async {
            let a = stats(a.send).await?;
            (a.standby_lag_rows == 0 && a.peer_connected).then_some(())
        },
    )
    .await;

    let promoted = site_forwarder::cli::promote(&format!("http://{}", b.send))
        .await
        .unwrap();
    assert_eq!(promoted.role, i32::from(v1::NodeRole::Active));
    assert_eq!(promoted.term, 2);
    // The old active sees the higher term, hands its buffer over and follows b.
    let stepped_down = wait_for_role(a.send, v1::NodeRole::Standby).await;
    assert_eq!(stepped_down.active_node, "b");
    let refused = client(a.send)
        .await
        .send(send_request("to the old active", "x"))
        .await
        .unwrap_err();
    assert!(
        refused.message().contains(&format!("node b at {}", b.send)),
        "{}",
        refused.message()
    );
    acked.extend(send_n(b.send, 5, "after").await);
    acked.insert(site_forwarder::cli::send(&both, args()).await.unwrap());

    assert_each_stored_and_mailed_once(&Db::open(&central.db), &sink, &acked).await;
    node_a.stop().await;
    node_b.stop().await;
    central.stop().await;
}

/// Sends from 8 callers to whichever node of the pair accepts, until `total` are acked; records
/// each acked id with the node that acked it and when.
fn spawn_pair_senders(
    addrs: [SocketAddr; 2],
    total: usize,
    acked: Arc<Mutex<Vec<(String, usize, Instant)>>>,
) -> JoinSet<()> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..8 {
        let (acked, next) = (Arc::clone(&acked), Arc::clone(&next));
        tasks.spawn(async move {
            let mut clients: [Option<SiteNotifyClient<Channel>>; 2] = [None, None];
            let mut node = 0;
            let mut refused_in_a_row = 0;
            loop {
                if acked.lock().unwrap().len() >= total {
                    return;
                }
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if clients[node].is_none() {
                    clients[node] = Channel::from_shared(format!("http://{}", addrs[node]))
                        .unwrap()
                        .connect_timeout(Duration::from_millis(500))
                        .connect()
                        .await
                        .ok()
                        .map(SiteNotifyClient::new);
                }
                let sent = match clients[node].as_mut() {
                    Some(c) => c.send(send_request(&format!("load {i}"), "failover")).await,
                    None => Err(tonic::Status::unavailable("not connected")),
                };
                match sent {
                    Ok(reply) => {
                        refused_in_a_row = 0;
                        acked.lock().unwrap().push((
                            reply.into_inner().notification_id,
                            node,
                            Instant::now(),
                        ));
                    }
                    Err(_) => {
                        // The other node, as a script given both addresses would; a refused
                        // or failed Send stored nothing and carries no promise.
                        clients[node] = None;
                        node = 1 - node;
                        refused_in_a_row += 1;
                        // Both refused (the standby is not promoted yet): wait until one of
                        // them is active instead of hammering both.
                        if refused_in_a_row >= 2 {
                            wait_for_an_active(addrs).await;
                            refused_in_a_row = 0;
                        }
                    }
                }
            }
        });
    }
    tasks
}

/// Waits until one node of the pair reports itself active.
async fn wait_for_an_active(addrs: [SocketAddr; 2]) {
    eventually("a node of the pair is active", || async move {
        for addr in addrs {
            if stats(addr)
                .await
                .is_some_and(|s| s.role == i32::from(v1::NodeRole::Active))
            {
                return Some(());
            }
        }
        None
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_active_under_load_loses_nothing_and_mails_each_send_once() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let (a, b) = pair_specs(dir.path(), central.addr).await;
    let process_a = spawn_node(&a, dir.path());
    let _process_b = spawn_node(&b, dir.path());
    wait_until_serving(a.send).await;
    wait_until_serving(b.send).await;
    wait_for_role(b.send, v1::NodeRole::Standby).await;

    let acked = Arc::new(Mutex::new(Vec::new()));
    let mut senders = spawn_pair_senders([a.send, b.send], 1500, Arc::clone(&acked));
    eventually("the active has acked 600 Sends", || {
        let n = acked.lock().unwrap().len();
        async move { (n >= 600).then_some(()) }
    })
    .await;
    process_a.kill9().await;
    let killed_at = Instant::now();
    let promoted = wait_for_role_alone(b.send).await;
    let failover = killed_at.elapsed();
    while senders.join_next().await.is_some() {}
    let acked = acked.lock().unwrap().clone();
    let acked_ids: HashSet<String> = acked.iter().map(|(id, _, _)| id.clone()).collect();
    assert_eq!(promoted.term, 2);

    // What the new active had: everything it forwarded once its buffer drained.
    wait_for_depth(b.send, 0).await;
    let db = Db::open(&central.db);
    let stored: HashSet<String> = db
        .strings("SELECT NotificationId FROM Notifications")
        .into_iter()
        .collect();
    let window: Vec<&(String, usize, Instant)> = acked
        .iter()
        .filter(|(id, _, _)| !stored.contains(id))
        .collect();
    assert!(
        window.iter().all(|(_, node, _)| *node == 0),
        "only Sends acked by the killed active can be missing from the standby's copy"
    );
    let window_ms = window
        .iter()
        .map(|(_, _, at)| killed_at.saturating_duration_since(*at).as_millis())
        .max()
        .unwrap_or(0);
    eprintln!(
        "pair failover: {} Sends acked ({} by the old active); promoted {:?} after the kill; \
         {} acked Sends were not yet on the standby (acked within the last {window_ms} ms \
         before the kill); they are delivered when the old active rejoins",
        acked.len(),
        acked.iter().filter(|(_, node, _)| *node == 0).count(),
        failover,
        window.len()
    );

    // The old active comes back with its disk, steps down and hands its rows over.
    let _process_a = spawn_node(&a, dir.path());
    let rejoined = wait_for_role(a.send, v1::NodeRole::Standby).await;
    assert_eq!(rejoined.active_node, "b");
    assert_each_stored_and_mailed_once(&db, &sink, &acked_ids).await;
    wait_for_depth(a.send, 0).await;
    wait_for_depth(b.send, 0).await;
    central.stop().await;
}

/// Waits until the node at `addr` is active (its peer may be gone).
async fn wait_for_role_alone(addr: SocketAddr) -> v1::BufferStats {
    eventually(&format!("{addr} is active"), || async {
        stats(addr)
            .await
            .filter(|s| s.role == i32::from(v1::NodeRole::Active))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_with_two_actives_stores_and_mails_each_notification_once() {
    let dir = tempfile::tempdir().unwrap();
    let central_addr = free_addr().await;
    let (mut a, mut b) = pair_specs(dir.path(), central_addr).await;
    // Each node reaches its peer through a link the test can cut.
    let to_b = Link::start(b.pair).await.unwrap();
    let to_a = Link::start(a.pair).await.unwrap();
    a.peer = to_b.addr();
    b.peer = to_a.addr();
    let node_a = Node::start(&a).await;
    let node_b = Node::start(&b).await;
    wait_for_role(b.send, v1::NodeRole::Standby).await;

    // Central is down: both buffers hold the first rows.
    let mut acked: HashSet<String> = send_n(a.send, 50, "shared").await.into_iter().collect();
    wait_for_depth(b.send, 50).await;
    to_b.cut();
    to_a.cut();
    let promoted = wait_for_role_alone(b.send).await;
    assert_eq!(promoted.term, 2);
    let a_now = stats(a.send).await.unwrap();
    assert_eq!(
        a_now.role,
        i32::from(v1::NodeRole::Active),
        "a cannot see b"
    );
    acked.extend(send_n(a.send, 20, "a alone").await);
    acked.extend(send_n(b.send, 20, "b alone").await);

    // Both forward, the 50 shared rows from both nodes.
    let sink = smtp_sink().await;
    let central = Central::start_on(
        central_config(dir.path(), Some(sink.addr())),
        TcpListener::bind(central_addr).await.unwrap(),
    )
    .await;
    wait_for_depth(a.send, 0).await;
    wait_for_depth(b.send, 0).await;
    let db = Db::open(&central.db);
    assert_each_stored_and_mailed_once(&db, &sink, &acked).await;
    assert_eq!(db.count("SELECT COUNT(*) FROM Notifications"), 90);

    // The partition heals: a sees b's higher term and becomes its standby.
    to_b.heal();
    to_a.heal();
    let rejoined = wait_for_role(a.send, v1::NodeRole::Standby).await;
    assert_eq!((rejoined.active_node.as_str(), rejoined.term), ("b", 2));
    acked.extend(send_n(b.send, 10, "healed").await);
    assert_each_stored_and_mailed_once(&db, &sink, &acked).await;
    assert_eq!(db.count("SELECT COUNT(*) FROM Notifications"), 100);
    node_a.stop().await;
    node_b.stop().await;
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_active_rejoins_as_standby_and_both_buffers_converge() {
    let dir = tempfile::tempdir().unwrap();
    // Central stays away, so the buffers keep every row and can be compared.
    let central_addr = free_addr().await;
    let (a, b) = pair_specs(dir.path(), central_addr).await;
    let process_a = spawn_node(&a, dir.path());
    let _process_b = spawn_node(&b, dir.path());
    wait_until_serving(a.send).await;
    wait_until_serving(b.send).await;
    wait_for_role(b.send, v1::NodeRole::Standby).await;

    let mut sent: HashSet<String> = send_n(a.send, 100, "first").await.into_iter().collect();
    wait_for_depth(b.send, 100).await;
    process_a.kill9().await;
    wait_for_role_alone(b.send).await;
    sent.extend(send_n(b.send, 50, "second").await);

    let _process_a = spawn_node(&a, dir.path());
    wait_for_role(a.send, v1::NodeRole::Standby).await;
    wait_for_depth(a.send, 150).await;
    assert_eq!(buffered_ids(&b.buffer), sent, "the active holds every Send");
    assert_eq!(
        buffered_ids(&a.buffer),
        sent,
        "the standby holds the same rows"
    );

    // Then central returns and gets each once.
    let sink = smtp_sink().await;
    let central = Central::start_on(
        central_config(dir.path(), Some(sink.addr())),
        TcpListener::bind(central_addr).await.unwrap(),
    )
    .await;
    assert_each_stored_and_mailed_once(&Db::open(&central.db), &sink, &sent).await;
    wait_for_depth(a.send, 0).await;
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_nodes_follow_each_other_and_refuse_another_sites_certificate() {
    use outbox_proto::v1::site_pair_client::SitePairClient;
    use outbox_tests::pki::Pki;

    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "plant").unwrap();
    let server = pki.server_cert().unwrap();
    let node = pki.node_cert("site-a").unwrap();
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.tls.cert = Some(server.cert.clone());
    config.tls.key = Some(server.key.clone());
    config.tls.client_ca = Some(pki.ca_cert().to_path_buf());
    let central = Central::start_tls(config, pki.client_tls(Some(&node)).unwrap()).await;

    let (mut a, mut b) = pair_specs(dir.path(), central.addr).await;
    let tls = site_forwarder::tls::TlsConfig {
        ca: Some(pki.ca_cert().to_path_buf()),
        cert: Some(node.cert.clone()),
        key: Some(node.key.clone()),
        ..Default::default()
    };
    a.tls = Some(tls.clone());
    b.tls = Some(tls);
    let node_a = Node::start(&a).await;
    let node_b = Node::start(&b).await;
    wait_for_role(b.send, v1::NodeRole::Standby).await;
    let acked: HashSet<String> = send_n(a.send, 5, "tls").await.into_iter().collect();
    assert_each_stored_and_mailed_once(&Db::open(&central.db), &sink, &acked).await;

    // A certificate from the same CA but for another site is refused by the pair port.
    let other = pki.node_cert("site-b").unwrap();
    let channel = crate::harness::tls_channel(a.pair, pki.client_tls(Some(&other)).unwrap())
        .await
        .unwrap();
    let refused = SitePairClient::new(channel)
        .get_role(v1::GetRoleRequest {})
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("site-b"),
        "{}",
        refused.message()
    );
    // Without a certificate the handshake itself fails.
    let anonymous = crate::harness::tls_channel(a.pair, pki.client_tls(None).unwrap()).await;
    let refused = match anonymous {
        Err(_) => true,
        Ok(channel) => SitePairClient::new(channel)
            .get_role(v1::GetRoleRequest {})
            .await
            .is_err(),
    };
    assert!(refused, "a caller without a certificate is refused");
    node_a.stop().await;
    node_b.stop().await;
    central.stop().await;
}

/// The notifications a node's buffer file holds a final status of (central sent it back).
fn held_statuses(buffer: &Path) -> HashSet<String> {
    ids_in(buffer, "SELECT notification_id FROM central_statuses")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_gets_the_final_statuses_and_answers_for_them_once_promoted() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let (mut a, mut b) = pair_specs(dir.path(), central.addr).await;
    // Only the operator's promotion changes roles.
    a.failover_timeout = Duration::from_secs(60);
    b.failover_timeout = a.failover_timeout;
    let node_a = Node::start(&a).await;
    let node_b = Node::start(&b).await;
    wait_for_role(b.send, v1::NodeRole::Standby).await;
    wait_for_role(a.send, v1::NodeRole::Active).await;

    let ids: HashSet<String> = send_n(a.send, 5, "decided").await.into_iter().collect();
    // The standby holds every one of them, copied from the active.
    eventually("the standby holds the five final statuses", || {
        let held = held_statuses(&b.buffer);
        let ids = ids.clone();
        async move { ids.is_subset(&held).then_some(()) }
    })
    .await;

    // Central and the old active go away; the promoted standby answers from what it holds.
    central.stop().await;
    node_a.stop().await;
    let promoted = site_forwarder::cli::promote(&format!("http://{}", b.send))
        .await
        .unwrap();
    assert_eq!(promoted.role, i32::from(v1::NodeRole::Active));
    let mut client = client(b.send).await;
    for id in &ids {
        let view = client
            .get_status(v1::GetNotificationStatusRequest {
                notification_id: id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            view.status,
            i32::from(v1::NotificationStatus::Delivered),
            "{view:?}"
        );
        assert!(!view.delivered_to.is_empty(), "{view:?}");
    }
    node_b.stop().await;
}
