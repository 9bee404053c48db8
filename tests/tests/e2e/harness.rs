//! Starting the pieces and looking at what they did: central and the site-forwarder in-process or
//! as processes, a gRPC client for each, and read-only SQL on their database files.
//!
//! Waiting is always for a condition with a deadline ([`eventually`]), never a fixed delay.

use std::collections::HashSet;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use central_outbox::auth::AuthMode;
use central_outbox::config::{Config as CentralConfig, ListConfig, SmtpConfig, SmtpTls};
use chrono::Utc;
use outbox_proto::time::to_timestamp;
use outbox_proto::v1;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use outbox_proto::v1::notification_outbox_client::NotificationOutboxClient;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use outbox_tests::binaries::BuiltBy;
use outbox_tests::smtp_sink::SmtpSink;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, ClientTlsConfig};

pub(crate) use crate::backend::{CentralDatabase, Db, database_url};

/// Generous upper bound for anything a test waits for; a healthy run takes a fraction of it.
pub(crate) const DEADLINE: Duration = Duration::from_secs(60);

/// The list every test notification goes to, and its members.
pub(crate) const LIST: &str = "ops";
pub(crate) const RECIPIENTS: [&str; 2] = ["alice@plant.example.test", "bob@plant.example.test"];

/// Polls `check` until it returns `Some`, or panics with `what` after [`DEADLINE`].
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        tick.tick().await;
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "timed out waiting for: {what}"
        );
    }
}

/// A port that was free a moment ago, for a server that is bound later (by the code under
/// test, or again after a restart). Taken from below the kernel's ephemeral range (32768 and up
/// by default): a port in that range can be taken meanwhile by any outgoing connection or
/// port-0 bind of a test running at once, and the server then fails to start; a port below it
/// is taken only by an explicit bind. Never the same port twice in this test process; the
/// starting point depends on the process id, so two test processes rarely probe the same ports.
pub(crate) async fn free_addr() -> SocketAddr {
    const FIRST: u16 = 20_000;
    const LAST: u16 = 32_000;
    static NEXT: std::sync::Mutex<Option<u16>> = std::sync::Mutex::new(None);
    loop {
        let port = {
            let mut next = NEXT.lock().unwrap();
            let span = u32::from(LAST - FIRST);
            let port = next.unwrap_or(FIRST + (std::process::id() % span) as u16);
            *next = Some(if port + 1 >= LAST { FIRST } else { port + 1 });
            port
        };
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)).await {
            return listener.local_addr().unwrap();
        }
    }
}

/// Waits until the server at `addr` reports SERVING on `grpc.health.v1.Health`. A bound port
/// accepts TCP connections before the service is ready (its store may still be migrating), so
/// only the health answer means "ready".
pub(crate) async fn wait_until_serving(addr: SocketAddr) {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    eventually(&format!("{addr} reports SERVING"), || async move {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .ok()?
            .connect()
            .await
            .ok()?;
        let status = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .ok()?
            .into_inner()
            .status();
        (status == ServingStatus::Serving).then_some(())
    })
    .await;
}

/// Waits until the TLS server at `addr` reports SERVING to a client using `tls`.
pub(crate) async fn wait_until_serving_tls(addr: SocketAddr, tls: ClientTlsConfig) {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    eventually(&format!("{addr} reports SERVING over TLS"), || {
        let tls = tls.clone();
        async move {
            let channel = tls_channel(addr, tls).await.ok()?;
            let status = HealthClient::new(channel)
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .ok()?
                .into_inner()
                .status();
            (status == ServingStatus::Serving).then_some(())
        }
    })
    .await;
}

/// A connection to `addr` over TLS; the error as text when it cannot be made.
pub(crate) async fn tls_channel(addr: SocketAddr, tls: ClientTlsConfig) -> Result<Channel, String> {
    Channel::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}

