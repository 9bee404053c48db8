//! Site health at central: a real site-forwarder process reports its health every few seconds;
//! central shows it online with its figures (ListSiteHealth, `outboxctl sites`, `/metrics`),
//! offline once it has been silent for `site_offline_after`, and online again when it returns.
//! With client certificates required, a site's certificate may report only for its own site.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use outbox_proto::v1;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use outbox_proto::v1::notification_outbox_client::NotificationOutboxClient;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use outbox_tests::pki::Pki;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::harness::{
    Central, Db, Process, binary, central_config, channel, eventually, free_addr, send_request,
    tls_channel, wait_until_serving,
};

/// Short, so the test sees a node go offline quickly; long enough that a node reporting every
/// [`REPORT_INTERVAL`] never looks offline, even on a slow MS SQL server.
const OFFLINE_AFTER: Duration = Duration::from_secs(3);
const REPORT_INTERVAL: &str = "200ms";

/// A site-forwarder process for `site_id` reporting every [`REPORT_INTERVAL`] to `central`
/// (the console's browser test uses it too).
pub(crate) async fn spawn_reporting_site(
    dir: &Path,
    site_id: &str,
    central: SocketAddr,
) -> (Process, SocketAddr) {
    let addr = free_addr().await;
    let buffer = dir.join(format!("{site_id}.db"));
    let child = tokio::process::Command::new(binary("site-forwarder"))
        .args([
            "serve",
            "--site-id",
            site_id,
            "--listen",
            &addr.to_string(),
            "--buffer",
            buffer.to_str().unwrap(),
            "--central",
            &format!("http://{central}"),
        ])
        .env("RUST_LOG", "warn")
        .env("OUTBOX_SITE_HEALTH_REPORT_INTERVAL", REPORT_INTERVAL)
        .env("OUTBOX_SITE_FORWARD_RETRY_INTERVAL", "100ms")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_until_serving(addr).await;
    (Process(child), addr)
}

