//! TLS on every hop, with real certificates made at test time ([`outbox_tests::pki`]): central
//! serving TLS and requiring client certificates, sites forwarding over `https://`, a site
//! refused at the handshake (no certificate, or one from another CA), a site certificate
//! naming the only site its holder may submit as (a site with another site's certificate keeps
//! its rows until its certificate is fixed), and the rule that plaintext off loopback must be
//! asked for. Central says when it cannot tell sites apart (TLS without client
//! certificates): in its log at start, on `/metrics` and on the console's dashboard.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use central_outbox::tls::TlsConfig as CentralTls;
use outbox_proto::v1;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use outbox_tests::pki::{CertFiles, Pki};
use site_forwarder::tls::TlsConfig as SiteTls;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Channel;

use crate::harness::{
    Central, CentralDatabase, DEADLINE, Db, binary, central_config, channel, database_url,
    eventually, free_addr, send_request, smtp_sink, submit, tls_channel,
    wait_for_attempts_under_way, wait_for_status, wait_until_serving, with_console,
};

/// A CA with central's server certificate, in `dir`.
struct CentralPki {
    pki: Pki,
    server: CertFiles,
}

impl CentralPki {
    fn new(dir: &Path) -> Self {
        let pki = Pki::new(dir, "plant").unwrap();
        let server = pki.server_cert().unwrap();
        Self { pki, server }
    }

    /// Central's `[tls]`: TLS with this CA's server certificate, and client certificates from
    /// the same CA required when `mutual`.
    fn central_tls(&self, mutual: bool) -> CentralTls {
        CentralTls {
            cert: Some(self.server.cert.clone()),
            key: Some(self.server.key.clone()),
            client_ca: mutual.then(|| self.pki.ca_cert().to_path_buf()),
            allow_plaintext: false,
        }
    }

    /// A site's `[tls]`: trusts this CA, presents `identity` if given.
    fn site_tls(&self, identity: Option<&CertFiles>) -> SiteTls {
        SiteTls {
            ca: Some(self.pki.ca_cert().to_path_buf()),
            cert: identity.map(|files| files.cert.clone()),
            key: identity.map(|files| files.key.clone()),
            ..SiteTls::default()
        }
    }
}