pub(crate) async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Central configuration for tests: SQLite under `dir`, email to `smtp`, list [`LIST`], quick
/// retries and polls so tests do not wait on production intervals.
pub(crate) fn central_config(dir: &Path, smtp: Option<SocketAddr>) -> CentralConfig {
    let mut config = CentralConfig {
        database: format!("sqlite://{}", dir.join("central.db").display()),
        ..CentralConfig::default()
    };
    config.dispatcher.poll_interval = Duration::from_millis(200);
    config.dispatcher.lease_ttl = Duration::from_secs(3);
    // Rows are claimed a few ahead of the free slots and dropped if one waits half of this
    // before it starts. On Babelfish the first run of each statement on each new pooled
    // connection takes up to ~2 s (measured: claim 1.6-1.9 s, later runs ~10 ms), so a short
    // claim timeout would drop rows there while the pool warms up.
    config.dispatcher.claim_timeout = Duration::from_secs(30);
    config.shutdown_timeout = Duration::from_secs(5);
    // Storing a secret needs a [secrets] key: base64 of "outbox-test-secrets-key-32-bytes".
    config.secrets.key = Some("b3V0Ym94LXRlc3Qtc2VjcmV0cy1rZXktMzItYnl0ZXM=".into());
    // Most tests act through the admin API as named operators (x-outbox-actor); the `auth`
    // module's tests turn authentication on.
    config.auth.mode = AuthMode::None;
    config.smtp = smtp.map(|addr| SmtpConfig {
        tls: SmtpTls::None,
        max_retries: 5,
        retry_delay: Duration::from_millis(300),
        timeout: Duration::from_secs(5),
        overall_timeout: Duration::from_secs(5),
        ..SmtpConfig::new(
            addr.ip().to_string(),
            addr.port(),
            "outbox@plant.example.test",
        )
    });
    config.lists = vec![ListConfig::email(
        LIST,
        RECIPIENTS.iter().map(|r| r.to_string()).collect(),
    )];
    config
}

/// Turns central's web console on, on a loopback port that was free a moment ago (central binds
/// it at start, before it reports SERVING, so the console answers once [`Central::start`]
/// returns); [`Central::console_url`] then names it.
pub(crate) async fn with_console(config: &mut CentralConfig) {
    config.console.listen = Some(free_addr().await);
}

/// Central running in this process.
pub(crate) struct Central {
    pub addr: SocketAddr,
    /// The web console's address, when [`with_console`] turned it on.
    pub console: Option<SocketAddr>,
    /// Names central's database (see [`CentralDatabase`]); [`Db::open`] it to look inside.
    pub db: PathBuf,
    _database: CentralDatabase,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Central {
    pub(crate) async fn start(config: CentralConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on(config, listener).await
    }

    /// Starts central serving TLS (`config.tls`) and waits until it reports SERVING to a client
    /// using `client` (a TLS port does not answer the plaintext health check).
    pub(crate) async fn start_tls(config: CentralConfig, client: ClientTlsConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::launch(config, listener, Some(client)).await
    }

    /// Starts central on `config`, whose SQLite `database` names the test's central database:
    /// on the MS SQL backend, a scratch database stands in for it (see [`CentralDatabase`]).
    pub(crate) async fn start_on(config: CentralConfig, listener: TcpListener) -> Self {
        Self::launch(config, listener, None).await
    }

    async fn launch(
        mut config: CentralConfig,
        listener: TcpListener,
        tls: Option<ClientTlsConfig>,
    ) -> Self {
        let db = match config.clone().validate().unwrap().database {
            central_outbox::config::DatabaseUrl::Sqlite(db) => db,
            other => panic!("tests name central's database by a SQLite path, not {other:?}"),
        };
        let database = CentralDatabase::create(&db).await;
        config.database = database.url();
        let settings = config.validate().unwrap();
        let console = settings.console.map(|c| c.listen);
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            central_outbox::run(settings, listener, token)
                .await
                .unwrap();
        });
        let central = Self {
            addr,
            console,
            db,
            _database: database,
            stop,
            task,
        };
        match tls {
            Some(tls) => wait_until_serving_tls(central.addr, tls).await,
            None => wait_until_serving(central.addr).await,
        }
        central
    }

    /// The web console's base URL (`http://127.0.0.1:<port>`, no trailing slash); central must
    /// have been started with [`with_console`].
    pub(crate) fn console_url(&self) -> String {
        let addr = self
            .console
            .expect("central was started without the console (harness::with_console)");
        format!("http://{addr}")
    }

    pub(crate) async fn ingest(&self) -> NotificationIngestClient<Channel> {
        NotificationIngestClient::new(channel(self.addr).await)
    }

    pub(crate) async fn outbox(&self) -> NotificationOutboxClient<Channel> {
        NotificationOutboxClient::new(channel(self.addr).await)
    }

    /// Stops central the way SIGTERM would and waits until it has.
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