async fn site_health(central: &Central) -> v1::ListSiteHealthResponse {
    central
        .outbox()
        .await
        .list_site_health(v1::ListSiteHealthRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// The node's view once `check` holds for it.
async fn node_when(
    central: &Central,
    what: &str,
    check: impl Fn(&v1::SiteHealthView) -> bool,
) -> v1::SiteHealthView {
    eventually(what, || async {
        site_health(central)
            .await
            .nodes
            .into_iter()
            .find(|n| n.site_id == "site-a" && n.node_name == "site-a")
            .filter(|n| check(n))
    })
    .await
}

/// `outboxctl --addr <central> ARGS...`: its stdout, after asserting it succeeded.
async fn outboxctl(central: SocketAddr, args: &[&str]) -> String {
    let output = tokio::process::Command::new(binary("outboxctl"))
        .arg("--addr")
        .arg(format!("http://{central}"))
        .args(args)
        .env("USER", "operator")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "outboxctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

async fn scrape(metrics: SocketAddr, series: &str) -> Option<f64> {
    let reply = metrics_endpoint::get(metrics, "/metrics").await.ok()?;
    metrics_endpoint::sample(&reply.body, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_is_online_while_it_reports_offline_when_stopped_and_online_when_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = central_config(dir.path(), None);
    config.site_offline_after = OFFLINE_AFTER;
    let metrics = free_addr().await;
    config.metrics_listen = Some(metrics);
    let central = Central::start(config).await;
    assert!(site_health(&central).await.nodes.is_empty());

    let (site, site_addr) = spawn_reporting_site(dir.path(), "site-a", central.addr).await;
    let mut notify = SiteNotifyClient::new(channel(site_addr).await);
    notify
        .send(send_request("Tank 4 high level", "Level 97%"))
        .await
        .unwrap();
    let node = node_when(&central, "the site reports a forward, online", |n| {
        n.online && n.last_forward_at.is_some()
    })
    .await;
    let own = notify
        .get_buffer_stats(v1::GetBufferStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node.role(), v1::NodeRole::Active);
    assert_eq!(node.version, site_forwarder::VERSION);
    assert_eq!(
        node.buffer_depth, own.depth,
        "the depth the site itself reports"
    );
    assert_eq!(node.offline_since, None);
    assert!(node.last_report_age_seconds < OFFLINE_AFTER.as_secs_f64());
    let listed = site_health(&central).await;
    assert_eq!(listed.nodes.len(), 1);
    assert_eq!(
        listed.site_offline_after,
        Some(outbox_proto::time::to_duration(OFFLINE_AFTER))
    );

    // The same through outboxctl, for a script and for a person.
    let json: Value =
        serde_json::from_str(&outboxctl(central.addr, &["--json", "sites"]).await).unwrap();
    let shown = &json["nodes"][0];
    assert_eq!(shown["site_id"], "site-a");
    assert_eq!(shown["role"], "active");
    assert_eq!(shown["online"], true);
    assert_eq!(shown["buffer_depth"], 0);
    assert!(shown["last_forward_at"].is_string(), "{json}");
    assert_eq!(json["site_offline_after"], "3s");
    let table = outboxctl(central.addr, &["sites"]).await;
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("site-a") && l.contains("online")),
        "{table}"
    );
    let online = "outbox_site_health_online{site=\"site-a\",node=\"site-a\"}";
    eventually("/metrics shows the node online", || async {
        (scrape(metrics, online).await == Some(1.0)).then_some(())
    })
    .await;
    assert_eq!(
        scrape(
            metrics,
            "outbox_site_health_buffer_depth{site=\"site-a\",node=\"site-a\"}"
        )
        .await,
        Some(0.0)
    );

    // Stopped: nothing more arrives, and the node turns offline once its report is old enough.
    site.kill9().await;
    let gone = node_when(&central, "the silent site to go offline", |n| !n.online).await;
    assert!(gone.last_report_age_seconds >= OFFLINE_AFTER.as_secs_f64());
    assert!(gone.offline_since.is_some());
    let table = outboxctl(central.addr, &["sites"]).await;
    assert!(table.contains("OFFLINE since"), "{table}");
    eventually("/metrics shows the node offline", || async {
        (scrape(metrics, online).await == Some(0.0)).then_some(())
    })
    .await;

    // Back: its first report, sent at start, makes it online again.
    let (site, _) = spawn_reporting_site(dir.path(), "site-a", central.addr).await;
    let back = node_when(&central, "the restarted site to be online", |n| n.online).await;
    let at = |view: &v1::SiteHealthView| {
        outbox_proto::time::from_timestamp(view.last_report_at.as_ref().unwrap()).unwrap()
    };
    assert!(at(&back) > at(&gone));
    assert_eq!(site_health(&central).await.nodes.len(), 1, "still one node");
    site.kill9().await;
    central.stop().await;
}

/// With client certificates required, a site's certificate may report health only for its own
/// site: a report for another is refused by name and stores nothing; a real site-forwarder with
/// its own certificate reports and is shown online.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_certificate_may_report_health_only_for_its_own_site() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "plant").unwrap();
    let server = pki.server_cert().unwrap();
    let site_a = pki.client_cert("site-a").unwrap();
    let mut config = central_config(dir.path(), None);
    config.tls = central_outbox::tls::TlsConfig {
        cert: Some(server.cert.clone()),
        key: Some(server.key.clone()),
        client_ca: Some(pki.ca_cert().to_path_buf()),
        allow_plaintext: false,
    };
    let tls = pki.client_tls(Some(&site_a)).unwrap();
    let central = Central::start_tls(config, tls.clone()).await;
    let channel = tls_channel(central.addr, tls).await.unwrap();
    let mut ingest = NotificationIngestClient::new(channel.clone());
    let mut outbox = NotificationOutboxClient::new(channel);

    let impostor = v1::SiteHealthReport {
        site_id: "site-b".into(),
        node_name: "site-b".into(),
        role: v1::NodeRole::Active.into(),
        buffer_depth: 3,
        version: "0.0.0".into(),
        ..Default::default()
    };
    let refused = ingest.report_site_health(impostor).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().starts_with("site_id: \"site-b\"")
            && refused.message().contains("\"site-a\""),
        "{}",
        refused.message()
    );
    let db = Db::open(&central.db);
    assert_eq!(db.count("SELECT COUNT(*) FROM SiteHealth"), 0);
    let listed = outbox
        .list_site_health(v1::ListSiteHealthRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(listed.nodes.is_empty(), "{listed:?}");

    // The real forwarder with its own certificate.
    let mut site_config = site_forwarder::config::Config::new("site-a");
    site_config.buffer_path = dir.path().join("site-a.db");
    site_config.central_url = format!("https://{}", central.addr);
    site_config.tls = site_forwarder::tls::TlsConfig {
        ca: Some(pki.ca_cert().to_path_buf()),
        cert: Some(site_a.cert.clone()),
        key: Some(site_a.key.clone()),
        ..Default::default()
    };
    site_config.health_report_interval = Duration::from_millis(200);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stop = CancellationToken::new();
    let token = stop.clone();
    let site = tokio::spawn(async move {
        site_forwarder::run(site_config, listener, token)
            .await
            .unwrap();
    });
    let node = eventually("the site with its own certificate to be online", || {
        let mut outbox = outbox.clone();
        async move {
            let listed = outbox
                .list_site_health(v1::ListSiteHealthRequest {})
                .await
                .ok()?
                .into_inner();
            listed.nodes.into_iter().find(|n| n.online)
        }
    })
    .await;
    assert_eq!(
        (node.site_id.as_str(), node.node_name.as_str()),
        ("site-a", "site-a")
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM SiteHealth"), 1);
    stop.cancel();
    site.await.unwrap();
    central.stop().await;
}

/// A health report of the given site and node, as a site-forwarder sends it.
fn node_report(site: &str, node: &str) -> v1::SiteHealthReport {
    v1::SiteHealthReport {
        site_id: site.into(),
        node_name: node.into(),
        role: v1::NodeRole::Active.into(),
        version: "0.1.0".into(),
        central_reachable: true,
        ..Default::default()
    }
}

/// What central keeps of site health is bounded: once a site has 16 nodes reported, a report
/// from a 17th is refused naming the limit and stores nothing, while the 16 (and other sites)
/// report as before; a node silent for `retention.site_health_retention` is forgotten by the
/// purge (ListSiteHealth and `/metrics` no longer show it, and it is counted), which frees its
/// place, while a node that keeps reporting stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_keeps_at_most_16_nodes_and_silent_ones_are_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = central_config(dir.path(), None);
    config.site_offline_after = Duration::from_secs(1);
    // Long enough that north-0, reporting all along, is never silent that long even when each
    // round trip takes a second or two (a loaded MS SQL server).
    config.retention.site_health_retention = Duration::from_secs(5);
    config.retention.purge_interval = Duration::from_secs(1);
    let metrics = free_addr().await;
    config.metrics_listen = Some(metrics);
    let central = Central::start(config).await;
    let mut ingest = central.ingest().await;
    for i in 0..16 {
        ingest
            .report_site_health(node_report("north", &format!("north-{i}")))
            .await
            .unwrap();
    }
    let refused = ingest
        .report_site_health(node_report("north", "north-16"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .starts_with("node_name: site \"north\" already has 16 nodes")
            && refused
                .message()
                .contains("retention.site_health_retention"),
        "{}",
        refused.message()
    );
    // What is stored, as ListSiteHealth shows it (every stored node, online or not).
    let count = |site: &'static str| {
        let central = &central;
        async move {
            site_health(central)
                .await
                .nodes
                .iter()
                .filter(|n| n.site_id == site)
                .count()
        }
    };
    assert_eq!(count("north").await, 16);
    // The 16 still report; another site has places of its own.
    ingest
        .report_site_health(node_report("north", "north-0"))
        .await
        .unwrap();
    ingest
        .report_site_health(node_report("south", "south-a"))
        .await
        .unwrap();
    assert_eq!(
        scrape(metrics, "outbox_site_health_reports_refused_total").await,
        Some(1.0)
    );

    // north-0 keeps reporting; the other nodes fall silent and are forgotten.
    let shared = &central;
    let listed = eventually("the silent nodes are forgotten", || {
        let mut ingest = ingest.clone();
        async move {
            ingest
                .report_site_health(node_report("north", "north-0"))
                .await
                .unwrap();
            let listed = site_health(shared).await;
            (listed.nodes.len() == 1).then_some(listed)
        }
    })
    .await;
    assert_eq!(
        (
            listed.nodes[0].site_id.as_str(),
            listed.nodes[0].node_name.as_str()
        ),
        ("north", "north-0")
    );
    assert!(listed.nodes[0].online);
    // 15 of north and south-a, counted once the pass that deleted them returns (and north-0 too,
    // should a slow server have let it fall silent for the retention once).
    eventually("the forgotten nodes are counted", || async {
        scrape(metrics, "outbox_site_nodes_forgotten_total")
            .await
            .filter(|n| *n >= 16.0)
    })
    .await;
    // A forgotten node has no series from the first KPI read after the pass (a scrape meanwhile
    // may still show figures read before it: on a slow server, a read that began before it).
    eventually("a forgotten node has no series", || async {
        let series = "outbox_site_health_online{site=\"north\",node=\"north-1\"}";
        scrape(metrics, series).await.is_none().then_some(())
    })
    .await;
    // Their places are free: a new node of north reports (refused above while 16 were kept).
    ingest
        .report_site_health(node_report("north", "north-16"))
        .await
        .unwrap();
    // north-0 and north-16 are what north may have now; north-0 only if a loaded server has not
    // let it fall silent for the retention since its last report (seen on Babelfish with the
    // machine's load at 10), so the test does not ask for it.
    let mut north: Vec<String> = site_health(&central)
        .await
        .nodes
        .into_iter()
        .filter(|n| n.site_id == "north")
        .map(|n| n.node_name)
        .collect();
    north.sort();
    assert!(
        north == ["north-0", "north-16"] || north == ["north-16"],
        "north's nodes: {north:?}"
    );
    central.stop().await;
}
