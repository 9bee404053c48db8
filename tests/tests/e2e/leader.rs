//! The dispatcher lease across real central-outbox processes that share one database
//! (docs/guarantees.md, "Several central replicas"): only the lease holder dispatches; when it
//! dies, stalls or shuts down another replica takes over; and a deposed holder can never record an
//! outcome over its successor's.
//!
//! Who dispatched is checked two ways. From the data: every attempt row carries the LeaseEpoch
//! its claim was made under, and since a claim needs its epoch's lease unexpired while a new epoch
//! needs the old one expired, all claims of one epoch precede all claims of the next
//! ([`assert_epochs_take_turns`]). From the processes: a [`LeaderWatch`] scrapes every replica's
//! `/metrics` (`outbox_dispatcher_leader`, `outbox_dispatcher_lease_epoch`) and the `Leases` row
//! throughout a test, and no look may find two replicas leading ([`LeaderWatch::finish`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_proto::v1;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use outbox_tests::smtp_sink::SmtpSink;
use tokio::task::{JoinHandle, JoinSet};
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::harness::{
    CentralDatabase, DEADLINE, Db, LIST, Process, RECIPIENTS, binary, channel, database_url,
    eventually, free_addr, smtp_sink, submit, wait_until_serving,
};

/// A stopped process still accepts TCP connections (the kernel does) but never answers; a scrape
/// that takes longer than this counts as "no answer". Generous for a loaded 2-core machine.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(1);

/// How often the [`LeaderWatch`] looks. Every lease in these tests lasts seconds, so each is seen
/// many times. Each look scrapes every replica's /metrics, which computes the KPIs from the
/// store: looking more often loads a slow database server (Babelfish) enough to delay the
/// very lease renewals being watched.
const LOOK_INTERVAL: Duration = Duration::from_millis(200);

/// Timings of one test's replicas: short, so that takeovers happen within seconds.
#[derive(Debug, Clone, Copy)]
struct Timings {
    lease_ttl: &'static str,
    /// `None`: the default, a third of the TTL.
    renew_interval: Option<&'static str>,
    /// How long a claimed row stays claimed; a dead or stalled leader's rows are due again after
    /// it. A delivery attempt is cut off at half of it.
    claim_timeout: &'static str,
    /// SMTP sessions, hence deliveries, in flight at once on the leader.
    connections: u32,
    /// Supervised task starts that fail on purpose (`test_faults`, debug builds only).
    faults: Option<&'static str>,
    /// TOML appended to the configuration (more lists, a list's escalation); empty: none.
    extra: &'static str,
}

/// One central-outbox process of the cluster, with its own gRPC and metrics ports.
struct Replica {
    node: String,
    addr: SocketAddr,
    metrics: SocketAddr,
    process: Process,
}

impl Replica {
    /// Starts `central-outbox --config FILE` on the cluster's database in `dir`, without waiting
    /// for it to serve (so several replicas can start together).
    async fn spawn(dir: &Path, node: &str, sink: &SmtpSink, timings: Timings) -> Self {
        let addr = free_addr().await;
        let metrics = free_addr().await;
        let config = write_config(dir, node, addr, metrics, sink.addr(), timings);
        let process = Process::spawn(
            &binary("central-outbox"),
            &["--config", config.to_str().unwrap()],
        );
        Self {
            node: node.to_owned(),
            addr,
            metrics,
            process,
        }
    }

    async fn start(dir: &Path, node: &str, sink: &SmtpSink, timings: Timings) -> Self {
        let replica = Self::spawn(dir, node, sink, timings).await;
        wait_until_serving(replica.addr).await;
        replica
    }

    async fn leadership(&self) -> Leadership {
        leadership(self.metrics).await
    }