/// The site-forwarder running in this process.
pub(crate) struct Site {
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Site {
    pub(crate) async fn start(dir: &Path, central: SocketAddr) -> Self {
        let mut config = site_forwarder::config::Config::new("site-a");
        config.buffer_path = dir.join("site-a.db");
        config.central_url = format!("http://{central}");
        config.forward_retry_interval = Duration::from_millis(100);
        config.connect_timeout = Duration::from_secs(2);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            site_forwarder::run(config, listener, token).await.unwrap();
        });
        wait_until_serving(addr).await;
        Self { addr, stop, task }
    }

    pub(crate) async fn client(&self) -> SiteNotifyClient<Channel> {
        SiteNotifyClient::new(channel(self.addr).await)
    }

    /// Notifications still in the site's buffer.
    pub(crate) async fn depth(&self) -> u64 {
        let mut client = self.client().await;
        client
            .get_buffer_stats(v1::GetBufferStatsRequest {})
            .await
            .unwrap()
            .into_inner()
            .depth
    }

    pub(crate) async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

pub(crate) fn send_request(subject: &str, body: &str) -> v1::SendRequest {
    v1::SendRequest {
        r#type: v1::NotificationType::Email.into(),
        list_name: LIST.into(),
        subject: subject.into(),
        body: body.into(),
        type_data: String::new(),
        source_instance_id: "tank-farm-1".into(),
        source_script: "level_alarm.py".into(),
        origin_execution_id: None,
        origin_parent_execution_id: None,
        priority: v1::NotificationPriority::Unspecified.into(),
        condition_key: String::new(),
        deliver_after: None,
    }
}

/// A valid submit with a fresh id, as a site would send it.
pub(crate) fn submit(subject: &str, body: &str) -> v1::NotificationSubmit {
    v1::NotificationSubmit {
        notification_id: uuid::Uuid::now_v7().to_string(),
        r#type: v1::NotificationType::Email.into(),
        list_name: LIST.into(),
        subject: subject.into(),
        body: body.into(),
        type_data: String::new(),
        source_site_id: "site-a".into(),
        source_instance_id: "tank-farm-1".into(),
        source_script: "level_alarm.py".into(),
        site_enqueued_at: Some(to_timestamp(Utc::now())),
        origin_execution_id: None,
        origin_parent_execution_id: None,
        priority: v1::NotificationPriority::Unspecified.into(),
        condition_key: String::new(),
        cleared_at_site: None,
        deliver_after: None,
    }
}

/// Submits one notification with `subject` straight to central's ingest; returns its id.
pub(crate) async fn ingest_one(central: &Central, subject: &str) -> String {
    ingest_submit(central, submit(subject, "body")).await
}

/// Submits `msg` straight to central's ingest; returns its id.
pub(crate) async fn ingest_submit(central: &Central, msg: v1::NotificationSubmit) -> String {
    let id = msg.notification_id.clone();
    central
        .ingest()
        .await
        .submit_notification(msg)
        .await
        .unwrap();
    id
}