/// A site-forwarder running in this process, forwarding to `central_url`.
struct TlsSite {
    addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl TlsSite {
    async fn start(dir: &Path, site_id: &str, central_url: String, tls: SiteTls) -> Self {
        Self::start_with(dir, site_id, central_url, tls, None).await
    }

    /// [`Self::start`], serving `/metrics` on `metrics` if given.
    async fn start_with(
        dir: &Path,
        site_id: &str,
        central_url: String,
        tls: SiteTls,
        metrics: Option<SocketAddr>,
    ) -> Self {
        let mut config = site_forwarder::config::Config::new(site_id);
        config.metrics_listen = metrics;
        config.buffer_path = dir.join(format!("{site_id}.db"));
        config.central_url = central_url;
        config.tls = tls;
        config.forward_retry_interval = std::time::Duration::from_millis(100);
        config.connect_timeout = std::time::Duration::from_secs(2);
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

    async fn client(&self) -> SiteNotifyClient<Channel> {
        SiteNotifyClient::new(channel(self.addr).await)
    }

    async fn stats(&self) -> v1::BufferStats {
        self.client()
            .await
            .get_buffer_stats(v1::GetBufferStatsRequest {})
            .await
            .unwrap()
            .into_inner()
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

/// A TCP relay in front of central that counts the connections made through it. The forwarder
/// reconnects only after a session ended, so a second connection proves the first one failed:
/// a condition to wait for instead of a fixed time.
struct CountingRelay {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl CountingRelay {
    async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Self {
            addr,
            connections,
            task,
        }
    }

    async fn wait_for_connections(&self, count: usize) {
        eventually(&format!("{count} connections through the relay"), || {
            let seen = self.connections.load(Ordering::SeqCst);
            async move { (seen >= count).then_some(()) }
        })
        .await;
    }
}

impl Drop for CountingRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_with_a_certificate_from_the_central_ca_forwards_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = CentralPki::new(dir.path());
    let site_cert = pki.pki.client_cert("site-a").unwrap();
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.tls = pki.central_tls(true);
    // As deployed: the admin API needs credentials; a site holds none but its certificate.
    config.auth.mode = central_outbox::auth::AuthMode::Required;
    let central = Central::start_tls(config, pki.pki.client_tls(Some(&site_cert)).unwrap()).await;

    let site = TlsSite::start(
        dir.path(),
        "site-a",
        format!("https://{}", central.addr),
        pki.site_tls(Some(&site_cert)),
    )
    .await;
    let id = site
        .client()
        .await
        .send(send_request("Tank 4 high level", "Level 97%"))
        .await
        .unwrap()
        .into_inner()
        .notification_id;

    wait_for_status(&central.db, &id, "Delivered").await;
    let mails = sink.wait_for_messages(1, DEADLINE).await;
    assert_eq!(mails[0].subject().as_deref(), Some("Tank 4 high level"));
    let db = Db::open(&central.db);
    assert_eq!(
        db.strings("SELECT SourceSiteId FROM Notifications"),
        ["site-a"]
    );
    eventually("the site buffer drains", || async {
        (site.stats().await.depth == 0).then_some(())
    })
    .await;
    assert!(site.stats().await.central_reachable);
    // A site script's Status(id) goes through the forwarder to central's admin API, where the
    // site's certificate lets it read its own notifications.
    let status = site
        .client()
        .await
        .get_status(v1::GetNotificationStatusRequest {
            notification_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.status(), v1::NotificationStatus::Delivered);
    site.stop().await;
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_without_a_certificate_or_with_one_from_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = CentralPki::new(dir.path());
    let good = pki.pki.client_cert("site-a").unwrap();
    let rogue_ca = Pki::new(dir.path(), "rogue").unwrap();
    let rogue = rogue_ca.client_cert("site-a").unwrap();
    let mut config = central_config(dir.path(), None);
    config.tls = pki.central_tls(true);
    let central = Central::start_tls(config, pki.pki.client_tls(Some(&good)).unwrap()).await;

    // A plain gRPC client: the handshake refuses it, so no submit reaches the service.
    for (label, identity) in [("no certificate", None), ("another CA", Some(&rogue))] {
        let mut tls = pki.pki.client_tls(None).unwrap();
        if let Some(files) = identity {
            tls = tls.identity(files.identity().unwrap());
        }
        let submitted = match tls_channel(central.addr, tls).await {
            Ok(channel) => NotificationIngestClient::new(channel)
                .submit_notification(submit("Tank 4 high level", "Level 97%"))
                .await
                .map(drop)
                .map_err(|status| status.to_string()),
            Err(connect) => Err(connect),
        };
        // The client sees the server's alert (certificate required / unknown CA) or, when it is
        // still writing as the server hangs up, a broken pipe: which one is a race, so only the
        // refusal is asserted (and, below, that nothing was stored).
        assert!(submitted.is_err(), "{label}: submit went through");
    }

    // The forwarder, through a relay that counts its attempts.
    let relay = CountingRelay::start(central.addr).await;
    for (site_id, identity) in [("site-none", None), ("site-rogue", Some(&rogue))] {
        let site_dir = dir.path().join(site_id);
        std::fs::create_dir(&site_dir).unwrap();
        let mut tls = pki.site_tls(None);
        if let Some(files) = identity {
            tls.cert = Some(files.cert.clone());
            tls.key = Some(files.key.clone());
        }
        let before = relay.connections.load(Ordering::SeqCst);
        let site = TlsSite::start(&site_dir, site_id, format!("https://{}", relay.addr), tls).await;
        site.client()
            .await
            .send(send_request("Tank 4 high level", "Level 97%"))
            .await
            .unwrap();
        // Two sessions: the first one ended without getting through.
        relay.wait_for_connections(before + 2).await;
        let stats = site.stats().await;
        assert!(!stats.central_reachable, "{site_id}: reported reachable");
        assert_eq!(stats.depth, 1, "{site_id}: the notification stays buffered");
        site.stop().await;
    }

    let db = Db::open(&central.db);
    assert_eq!(db.count("SELECT COUNT(*) FROM Notifications"), 0);
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_certificate_names_the_only_site_its_holder_may_submit_as() {
    let dir = tempfile::tempdir().unwrap();
    let pki = CentralPki::new(dir.path());
    let site_a = pki.pki.client_cert("site-a").unwrap();
    let mut config = central_config(dir.path(), None);
    config.tls = pki.central_tls(true);
    let tls = pki.pki.client_tls(Some(&site_a)).unwrap();
    let central = Central::start_tls(config, tls.clone()).await;
    let mut ingest = NotificationIngestClient::new(tls_channel(central.addr, tls).await.unwrap());

    // Unary: PERMISSION_DENIED naming both ids.
    let mut impostor = submit("Tank 4 high level", "Level 97%");
    impostor.source_site_id = "site-b".into();
    let refused = ingest
        .submit_notification(impostor.clone())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("\"site-b\"") && refused.message().contains("\"site-a\""),
        "{}",
        refused.message()
    );
    let own = submit("Tank 5 high level", "Level 98%");
    let accepted = ingest
        .submit_notification(own.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(accepted.outcome(), v1::SubmitOutcome::Accepted);

    // Stream: the submits before the impostor's are acked; the impostor's ends the stream with
    // PERMISSION_DENIED naming both ids, and neither it nor anything after it is acked (no
    // REJECTED ack, which a site would take as final and set its row aside for good).
    let stream_own = submit("Tank 6 high level", "Level 99%");
    let mut stream_impostor = submit("Tank 7 high level", "Level 99%");
    stream_impostor.source_site_id = "site-b".into();
    let after = submit("Tank 8 high level", "Level 99%");
    let mut answers = ingest
        .submit_notifications(tokio_stream::iter([
            stream_own.clone(),
            stream_impostor.clone(),
            after.clone(),
        ]))
        .await
        .unwrap()
        .into_inner();
    let ack = answers.next().await.unwrap().unwrap();
    assert_eq!(
        (ack.notification_id.as_str(), ack.outcome()),
        (
            stream_own.notification_id.as_str(),
            v1::SubmitOutcome::Accepted
        )
    );
    let ended = answers.next().await.unwrap().unwrap_err();
    assert_eq!(ended.code(), Code::PermissionDenied, "{ended:?}");
    assert!(
        ended.message().starts_with("source_site_id: \"site-b\"")
            && ended.message().contains("\"site-a\""),
        "{}",
        ended.message()
    );
    assert!(answers.next().await.is_none(), "nothing after the end");

    let db = Db::open(&central.db);
    let mut stored = db.strings("SELECT NotificationId FROM Notifications");
    stored.sort();
    let mut want = vec![own.notification_id, stream_own.notification_id];
    want.sort();
    assert_eq!(
        stored, want,
        "nothing of the impostor's submits, nor what came after, is stored"
    );
    central.stop().await;
}

/// A site may clear only its own conditions: with client certificates required, site A's
/// certificate clearing site B's key is refused by name and ends nothing; clearing its own works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_certificate_names_the_only_site_whose_conditions_it_may_clear_or_acknowledge() {
    let dir = tempfile::tempdir().unwrap();
    let pki = CentralPki::new(dir.path());
    let site_a = pki.pki.client_cert("site-a").unwrap();
    let site_b = pki.pki.client_cert("site-b").unwrap();
    // One relay connection, held busy by fillers (one at the relay, two lined up behind it):
    // the keyed notification then waits unclaimed, there to be cleared or left.
    let sink = smtp_sink().await;
    sink.pause_replies();
    let mut config = central_config(dir.path(), Some(sink.addr()));
    let email = config.smtp.as_mut().unwrap();
    email.max_concurrent_connections = 1;
    email.timeout = std::time::Duration::from_secs(60);
    email.overall_timeout = std::time::Duration::from_secs(60);
    config.tls = pki.central_tls(true);
    let tls_a = pki.pki.client_tls(Some(&site_a)).unwrap();
    let tls_b = pki.pki.client_tls(Some(&site_b)).unwrap();
    let central = Central::start_tls(config, tls_a.clone()).await;
    let mut as_a = NotificationIngestClient::new(tls_channel(central.addr, tls_a).await.unwrap());
    let mut as_b = NotificationIngestClient::new(tls_channel(central.addr, tls_b).await.unwrap());
    for _ in 0..3 {
        let mut filler = submit("Filler", "keeps the relay busy");
        filler.source_site_id = "site-b".into();
        as_b.submit_notification(filler).await.unwrap();
    }
    assert!(sink.wait_for_held_replies(1, DEADLINE).await);
    wait_for_attempts_under_way(&central.db, 3).await;
    let db = Db::open(&central.db);
    let mut b_alarm = submit("Tank 9 high level", "Level 97%");
    b_alarm.source_site_id = "site-b".into();
    b_alarm.condition_key = "tank9.level.high".into();
    as_b.submit_notification(b_alarm.clone()).await.unwrap();

    let refused = as_a
        .clear_condition(v1::ClearConditionRequest {
            condition_key: "tank9.level.high".into(),
            source_site_id: "site-b".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().starts_with("source_site_id: \"site-b\"")
            && refused.message().contains("\"site-a\""),
        "{}",
        refused.message()
    );
    let (status, _, _) = db.row(&b_alarm.notification_id).unwrap();
    assert_ne!(status, "Cleared", "another site's clear changed nothing");
    // Nor may a site acknowledge another's condition.
    let refused = as_a
        .acknowledge_condition(v1::AcknowledgeConditionRequest {
            condition_key: "tank9.level.high".into(),
            source_site_id: "site-b".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().starts_with("source_site_id: \"site-b\""),
        "{}",
        refused.message()
    );

    let cleared = as_b
        .clear_condition(v1::ClearConditionRequest {
            condition_key: "tank9.level.high".into(),
            source_site_id: "site-b".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cleared.cleared, 1);
    wait_for_status(&central.db, &b_alarm.notification_id, "Cleared").await;
    sink.resume_replies();
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn central_refuses_plaintext_off_loopback_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = central_config(dir.path(), None);
    config.listen_addr = "0.0.0.0:0".parse().unwrap();
    let err = format!("{:#}", config.validate().unwrap_err());
    assert!(err.starts_with("listen_addr: 0.0.0.0:0"), "{err}");
    assert!(err.contains("tls"), "{err}");

    // `run` checks the address it was handed, whatever `listen_addr` said.
    let loopback = central_config(dir.path(), None);
    let settings = loopback.validate().unwrap();
    let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let refused = central_outbox::run(settings, listener, CancellationToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.starts_with("listen_addr:"), "{refused}");

    config.tls.allow_plaintext = true;
    let settings = config.validate().unwrap();
    let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = CancellationToken::new();
    let task = tokio::spawn(central_outbox::run(settings, listener, stop.clone()));
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    wait_until_serving(addr).await;
    let ack = NotificationIngestClient::new(channel(addr).await)
        .submit_notification(submit("Tank 4 high level", "Level 97%"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ack.outcome(), v1::SubmitOutcome::Accepted);
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_site_refuses_plaintext_off_loopback_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = site_forwarder::config::Config::new("site-a");
    config.buffer_path = dir.path().join("site-a.db");
    config.listen_addr = "0.0.0.0:0".parse().unwrap();
    let err = config.validate().unwrap_err().to_string();
    assert!(err.starts_with("listen_addr: 0.0.0.0:0"), "{err}");
    assert!(err.contains("tls.allow_plaintext"), "{err}");

    config.tls.allow_plaintext = true;
    let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = CancellationToken::new();
    let task = tokio::spawn(site_forwarder::run(config, listener, stop.clone()));
    wait_until_serving(SocketAddr::from(([127, 0, 0, 1], port))).await;
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_forwards_to_an_https_central_trusting_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = CentralPki::new(dir.path());
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    // Server TLS only: sites are not asked for certificates.
    config.tls = pki.central_tls(false);
    let central = Central::start_tls(config, pki.pki.client_tls(None).unwrap()).await;

    // Dialled by address, checked against the name: `domain` overrides the URL's host.
    let mut tls = pki.site_tls(None);
    tls.domain = Some("localhost".into());
    let site = TlsSite::start(
        dir.path(),
        "site-a",
        format!("https://{}", central.addr),
        tls,
    )
    .await;
    let mut client = site.client().await;
    let id = client
        .send(send_request("Tank 4 high level", "Level 97%"))
        .await
        .unwrap()
        .into_inner()
        .notification_id;
    wait_for_status(&central.db, &id, "Delivered").await;
    sink.wait_for_messages(1, DEADLINE).await;
    eventually("the site buffer drains", || async {
        (site.stats().await.depth == 0).then_some(())
    })
    .await;
    // No longer buffered: the site asks central, over the same TLS link.
    let status = client
        .get_status(v1::GetNotificationStatusRequest {
            notification_id: id,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.status(), v1::NotificationStatus::Delivered);
    site.stop().await;
    central.stop().await;
}

/// `outbox_site_identity_unverified` on the `/metrics` at `addr`, once it is served.
async fn site_identity_gauge(addr: SocketAddr) -> f64 {
    eventually("/metrics answers", || async move {
        let scrape = metrics_endpoint::get(addr, "/metrics").await.ok()?;
        assert_eq!(scrape.status, 200);
        let sample = metrics_endpoint::sample(&scrape.body, "outbox_site_identity_unverified");
        assert!(sample.is_some(), "no site identity gauge:\n{}", scrape.body);
        sample
    })
    .await
}

/// With TLS but no `client_ca`, any client that reaches central may submit, clear conditions and
/// report health as any site. Central says so where an operator looks: a warning in its log at
/// every start, `outbox_site_identity_unverified 1` on `/metrics`, and a warning on the
/// console's dashboard. With `client_ca` the gauge is 0. Nothing else changes: such a central
/// still serves every client it served before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn central_says_when_it_cannot_tell_sites_apart() {
    use tokio::io::AsyncBufReadExt;

    let dir = tempfile::tempdir().unwrap();
    let pki = CentralPki::new(dir.path());

    // The binary, TLS without client_ca: its log says so at start.
    let addr = free_addr().await;
    let metrics = free_addr().await;
    let db = dir.path().join("central.db");
    let _database = CentralDatabase::create(&db).await;
    let file = dir.path().join("central.toml");
    std::fs::write(
        &file,
        format!(
            "listen_addr = \"{addr}\"\nmetrics_listen = \"{metrics}\"\ndatabase = \"{}\"\n\
             [auth]\nmode = \"none\"\n[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            database_url(&db),
            pki.server.cert.display(),
            pki.server.key.display(),
        ),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(binary("central-outbox"))
        .args(["--config", file.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut log = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let warning = tokio::time::timeout(DEADLINE, async {
        while let Some(line) = log.next_line().await.unwrap() {
            if line.contains("client_ca") {
                return line;
            }
        }
        panic!("central's log ended without a word about client_ca");
    })
    .await
    .expect("central warns about client_ca at start");
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("any site"), "{warning}");
    assert_eq!(site_identity_gauge(metrics).await, 1.0);
    // Still serving sites as before.
    let ack = NotificationIngestClient::new(
        tls_channel(addr, pki.pki.client_tls(None).unwrap())
            .await
            .unwrap(),
    )
    .submit_notification(submit("Tank 4 high level", "Level 97%"))
    .await
    .unwrap()
    .into_inner();
    assert_eq!(ack.outcome(), v1::SubmitOutcome::Accepted);
    child.kill().await.unwrap();

    // With client_ca, sites are told apart: 0.
    let site = pki.pki.client_cert("site-a").unwrap();
    let mut config = central_config(&dir.path().join("mutual"), None);
    std::fs::create_dir_all(dir.path().join("mutual")).unwrap();
    config.tls = pki.central_tls(true);
    let metrics = free_addr().await;
    config.metrics_listen = Some(metrics);
    let central = Central::start_tls(config, pki.pki.client_tls(Some(&site)).unwrap()).await;
    assert_eq!(site_identity_gauge(metrics).await, 0.0);
    central.stop().await;

    // Plaintext (here on loopback) cannot tell sites apart either: the dashboard says so.
    let plain_dir = dir.path().join("plain");
    std::fs::create_dir_all(&plain_dir).unwrap();
    let mut config = central_config(&plain_dir, None);
    with_console(&mut config).await;
    let central = Central::start(config).await;
    let dashboard = http_get(central.console.unwrap(), "/").await;
    assert!(
        dashboard.contains(r#"id="site-identity-warning""#) && dashboard.contains("any site"),
        "{dashboard}"
    );
    central.stop().await;
}

/// The body of a plain HTTP GET of `path` at `addr`.
async fn http_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// `outbox_site_forward_refused` on the site's `/metrics` at `addr`, once it is served.
async fn forward_refused_gauge(addr: SocketAddr) -> Option<f64> {
    let scrape = metrics_endpoint::get(addr, "/metrics").await.ok()?;
    metrics_endpoint::sample(&scrape.body, "outbox_site_forward_refused")
}

/// With client certificates required, a site whose certificate names another site than its
/// `site_id` cannot forward, and loses nothing: central ends its stream with PERMISSION_DENIED
/// without acking anything of it, the site keeps every row buffered (none is set aside as
/// rejected), says so (GetBufferStats' `forward_refused_reason`, `outbox_site_forward_refused 1`)
/// and keeps trying. Restarted with its own certificate on the same buffer, it delivers them all
/// and the refusal is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_with_another_sites_certificate_keeps_its_rows_until_the_certificate_is_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let pki = CentralPki::new(dir.path());
    let site_a = pki.pki.client_cert("site-a").unwrap();
    let site_b = pki.pki.client_cert("site-b").unwrap();
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.tls = pki.central_tls(true);
    let central = Central::start_tls(config, pki.pki.client_tls(Some(&site_a)).unwrap()).await;
    let relay = CountingRelay::start(central.addr).await;

    // site-a, presenting site-b's certificate.
    let metrics = free_addr().await;
    let site = TlsSite::start_with(
        dir.path(),
        "site-a",
        format!("https://{}", relay.addr),
        pki.site_tls(Some(&site_b)),
        Some(metrics),
    )
    .await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let id = site
            .client()
            .await
            .send(send_request(&format!("Tank {i} high level"), "Level 97%"))
            .await
            .unwrap()
            .into_inner()
            .notification_id;
        ids.push(id);
    }
    let stats = eventually("the site says central refuses it", || async {
        let stats = site.stats().await;
        (!stats.forward_refused_reason.is_empty()).then_some(stats)
    })
    .await;
    assert!(
        stats
            .forward_refused_reason
            .starts_with("source_site_id: \"site-a\"")
            && stats.forward_refused_reason.contains("\"site-b\""),
        "{stats:?}"
    );
    // It tries again (a connection for its health reports, then one per stream), and still
    // holds every row, none set aside.
    let before = relay.connections.load(Ordering::SeqCst);
    relay.wait_for_connections(before + 2).await;
    let stats = site.stats().await;
    assert_eq!((stats.depth, stats.rejected), (3, 0), "{stats:?}");
    assert!(!stats.forward_refused_reason.is_empty(), "{stats:?}");
    assert_eq!(forward_refused_gauge(metrics).await, Some(1.0));
    let db = Db::open(&central.db);
    assert_eq!(db.count("SELECT COUNT(*) FROM Notifications"), 0);
    site.stop().await;

    // The certificate fixed: the same buffer, forwarded and delivered.
    let metrics = free_addr().await;
    let site = TlsSite::start_with(
        dir.path(),
        "site-a",
        format!("https://{}", central.addr),
        pki.site_tls(Some(&site_a)),
        Some(metrics),
    )
    .await;
    for id in &ids {
        wait_for_status(&central.db, id, "Delivered").await;
    }
    sink.wait_for_messages(3, DEADLINE).await;
    eventually("the site buffer drains", || async {
        (site.stats().await.depth == 0).then_some(())
    })
    .await;
    let stats = site.stats().await;
    assert_eq!(stats.rejected, 0);
    assert_eq!(stats.forward_refused_reason, "");
    assert_eq!(forward_refused_gauge(metrics).await, Some(0.0));
    site.stop().await;
    central.stop().await;
}