    /// What a replica that is known to be running (not stopped) says about the lease: a scrape
    /// that times out is asked again, since on a slow database server computing the KPIs alone
    /// can outlast [`SCRAPE_TIMEOUT`].
    async fn answered_leadership(&self) -> Leadership {
        eventually("the replica answers a scrape of /metrics", || async {
            match self.leadership().await {
                Leadership::Silent => None,
                answer => Some(answer),
            }
        })
        .await
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`) with kill(1): no new crate for one syscall.
    fn signal(&self, signal: &str) {
        let pid = self.process.0.id().expect("the replica is running");
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {pid}: {status}");
    }

    /// Waits for the process to exit on its own.
    async fn exited(mut self) -> ExitStatus {
        tokio::time::timeout(DEADLINE, self.process.0.wait())
            .await
            .unwrap_or_else(|_| panic!("{} did not exit", self.node))
            .unwrap()
    }

    async fn kill9(self) {
        self.process.kill9().await;
    }
}

/// Writes the TOML a replica starts from: all replicas share `central.db` in `dir`.
fn write_config(
    dir: &Path,
    node: &str,
    addr: SocketAddr,
    metrics: SocketAddr,
    smtp: SocketAddr,
    timings: Timings,
) -> PathBuf {
    let path = dir.join(format!("{node}.toml"));
    let renew = timings
        .renew_interval
        .map(|r| format!("renew_interval = \"{r}\"\n"))
        .unwrap_or_default();
    let recipients = RECIPIENTS.map(|r| format!("\"{r}\"")).join(", ");
    let faults = timings
        .faults
        .map(|f| format!("test_faults = \"{f}\"\n"))
        .unwrap_or_default();
    let config = format!(
        r#"{faults}listen_addr = "{addr}"
metrics_listen = "{metrics}"
database = "{db}"
node_id = "{node}"
shutdown_timeout = "5s"

[dispatcher]
poll_interval = "200ms"
lease_ttl = "{ttl}"
{renew}claim_timeout = "{claim}"

[smtp]
host = "{smtp_host}"
port = {smtp_port}
tls = "none"
from_address = "outbox@plant.example.test"
max_retries = 5
retry_delay = "300ms"
max_concurrent_connections = {connections}
timeout = "5s"
overall_timeout = "5s"

[[lists]]
name = "{LIST}"
type = "email"
recipients = [{recipients}]
{extra}"#,
        db = database_url(&dir.join("central.db")),
        ttl = timings.lease_ttl,
        claim = timings.claim_timeout,
        smtp_host = smtp.ip(),
        smtp_port = smtp.port(),
        connections = timings.connections,
        extra = timings.extra,
    );
    std::fs::write(&path, config).unwrap();
    path
}

/// What a replica's `/metrics` says about the dispatcher lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leadership {
    /// No answer: dead, stopped, or shutting down.
    Silent,
    Standby,
    /// Holds the lease under this epoch.
    Leader(i64),
}

async fn leadership(metrics: SocketAddr) -> Leadership {
    let scrape = tokio::time::timeout(SCRAPE_TIMEOUT, metrics_endpoint::get(metrics, "/metrics"));
    let Ok(Ok(reply)) = scrape.await else {
        return Leadership::Silent;
    };
    if reply.status != 200 {
        return Leadership::Silent;
    }
    let leader = metrics_endpoint::sample(&reply.body, "outbox_dispatcher_leader");
    let epoch = metrics_endpoint::sample(&reply.body, "outbox_dispatcher_lease_epoch");
    match (leader, epoch) {
        (Some(leader), Some(epoch)) if leader > 0.5 => Leadership::Leader(epoch as i64),
        (Some(_), _) => Leadership::Standby,
        _ => panic!(
            "/metrics on {metrics} lacks the lease gauges:\n{}",
            reply.body
        ),
    }
}

/// Waits until one of `replicas` leads (under an epoch above `after`) and returns its index and
/// epoch.
async fn wait_for_leader(replicas: &[Replica], after: i64) -> (usize, i64) {
    eventually(
        &format!("a replica holds the lease under an epoch above {after}"),
        || async move {
            for (i, replica) in replicas.iter().enumerate() {
                if let Leadership::Leader(epoch) = replica.leadership().await
                    && epoch > after
                {
                    return Some((i, epoch));
                }
            }
            None
        },
    )
    .await
}

/// One look at the cluster.
#[derive(Debug)]
struct Look {
    /// Replicas whose `/metrics` said they hold the lease.
    leaders: Vec<Reading>,
    /// The `Leases` row: holder and epoch.
    lease: Option<(String, i64)>,
}

/// A replica's `/metrics` saying it holds the lease under `epoch`, at some moment between
/// `asked` and `answered`.
#[derive(Debug)]
struct Reading {
    node: String,
    epoch: i64,
    asked: Instant,
    answered: Instant,
}

/// Looks at every replica's lease gauges and the `Leases` row, every [`LOOK_INTERVAL`], until
/// [`LeaderWatch::finish`].
///
/// One look scrapes the replicas one after another, not at one instant, and on a slow database
/// a scrape takes seconds (it may wait for the KPI query): long enough for a leader scraped
/// early in the look to hand over to one scraped late. So two leaders in one look prove two at
/// once only in the other order: a replica still leading under an older epoch when asked after
/// another had answered that it led under a newer one. A leader stops calling itself one (its
/// own timer, started before its last renewal was sent) before the database lets anyone else
/// take the lease, so that never happens; the order of the scrapes alternates from look to look,
/// so a lasting double leader is caught whichever replica comes first. A replica that cannot run
/// that timer, being stopped or having had its lease ended behind its back, is paused in the
/// watch by the test meanwhile.
struct LeaderWatch {
    /// Replicas not to scrape right now: a stopped process answers nothing, and just after it
    /// resumes its metrics may answer before its dispatcher has noticed the lease ran out.
    paused: Arc<Mutex<HashSet<String>>>,
    stop: CancellationToken,
    task: JoinHandle<Vec<Look>>,
}

impl LeaderWatch {
    /// Starts looking, and returns once the first look is taken: what the test does next (a
    /// pause, a kill) comes after the watch has seen how things stood.
    async fn start(replicas: &[&Replica], db: &Path) -> Self {
        let targets: Vec<(String, SocketAddr)> = replicas
            .iter()
            .map(|r| (r.node.clone(), r.metrics))
            .collect();
        let paused = Arc::new(Mutex::new(HashSet::new()));
        let stop = CancellationToken::new();
        let (taken, mut looks_taken) = tokio::sync::watch::channel(0usize);
        let task = tokio::spawn({
            let paused = Arc::clone(&paused);
            let stop = stop.clone();
            let db = db.to_owned();
            async move {
                let db = Db::open(&db);
                let mut looks = Vec::new();
                let mut tick = tokio::time::interval(LOOK_INTERVAL);
                while !stop.is_cancelled() {
                    tick.tick().await;
                    let mut leaders = Vec::new();
                    let mut order: Vec<&(String, SocketAddr)> = targets.iter().collect();
                    if looks.len() % 2 == 1 {
                        order.reverse();
                    }
                    for (node, metrics) in order {
                        if paused.lock().unwrap().contains(node) {
                            continue;
                        }
                        let asked = Instant::now();
                        if let Leadership::Leader(epoch) = leadership(*metrics).await {
                            leaders.push(Reading {
                                node: node.clone(),
                                epoch,
                                asked,
                                answered: Instant::now(),
                            });
                        }
                    }
                    // A replica paused while this look went on is left out: what it said
                    // before the pause is not to be set beside what another said after it
                    // (on a slow database a look takes seconds, enough for the lease to move).
                    let paused_now = paused.lock().unwrap().clone();
                    leaders.retain(|r| !paused_now.contains(&r.node));
                    let lease = db
                        .rows(
                            "SELECT Holder, Epoch FROM Leases WHERE Name = 'dispatcher'",
                            |r| Ok((r.get(0)?, r.get(1)?)),
                        )
                        .pop();
                    looks.push(Look { leaders, lease });
                    taken.send_replace(looks.len());
                }
                looks
            }
        });
        looks_taken
            .wait_for(|taken| *taken >= 1)
            .await
            .expect("the leader watch takes its first look");
        Self { paused, stop, task }
    }

    fn pause(&self, replica: &Replica) {
        self.paused.lock().unwrap().insert(replica.node.clone());
    }

    fn resume(&self, replica: &Replica) {
        self.paused.lock().unwrap().remove(&replica.node);
    }

    /// Stops looking and checks what was seen: never two leaders at once, and each epoch held
    /// by one node only, the same one the `Leases` row names. Returns who held each epoch.
    async fn finish(self) -> BTreeMap<i64, String> {
        self.stop.cancel();
        let looks = self.task.await.unwrap();
        assert!(
            looks.len() >= 2,
            "the watch looked only {} times",
            looks.len()
        );
        eprintln!("leader watch: {} looks", looks.len());
        let mut holders: BTreeMap<i64, String> = BTreeMap::new();
        let mut hold = |epoch: i64, node: &str, source: &str| {
            let holder = holders.entry(epoch).or_insert_with(|| node.to_owned());
            assert_eq!(
                holder, node,
                "epoch {epoch} has two holders ({source} named {node})"
            );
        };
        for look in &looks {
            for older in &look.leaders {
                for newer in look.leaders.iter().filter(|r| r.epoch > older.epoch) {
                    assert!(
                        older.asked <= newer.answered,
                        "two replicas led at once ({} still under epoch {} after {} under {}): \
                         {look:?}",
                        older.node,
                        older.epoch,
                        newer.node,
                        newer.epoch
                    );
                }
                hold(older.epoch, &older.node, "/metrics");
            }
            if let Some((holder, epoch)) = &look.lease {
                hold(*epoch, holder, "the Leases row");
            }
        }
        holders
    }
}

/// From the data: every epoch that claimed rows had one known holder, and its claims all came
/// before the first claim of the next epoch (a claim needs its own epoch's lease unexpired; the
/// next epoch begins only once that lease has expired or was released). Returns the number of
/// attempts per epoch.
fn assert_epochs_take_turns(db: &Db, holders: &BTreeMap<i64, String>) -> BTreeMap<i64, i64> {
    let epochs: Vec<(i64, i64, i64, i64)> = db.rows(
        "SELECT LeaseEpoch, MIN(StartedAt), MAX(StartedAt), COUNT(*) FROM NotificationAttempts
         WHERE LeaseEpoch IS NOT NULL GROUP BY LeaseEpoch ORDER BY LeaseEpoch",
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    );
    for (epoch, ..) in &epochs {
        assert!(
            holders.contains_key(epoch),
            "attempts under epoch {epoch}, which no replica was seen holding ({holders:?})"
        );
    }
    for pair in epochs.windows(2) {
        let (earlier, _, last, _) = pair[0];
        let (later, first, _, _) = pair[1];
        assert!(
            last < first,
            "epoch {earlier} claimed at {last} ms, after epoch {later} began claiming at {first} ms"
        );
    }
    epochs
        .into_iter()
        .map(|(epoch, _, _, count)| (epoch, count))
        .collect()
}

/// Submits `n` fresh notifications spread over `replicas` (one stream to each, concurrently),
/// checks each was accepted, and returns their ids.
async fn submit_spread(replicas: &[&Replica], n: usize) -> Vec<String> {
    let mut batches: Vec<Vec<v1::NotificationSubmit>> = vec![Vec::new(); replicas.len()];
    for i in 0..n {
        batches[i % replicas.len()].push(submit(&format!("alarm {i}"), "leader test"));
    }
    let ids = batches
        .iter()
        .flatten()
        .map(|s| s.notification_id.clone())
        .collect();
    let mut streams = JoinSet::new();
    for (replica, batch) in replicas.iter().zip(batches) {
        let addr = replica.addr;
        streams.spawn(async move {
            let expected = batch.len();
            let mut ingest = NotificationIngestClient::new(channel(addr).await);
            let acks: Vec<v1::NotificationSubmitAck> = ingest
                .submit_notifications(tokio_stream::iter(batch))
                .await
                .unwrap()
                .into_inner()
                .collect::<Result<_, _>>()
                .await
                .unwrap();
            assert_eq!(acks.len(), expected, "one ack per submit");
            for ack in acks {
                assert_eq!(ack.outcome(), v1::SubmitOutcome::Accepted, "{ack:?}");
            }
        });
    }
    while let Some(done) = streams.join_next().await {
        done.unwrap();
    }
    ids
}

/// Delivery attempts a replica has finished (any outcome), from its `/metrics`. An attempt is
/// counted when it finishes, just before its outcome is recorded (or refused).
async fn finished_attempts(metrics: SocketAddr) -> f64 {
    let reply = metrics_endpoint::get(metrics, "/metrics").await.unwrap();
    ["Delivered", "TransientFailure", "PermanentFailure"]
        .iter()
        .map(|outcome| {
            let series = format!(
                "outbox_delivery_attempts_total{{channel=\"Email\",outcome=\"{outcome}\"}}"
            );
            metrics_endpoint::sample(&reply.body, &series)
                .unwrap_or_else(|| panic!("/metrics lacks {series}:\n{}", reply.body))
        })
        .sum()
}

/// How many times the sink received each notification, by NotificationId (the Message-ID is
/// `<NotificationId@domain>`).
fn received(sink: &SmtpSink) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for mail in sink.messages() {
        let message_id = mail.message_id().expect("every message has a Message-ID");
        let id = message_id
            .trim_start_matches('<')
            .split('@')
            .next()
            .unwrap()
            .to_owned();
        *counts.entry(id).or_insert(0) += 1;
    }
    counts
}

async fn wait_all_delivered(db: &Db, n: usize) {
    eventually(&format!("all {n} notifications are Delivered"), || {
        let delivered = db.count("SELECT COUNT(*) FROM Notifications WHERE Status = 'Delivered'");
        async move { (delivered == n as i64).then_some(()) }
    })
    .await;
}

/// Every attempt: (NotificationId, AttemptNo, Outcome, LeaseEpoch).
type AttemptRow = (String, i64, String, Option<i64>);

fn all_attempts(db: &Db) -> Vec<AttemptRow> {
    db.rows(
        "SELECT NotificationId, AttemptNo, Outcome, LeaseEpoch FROM NotificationAttempts
         ORDER BY NotificationId, AttemptNo",
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )
}

fn base_timings() -> Timings {
    Timings {
        lease_ttl: "3s",
        renew_interval: None,
        claim_timeout: "5s",
        connections: 8,
        faults: None,
        extra: "",
    }
}

/// Replicas started at the same moment on a database file that does not exist yet all come up:
/// none fails with "database is locked" while another switches the new file to WAL. Before the
/// switch waited for the lock this failed a CI run, and 2 of 15 rounds of three processes
/// started from a shell; here it is a race too, so 20 rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_on_a_new_file_all_serve() {
    // No CentralDatabase here: the replicas get the SQLite file, whichever backend the suite
    // runs central on, since the race is SQLite's.
    let sink = smtp_sink().await;
    for _round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let mut replicas = Vec::new();
        for node in ["central-a", "central-b", "central-c"] {
            replicas.push(Replica::spawn(dir.path(), node, &sink, base_timings()).await);
        }
        for replica in &replicas {
            wait_until_serving(replica.addr).await;
        }
    }
}

/// Three replicas start together on one database: exactly one takes the lease and it alone
/// claims and delivers, whichever replica the notifications were submitted to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_one_dispatcher() {
    const N: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    // Shared by every central process of the test (on MS SQL, a scratch database).
    let _central_db = CentralDatabase::create(&dir.path().join("central.db")).await;
    let sink = smtp_sink().await;
    let mut replicas = Vec::new();
    for node in ["central-a", "central-b", "central-c"] {
        replicas.push(Replica::spawn(dir.path(), node, &sink, base_timings()).await);
    }
    for replica in &replicas {
        wait_until_serving(replica.addr).await;
    }
    let db_path = dir.path().join("central.db");
    let (leader, epoch) = wait_for_leader(&replicas, 0).await;
    let all: Vec<&Replica> = replicas.iter().collect();
    let watch = LeaderWatch::start(&all, &db_path).await;

    let ids = submit_spread(&all, N).await;
    let db = Db::open(&db_path);
    wait_all_delivered(&db, N).await;
    let holders = watch.finish().await;

    assert_eq!(
        holders,
        BTreeMap::from([(epoch, replicas[leader].node.clone())]),
        "one lease, one holder, for the whole run"
    );
    let per_epoch = assert_epochs_take_turns(&db, &holders);
    assert_eq!(per_epoch, BTreeMap::from([(epoch, N as i64)]));
    let received = received(&sink);
    for id in &ids {
        assert_eq!(received.get(id), Some(&1), "{id} is received exactly once");
    }
    assert_eq!(received.len(), N);
}

/// The leader is SIGKILLed mid-flight: another replica takes the lease, every notification is
/// delivered, and each one received twice was in flight under the dead leader's epoch (its
/// InFlight attempt row shows the possible duplicate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_mid_flight_successor_delivers_everything() {
    const N: usize = 2000;
    const DELIVERED_BEFORE_KILL: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    // Shared by every central process of the test (on MS SQL, a scratch database).
    let _central_db = CentralDatabase::create(&dir.path().join("central.db")).await;
    let sink = smtp_sink().await;
    let mut replicas = Vec::new();
    for node in ["central-a", "central-b", "central-c"] {
        replicas.push(Replica::spawn(dir.path(), node, &sink, base_timings()).await);
    }
    for replica in &replicas {
        wait_until_serving(replica.addr).await;
    }
    let db_path = dir.path().join("central.db");
    let (leader, killed_epoch) = wait_for_leader(&replicas, 0).await;
    let all: Vec<&Replica> = replicas.iter().collect();
    let watch = LeaderWatch::start(&all, &db_path).await;

    let ids = submit_spread(&all, N).await;
    sink.wait_for_messages(DELIVERED_BEFORE_KILL, DEADLINE)
        .await;
    // The relay holds its replies until the leader is dead, so the kill certainly lands with
    // deliveries in flight (with pipelined SMTP a delivery is so quick that a kill could land
    // between claims, with nothing in flight).
    sink.pause_replies();
    assert!(
        sink.wait_for_held_replies(1, DEADLINE).await,
        "a delivery reached the relay"
    );
    let killed = replicas.swap_remove(leader);
    let killed_node = killed.node.clone();
    killed.kill9().await;
    let delivered_at_kill = sink.messages().len();
    sink.resume_replies();
    assert!(
        delivered_at_kill < N,
        "the leader was killed mid-flight, not after delivering everything"
    );

    let (successor, successor_epoch) = wait_for_leader(&replicas, killed_epoch).await;
    let db = Db::open(&db_path);
    wait_all_delivered(&db, N).await;
    let holders = watch.finish().await;
    assert_eq!(holders.get(&killed_epoch), Some(&killed_node));
    assert_eq!(
        holders.get(&successor_epoch),
        Some(&replicas[successor].node)
    );
    assert_epochs_take_turns(&db, &holders);

    let attempts = all_attempts(&db);
    let mut delivered: HashMap<&str, i64> = HashMap::new();
    // Rows with an InFlight attempt under the killed epoch: each a possible duplicate.
    let mut in_flight_under_killed: HashSet<&str> = HashSet::new();
    // The outcome of each row's last attempt under the killed epoch (attempts come in order).
    let mut last_under_killed: HashMap<&str, &str> = HashMap::new();
    for (id, _, outcome, epoch) in &attempts {
        if *epoch == Some(killed_epoch) {
            last_under_killed.insert(id, outcome);
        }
        match outcome.as_str() {
            "Delivered" => {
                let by = epoch.expect("a delivery attempt has a lease epoch");
                assert!(
                    delivered.insert(id, by).is_none(),
                    "{id} has two Delivered attempts"
                );
            }
            "InFlight" => {
                assert_eq!(
                    *epoch,
                    Some(killed_epoch),
                    "{id}: only the killed leader leaves attempts in flight"
                );
                in_flight_under_killed.insert(id);
            }
            _ => {}
        }
    }
    // In flight at the kill: the killed leader's last attempt of the row never finished. (An
    // earlier InFlight attempt of the same leader is one whose claim expired while a slow
    // database recorded it, claimed and delivered again by that leader: a possible duplicate
    // too, but not one the kill made.)
    let in_flight_at_kill: Vec<&str> = last_under_killed
        .iter()
        .filter(|(_, outcome)| **outcome == "InFlight")
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(
        delivered.len(),
        N,
        "every notification has one Delivered attempt"
    );
    assert!(
        !in_flight_at_kill.is_empty(),
        "the killed leader had deliveries in flight"
    );
    for id in &in_flight_at_kill {
        assert!(
            delivered[id] > killed_epoch,
            "{id}, in flight at the kill, was delivered by a successor"
        );
    }
    assert_eq!(
        db.count("SELECT COUNT(*) FROM Notifications WHERE ClaimEpoch IS NOT NULL"),
        0,
        "no row is left claimed"
    );

    let received = received(&sink);
    for id in &ids {
        assert!(received.contains_key(id), "{id} was never received");
    }
    assert_eq!(received.len(), N, "nothing but our notifications");
    let duplicates: Vec<&String> = received
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| id)
        .collect();
    for id in &duplicates {
        assert!(
            in_flight_under_killed.contains(id.as_str()),
            "{id} was received twice without an InFlight attempt under the killed epoch"
        );
    }
    eprintln!(
        "leader killed after {delivered_at_kill} deliveries; {} in flight at the kill, {} \
         received twice",
        in_flight_at_kill.len(),
        duplicates.len()
    );
}

/// (NotificationId, Status, RetryCount, LastError, DeliveredAt, ResolvedAt, ClaimEpoch) of every
/// row, and every attempt: what a deposed leader must not change.
type Outcomes = (
    Vec<(
        String,
        String,
        i64,
        Option<String>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
    )>,
    Vec<AttemptRow>,
);

fn outcomes(db: &Db) -> Outcomes {
    let rows = db.rows(
        "SELECT NotificationId, Status, RetryCount, LastError, DeliveredAt, ResolvedAt, ClaimEpoch
         FROM Notifications ORDER BY NotificationId",
        |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
            ))
        },
    );
    (rows, all_attempts(db))
}

/// A leader is frozen (SIGSTOP) while its deliveries are in flight, past its lease. A successor
/// takes over and delivers those rows once their claims expire. When the old leader resumes, it
/// cannot record anything over the successor's outcomes: the rows stay Delivered by the new
/// epoch and the old epoch's attempts stay InFlight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_leader_cannot_overwrite_its_successor() {
    const CONNECTIONS: usize = 4;
    const N: usize = 2 * CONNECTIONS;
    let timings = Timings {
        lease_ttl: "2s",
        renew_interval: None,
        claim_timeout: "4s",
        connections: CONNECTIONS as u32,
        faults: None,
        extra: "",
    };
    let dir = tempfile::tempdir().unwrap();
    // Shared by every central process of the test (on MS SQL, a scratch database).
    let _central_db = CentralDatabase::create(&dir.path().join("central.db")).await;
    let db_path = dir.path().join("central.db");
    let sink = smtp_sink().await;
    // The first replica takes the lease before the second exists.
    let old = Replica::start(dir.path(), "central-old", &sink, timings).await;
    let (_, old_epoch) = wait_for_leader(std::slice::from_ref(&old), 0).await;
    let new = Replica::start(dir.path(), "central-new", &sink, timings).await;
    let watch = LeaderWatch::start(&[&old, &new], &db_path).await;

    // The old leader starts as many deliveries as it has connections, each session waiting on
    // the sink's greeting, and by default claims some rows ahead into its local queue.
    sink.pause_replies();
    let ids = submit_spread(&[&old], N).await;
    assert!(
        sink.wait_for_held_replies(CONNECTIONS, DEADLINE).await,
        "the old leader has {CONNECTIONS} deliveries in flight"
    );
    let db = Db::open(&db_path);
    let stalled = db.strings(&format!(
        "SELECT NotificationId FROM NotificationAttempts WHERE LeaseEpoch = {old_epoch}"
    ));
    assert!(
        (CONNECTIONS..=N).contains(&stalled.len()),
        "the old leader claimed its {CONNECTIONS} in-flight rows and at most the rest ({} claimed)",
        stalled.len()
    );

    watch.pause(&old);
    old.signal("STOP");
    let (_, new_epoch) = wait_for_leader(std::slice::from_ref(&new), old_epoch).await;
    // The successor's sessions may go ahead; the old leader's replies land in the socket
    // buffers of a process that cannot read them.
    sink.resume_replies();
    wait_all_delivered(&db, N).await;

    let stalled: HashSet<String> = stalled.into_iter().collect();
    for id in &ids {
        let attempts: Vec<(String, Option<i64>)> = db.rows(
            &format!(
                "SELECT Outcome, LeaseEpoch FROM NotificationAttempts
                 WHERE NotificationId = '{id}' ORDER BY AttemptNo"
            ),
            |r| Ok((r.get(0)?, r.get(1)?)),
        );
        let expected = if stalled.contains(id) {
            vec![
                ("InFlight".to_owned(), Some(old_epoch)),
                ("Delivered".to_owned(), Some(new_epoch)),
            ]
        } else {
            vec![("Delivered".to_owned(), Some(new_epoch))]
        };
        assert_eq!(attempts, expected, "attempt history of {id}");
    }
    let before = outcomes(&db);

    // Resumed, the old leader finds its lease gone: it steps down, and whatever its in-flight
    // deliveries try to record is refused by the database. A clean exit drains them, so by then
    // every late outcome has been tried.
    old.signal("CONT");
    eventually("the resumed old leader reports standby", || async {
        (old.leadership().await == Leadership::Standby).then_some(())
    })
    .await;
    watch.resume(&old);
    // Either its own lease-expiry timer aborted those deliveries first, or they finished (timed
    // out, the sink having held them past the attempt timeout) and the database refused their
    // outcomes; which one wins after SIGCONT is a race, and both must leave the rows alone.
    let finished = finished_attempts(old.metrics).await;
    old.signal("TERM");
    assert!(old.exited().await.success(), "the old leader exits cleanly");
    eprintln!(
        "stalled leader: {finished} of its {CONNECTIONS} in-flight attempts finished after SIGCONT \
         and went on to record an outcome; the rest were aborted at its lease expiry"
    );

    assert_eq!(
        outcomes(&db),
        before,
        "the deposed leader changed no row and no attempt"
    );
    let holders = watch.finish().await;
    assert_eq!(
        holders.get(&old_epoch).map(String::as_str),
        Some("central-old")
    );
    assert_eq!(
        holders.get(&new_epoch).map(String::as_str),
        Some("central-new")
    );
    assert_epochs_take_turns(&db, &holders);
    let received = received(&sink);
    for id in &ids {
        assert!(received.contains_key(id), "{id} was never received");
    }
    drop(new);
}

/// SIGTERM on the leader: it drains, releases the lease and exits 0, and a standby takes over at
/// once. The lease TTL is far longer than the test's deadline, so the takeover can only happen
/// because the lease was released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_shutdown_hands_over_at_once() {
    const N: usize = 20;
    let timings = Timings {
        lease_ttl: "120s",
        renew_interval: Some("500ms"),
        claim_timeout: "5s",
        connections: 4,
        faults: None,
        extra: "",
    };
    let dir = tempfile::tempdir().unwrap();
    // Shared by every central process of the test (on MS SQL, a scratch database).
    let _central_db = CentralDatabase::create(&dir.path().join("central.db")).await;
    let db_path = dir.path().join("central.db");
    let sink = smtp_sink().await;
    let first = Replica::start(dir.path(), "central-first", &sink, timings).await;
    let (_, first_epoch) = wait_for_leader(std::slice::from_ref(&first), 0).await;
    let second = Replica::start(dir.path(), "central-second", &sink, timings).await;
    let watch = LeaderWatch::start(&[&first, &second], &db_path).await;
    let db = Db::open(&db_path);
    let mut ids = submit_spread(&[&first, &second], N).await;
    wait_all_delivered(&db, N).await;

    first.signal("TERM");
    assert!(first.exited().await.success(), "the leader exits cleanly");
    let (_, second_epoch) = wait_for_leader(std::slice::from_ref(&second), first_epoch).await;
    let lease: Vec<(String, i64)> = db.rows(
        "SELECT Holder, Epoch FROM Leases WHERE Name = 'dispatcher'",
        |r| Ok((r.get(0)?, r.get(1)?)),
    );
    assert_eq!(lease, vec![("central-second".to_owned(), second_epoch)]);

    // The successor really dispatches.
    ids.extend(submit_spread(&[&second], N).await);
    wait_all_delivered(&db, 2 * N).await;
    let holders = watch.finish().await;
    let per_epoch = assert_epochs_take_turns(&db, &holders);
    assert_eq!(
        per_epoch,
        BTreeMap::from([(first_epoch, N as i64), (second_epoch, N as i64)])
    );
    let received = received(&sink);
    for id in &ids {
        assert_eq!(received.get(id), Some(&1), "{id} is received exactly once");
    }
}

/// Ends the dispatcher lease now by the database's clock, behind its holder's back.
fn expire_lease_in_database(db: &Path) {
    Db::open(db).expire_lease();
}

/// The database fence on its own. A leader whose lease has run out by the database's clock while
/// its own timer says it still holds it (a VM pause does this: the monotonic clock the leader
/// judges its lease by stops, the wall clock the database's expiry is judged by does not)
/// finishes its deliveries after a successor took over. The database refuses every outcome it
/// tries to record: its rows stay claimed and undelivered, its attempts stay InFlight, and the
/// successor delivers the rows again once their claims expire (the duplicates the InFlight rows
/// announce).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deposed_leader_outcomes_are_refused_by_the_database() {
    const CONNECTIONS: usize = 4;
    // The old leader renews only every 5 minutes, so while this test runs (however slow the
    // database) it never renews, and never notices the lease is gone: only the database can
    // refuse it. The test expires the lease in the database itself, so the TTL decides nothing.
    let old_timings = Timings {
        lease_ttl: "900s",
        renew_interval: Some("300s"),
        // Its attempts are cut off at half of this: they must outlast the hold below, which
        // lasts until the successor has taken the lease (seconds on a loaded Babelfish). The
        // successor redelivers once these claims expire, so this is also what the test waits.
        claim_timeout: "30s",
        connections: CONNECTIONS as u32,
        faults: None,
        extra: "",
    };
    // The successor tries for the lease often, so it takes it as soon as it has expired.
    let new_timings = Timings {
        renew_interval: Some("250ms"),
        ..old_timings
    };
    let dir = tempfile::tempdir().unwrap();
    // Shared by every central process of the test (on MS SQL, a scratch database).
    let _central_db = CentralDatabase::create(&dir.path().join("central.db")).await;
    let db_path = dir.path().join("central.db");
    let sink = smtp_sink().await;
    let old = Replica::start(dir.path(), "central-old", &sink, old_timings).await;
    let (_, old_epoch) = wait_for_leader(std::slice::from_ref(&old), 0).await;
    let new = Replica::start(dir.path(), "central-new", &sink, new_timings).await;
    let watch = LeaderWatch::start(&[&old, &new], &db_path).await;

    sink.pause_replies();
    let ids = submit_spread(&[&old], CONNECTIONS).await;
    assert!(
        sink.wait_for_held_replies(CONNECTIONS, DEADLINE).await,
        "the old leader has {CONNECTIONS} deliveries in flight"
    );
    // From here on the old leader's gauge says what it believes, not what the database says.
    watch.pause(&old);
    expire_lease_in_database(&db_path);
    let (_, new_epoch) = wait_for_leader(std::slice::from_ref(&new), old_epoch).await;

    // The old leader's deliveries now go through, under a lease it no longer holds.
    sink.resume_replies();
    sink.wait_for_messages(CONNECTIONS, DEADLINE).await;
    eventually("the old leader's attempts have finished", || async {
        (finished_attempts(old.metrics).await >= CONNECTIONS as f64).then_some(())
    })
    .await;
    assert_eq!(
        old.answered_leadership().await,
        Leadership::Leader(old_epoch),
        "the old leader still believes it leads: only the database can refuse it"
    );
    // A clean exit waits for its attempts to finish recording (or being refused).
    old.signal("TERM");
    assert!(old.exited().await.success(), "the old leader exits cleanly");

    let db = Db::open(&db_path);
    for id in &ids {
        let row: Vec<(String, Option<i64>)> = db.rows(
            &format!("SELECT Status, ClaimEpoch FROM Notifications WHERE NotificationId = '{id}'"),
            |r| Ok((r.get(0)?, r.get(1)?)),
        );
        assert_eq!(
            row,
            vec![("Pending".to_owned(), Some(old_epoch))],
            "{id}: sent by the deposed leader, but its outcome was not recorded"
        );
    }
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM NotificationAttempts
             WHERE LeaseEpoch = {old_epoch} AND Outcome = 'InFlight'"
        )),
        CONNECTIONS as i64
    );

    wait_all_delivered(&db, CONNECTIONS).await;
    for id in &ids {
        let attempts: Vec<(String, Option<i64>)> = db.rows(
            &format!(
                "SELECT Outcome, LeaseEpoch FROM NotificationAttempts
                 WHERE NotificationId = '{id}' ORDER BY AttemptNo"
            ),
            |r| Ok((r.get(0)?, r.get(1)?)),
        );
        assert_eq!(
            attempts,
            vec![
                ("InFlight".to_owned(), Some(old_epoch)),
                ("Delivered".to_owned(), Some(new_epoch)),
            ],
            "attempt history of {id}"
        );
    }
    let received = received(&sink);
    for id in &ids {
        assert_eq!(
            received.get(id),
            Some(&2),
            "{id}: once by the deposed leader, once by its successor"
        );
    }
    let holders = watch.finish().await;
    assert_eq!(
        holders.get(&old_epoch).map(String::as_str),
        Some("central-old")
    );
    assert_eq!(
        holders.get(&new_epoch).map(String::as_str),
        Some("central-new")
    );
    assert_epochs_take_turns(&db, &holders);
    drop(new);
}

/// Supervision (docs/guarantees.md, "Supervised tasks"): the email channel's loop fails at its
/// first two starts (injected, `test_faults`); the supervisor restarts it, counts each restart on
/// `/metrics`, and the node keeps the lease and delivers everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_channel_loop_is_restarted_and_delivers() {
    const N: usize = 5;
    // A lease that outlasts any slow renewal on a loaded Babelfish: the test is about the
    // channel loop, and the node must hold its lease throughout.
    let timings = Timings {
        lease_ttl: "30s",
        renew_interval: Some("1s"),
        claim_timeout: "10s",
        connections: 4,
        faults: Some("channel.email=2"),
        extra: "",
    };
    let dir = tempfile::tempdir().unwrap();
    let _central_db = CentralDatabase::create(&dir.path().join("central.db")).await;
    let db_path = dir.path().join("central.db");
    let sink = smtp_sink().await;
    let replica = Replica::start(dir.path(), "central-a", &sink, timings).await;
    let ids = submit_spread(&[&replica], N).await;
    wait_all_delivered(&Db::open(&db_path), N).await;
    let received = received(&sink);
    for id in &ids {
        assert_eq!(received.get(id), Some(&1), "{id} is received exactly once");
    }
    let page = metrics_endpoint::get(replica.metrics, "/metrics")
        .await
        .unwrap()
        .body;
    assert_eq!(
        metrics_endpoint::sample(&page, "outbox_task_restarts_total{task=\"channel.email\"}"),
        Some(2.0),
        "{page}"
    );
    assert_eq!(
        metrics_endpoint::sample(&page, "outbox_task_failed{task=\"channel.email\"}"),
        Some(0.0),
        "not given up on"
    );
    // The node kept its lease throughout: it still holds it, and every attempt was made under
    // one epoch. (From the data: a scrape of /metrics computes the KPIs, which on a loaded
    // Babelfish can outlast the watch's scrape timeout.)
    let db = Db::open(&db_path);
    let holders = db.strings("SELECT Holder FROM Leases WHERE Name = 'dispatcher'");
    assert_eq!(holders, ["central-a"]);
    let epochs: BTreeSet<Option<i64>> = all_attempts(&db).into_iter().map(|a| a.3).collect();
    assert_eq!(epochs.len(), 1, "one epoch: {epochs:?}");
}

/// A node whose email channel loop fails at every start (injected) gives up after the restart
/// budget: it releases the dispatcher lease and exits non-zero, so a replica started after it
/// takes the lease at once (the lease lasts 120 s, so only a release lets it in within the
/// deadline) and delivers. Before supervision the node kept renewing its lease while its
/// channel delivered nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_loop_that_keeps_failing_takes_its_node_out_and_another_replica_delivers() {
    const N: usize = 10;
    let healthy = Timings {
        lease_ttl: "120s",
        renew_interval: Some("500ms"),
        claim_timeout: "5s",
        connections: 4,
        faults: None,
        extra: "",
    };
    let failing = Timings {
        faults: Some("channel.email=always"),
        ..healthy
    };
    let dir = tempfile::tempdir().unwrap();
    let _central_db = CentralDatabase::create(&dir.path().join("central.db")).await;
    let db_path = dir.path().join("central.db");
    let sink = smtp_sink().await;
    let first = Replica::spawn(dir.path(), "central-first", &sink, failing).await;
    let status = first.exited().await;
    assert!(
        !status.success(),
        "a node out of service exits non-zero: {status}"
    );
    let db = Db::open(&db_path);
    let holders: Vec<String> = db.strings("SELECT Holder FROM Leases WHERE Name = 'dispatcher'");
    assert_eq!(
        holders,
        ["central-first"],
        "the failing node had taken the lease"
    );

    let second = Replica::start(dir.path(), "central-second", &sink, healthy).await;
    let (_, epoch) = wait_for_leader(std::slice::from_ref(&second), 0).await;
    let ids = submit_spread(&[&second], N).await;
    wait_all_delivered(&db, N).await;
    let received = received(&sink);
    for id in &ids {
        assert_eq!(received.get(id), Some(&1), "{id} is received exactly once");
    }
    let attempts = all_attempts(&db);
    assert_eq!(attempts.len(), N, "one attempt each: {attempts:?}");
    for (id, _, outcome, attempt_epoch) in attempts {
        assert_eq!(
            (outcome.as_str(), attempt_epoch),
            ("Delivered", Some(epoch)),
            "{id}: delivered by the successor"
        );
    }
}

/// The list's escalation (its alarm waits 6 s, then the supervisors are paged and wait 6 s),
/// and the supervisors' list, for [`the_successor_fires_the_next_page_once_on_time`].
const ESCALATING: &str = r#"
[lists.escalation]
acknowledge_within = "6s"
steps = [{ notify = ["supervisors"], wait = "6s" }]

[[lists]]
name = "supervisors"
type = "email"
recipients = ["sam@plant.example.test"]
"#;

/// The dispatcher leader is SIGKILLed while an incident waits for its next page: the successor
/// fires that page once, under its own epoch, within two seconds of its due time, and then the
/// exhaustion; the supervisors get one mail. The schedule was in the database, not in the dead
/// process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_successor_fires_the_next_page_once_on_time() {
    let dir = tempfile::tempdir().unwrap();
    let _central_db = CentralDatabase::create(&dir.path().join("central.db")).await;
    let sink = smtp_sink().await;
    let timings = Timings {
        extra: ESCALATING,
        ..base_timings()
    };
    let mut replicas = Vec::new();
    for node in ["central-a", "central-b"] {
        replicas.push(Replica::start(dir.path(), node, &sink, timings).await);
    }
    let (leader, killed_epoch) = wait_for_leader(&replicas, 0).await;
    let mut msg = submit("Boiler 3 pressure HIGH-HIGH", "Trip imminent");
    msg.priority = v1::NotificationPriority::Critical.into();
    NotificationIngestClient::new(channel(replicas[leader].addr).await)
        .submit_notification(msg)
        .await
        .unwrap();
    // The alarm itself goes out; then the leader dies before the supervisors are due.
    sink.wait_for_messages(1, DEADLINE).await;
    let killed = replicas.swap_remove(leader);
    killed.kill9().await;
    let (successor, successor_epoch) = wait_for_leader(&replicas, killed_epoch).await;

    let db = Db::open(&dir.path().join("central.db"));
    let pages = eventually("the incident is exhausted", || {
        let exhausted = db.strings("SELECT Status FROM Incidents") == ["Exhausted"];
        let pages: Vec<(i64, i64, i64, i64)> = db.rows(
            "SELECT PageNo, DueAt, FiredAt, LeaseEpoch FROM IncidentPages ORDER BY PageNo",
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        );
        async move { exhausted.then_some(pages) }
    })
    .await;
    assert_eq!(pages.len(), 2, "the alarm and one page: {pages:?}");
    let (_, due, fired, epoch) = pages[1];
    assert_eq!(epoch, successor_epoch, "the successor fired it");
    assert!(
        fired - due < 2000,
        "fired {} ms after its due time",
        fired - due
    );
    let to_supervisor = sink
        .messages()
        .iter()
        .filter(|m| m.rcpt_to.iter().any(|r| r == "sam@plant.example.test"))
        .count();
    assert_eq!(to_supervisor, 1);
    assert!(successor < replicas.len());
}