/// Waits until every notification id in `ids` is stored in central's table.
pub(crate) async fn wait_until_stored(db: &Db, ids: &HashSet<String>) {
    eventually("every acked Send is stored at central", || {
        let stored: HashSet<String> = db
            .strings("SELECT NotificationId FROM Notifications")
            .into_iter()
            .collect();
        let done = ids.is_subset(&stored);
        async move { done.then_some(()) }
    })
    .await;
}

/// Waits until the notification reaches `status` in central's table.
pub(crate) async fn wait_for_status(
    db: &Path,
    id: &str,
    status: &str,
) -> (String, i64, Option<String>) {
    let db = Db::open(db);
    let want = status.to_owned();
    eventually(&format!("{id} reaches {status}"), || {
        let row = db.row(id);
        let want = want.clone();
        async move { row.filter(|(s, _, _)| *s == want) }
    })
    .await
}

/// Waits until `n` delivery attempts are under way (their InFlight rows committed).
pub(crate) async fn wait_for_attempts_under_way(db: &Path, n: i64) {
    let db = Db::open(db);
    eventually(&format!("{n} attempts under way"), || {
        let under_way =
            db.count("SELECT COUNT(*) FROM NotificationAttempts WHERE Outcome = 'InFlight'");
        async move { (under_way == n).then_some(()) }
    })
    .await;
}

/// Starts an SMTP sink that accepts everything.
pub(crate) async fn smtp_sink() -> SmtpSink {
    SmtpSink::start().await.unwrap()
}

/// The workspace's binary `name`, built from the current sources.
///
/// `cargo test` does not build other packages' binaries for this suite, so the first call in
/// this test process builds them all, once ([`outbox_tests::binaries`]), with the cargo, target
/// directory and profile of this test; every later call waits for that build and reuses it.
pub(crate) fn binary(name: &str) -> PathBuf {
    static FRESH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = FRESH.get_or_init(|| {
        // This test executable is `<target dir>[/<triple>]/<profile>/deps/e2e-<hash>`, and the
        // binaries go to `<profile>/`. CARGO_TARGET_TMPDIR (`<target dir>/tmp`, given to
        // integration tests) tells the target directory even under `--target <triple>`.
        let exe = std::env::current_exe().map_err(|e| format!("the test's own path: {e}"))?;
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .ok_or_else(|| format!("{} is not in a cargo target directory", exe.display()))?;
        let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .ok_or("CARGO_TARGET_TMPDIR has no parent")?;
        outbox_tests::binaries::build(target_dir, profile_dir, BuiltBy::CargoTest)
            .map_err(|e| format!("{e:#}"))
    });
    let dir = match dir {
        Ok(dir) => dir,
        Err(e) => panic!("the end-to-end tests start the workspace's binaries: {e}"),
    };
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not a binary of the workspace",
        path.display()
    );
    path
}

/// A site-forwarder process for `site_id` (buffer `<site_id>.db` in `dir`) forwarding to
/// `central` over plaintext, once it reports SERVING; with its `SiteNotify` address.
pub(crate) async fn spawn_site(
    dir: &Path,
    site_id: &str,
    central: SocketAddr,
) -> (Process, SocketAddr) {
    let addr = free_addr().await;
    let buffer = dir.join(format!("{site_id}.db"));
    let args = [
        "serve",
        "--site-id",
        site_id,
        "--listen",
        &addr.to_string(),
        "--buffer",
        buffer.to_str().unwrap(),
        "--central",
        &format!("http://{central}"),
    ]
    .map(String::from);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let process = Process::spawn(&binary("site-forwarder"), &args);
    wait_until_serving(addr).await;
    (process, addr)
}

/// A service running as a real child process, killed when dropped.
pub(crate) struct Process(pub tokio::process::Child);

impl Process {
    pub(crate) fn spawn(binary: &Path, args: &[&str]) -> Self {
        let child = tokio::process::Command::new(binary)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self(child)
    }

    /// SIGKILL: no chance to flush, close or say goodbye.
    pub(crate) async fn kill9(mut self) {
        self.0.kill().await.unwrap();
    }
}
