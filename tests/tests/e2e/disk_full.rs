//! A site whose disk fills (issue 25, items 1 and 2): the site-forwarder runs as a real process
//! with its buffer on a small tmpfs and central away. Sends are refused with a clear error
//! before the disk is full, health and stats say so, and once central starts the buffer drains,
//! every acked Send is mailed exactly once and Sends are taken again, with nothing done by hand.
//!
//! Mounting needs root: without it (or without `mount`), the test prints why it is skipped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;

use outbox_proto::v1;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use tokio::net::TcpListener;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::harness::{
    Central, Process, binary, central_config, channel, eventually, free_addr, send_request,
    smtp_sink, wait_until_serving,
};

/// The buffer's filesystem: small enough to fill in a second, large enough for SQLite's WAL.
const TMPFS_SIZE: &str = "8m";
/// The site's `min_free_disk_bytes`: a quarter of the filesystem.
const RESERVE: u64 = 2 << 20;

/// A tmpfs mounted on a temporary directory, unmounted when dropped (failure included); lazily,
/// so a process still closing its files there cannot keep it mounted.
pub(crate) struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None`, with the reason printed, when this process may not mount one.
    pub(crate) fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match mounted {
            Ok(out) if out.status.success() => Some(Self { dir }),
            Ok(out) => {
                eprintln!(
                    "SKIPPED: cannot mount a {size} tmpfs (the test needs root): {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: cannot run mount for a {size} tmpfs: {e}");
                None
            }
        }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

async fn health(addr: SocketAddr, service: &str) -> ServingStatus {
    HealthClient::new(channel(addr).await)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status()
}

async fn stats(client: &mut SiteNotifyClient<tonic::transport::Channel>) -> v1::BufferStats {
    client
        .get_buffer_stats(v1::GetBufferStatsRequest {})
        .await
        .unwrap()
        .into_inner()
}

async fn metric(addr: SocketAddr, series: &str) -> Option<f64> {
    let scrape = metrics_endpoint::get(addr, "/metrics").await.ok()?;
    metrics_endpoint::sample(&scrape.body, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_whose_disk_fills_refuses_sends_then_drains_and_recovers_by_itself() {
    let Some(tmpfs) = Tmpfs::mount(TMPFS_SIZE) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    // Central's address, with nothing behind it until central starts.
    let central_addr = free_addr().await;
    let site_addr = free_addr().await;
    let site_metrics = free_addr().await;
    let config = dir.path().join("site.toml");
    std::fs::write(
        &config,
        format!(
            "site_id = \"site-a\"\n\
             listen_addr = \"{site_addr}\"\n\
             buffer_path = \"{}\"\n\
             central_url = \"http://{central_addr}\"\n\
             forward_retry_interval = \"100ms\"\n\
             min_free_disk_bytes = {RESERVE}\n\
             metrics_listen = \"{site_metrics}\"\n",
            tmpfs.path().join("site-a.db").display()
        ),
    )
    .unwrap();
    let site = Process::spawn(
        &binary("site-forwarder"),
        &["serve", "--config", config.to_str().unwrap()],
    );
    wait_until_serving(site_addr).await;
    let mut client = SiteNotifyClient::new(channel(site_addr).await);

    // Central is away: Sends are taken until the reserve is reached, then refused clearly.
    let mut acked: Vec<String> = Vec::new();
    let mut send = async |subject: String, body: String| {
        client
            .send(send_request(&subject, &body))
            .await
            .map(|r| r.into_inner().notification_id)
    };
    let refusal = loop {
        let subject = format!("disk-full {}", acked.len());
        match send(subject.clone(), "x".repeat(64 * 1024)).await {
            Ok(_) => acked.push(subject),
            Err(status) => break status,
        }
        assert!(acked.len() < 1000, "an 8 MiB disk never refused a Send");
    };
    assert_eq!(refusal.code(), Code::ResourceExhausted, "{refusal:?}");
    assert!(
        refusal.message().contains("min_free_disk_bytes: ")
            && refusal
                .message()
                .contains(&format!("at least {RESERVE} bytes free")),
        "the error names the setting and its limit: {refusal:?}"
    );
    assert!(acked.len() > 5, "only {} Sends fit", acked.len());
    // Small Sends fit a little longer; once they do not, the buffer as a whole refuses.
    loop {
        let subject = format!("disk-full {}", acked.len());
        match send(subject.clone(), "level 97%".into()).await {
            Ok(_) => acked.push(subject),
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                break;
            }
        }
        assert!(acked.len() < 10_000, "small Sends were never refused");
    }

    // Health, stats and metrics say that the buffer takes no Sends, and why; central's
    // reachability is about central.
    eventually("SiteNotify reports NOT_SERVING", || async {
        (health(site_addr, "outbox.v1.SiteNotify").await == ServingStatus::NotServing).then_some(())
    })
    .await;
    assert_eq!(health(site_addr, "").await, ServingStatus::Serving);
    let mut client = SiteNotifyClient::new(channel(site_addr).await);
    let full = stats(&mut client).await;
    assert!(full.sends_refused, "{full:?}");
    assert!(
        full.sends_refused_reason
            .starts_with("min_free_disk_bytes: "),
        "{full:?}"
    );
    assert!(!full.central_reachable, "{full:?}");
    assert_eq!(full.depth, acked.len() as u64, "{full:?}");
    assert_eq!(
        metric(site_metrics, "outbox_site_sends_refused").await,
        Some(1.0)
    );

    // Central starts: the buffer drains, each acked Send is mailed once, and the site takes
    // Sends again by itself.
    let central_metrics = free_addr().await;
    let mut central_config = central_config(dir.path(), Some(sink.addr()));
    central_config.metrics_listen = Some(central_metrics);
    let central = Central::start_on(
        central_config,
        TcpListener::bind(central_addr).await.unwrap(),
    )
    .await;
    let drained = eventually("the buffer drained and taking Sends again", || {
        let mut client = client.clone();
        async move {
            let now = stats(&mut client).await;
            (now.depth == 0 && !now.sends_refused && now.central_reachable).then_some(now)
        }
    })
    .await;
    assert!(drained.sends_refused_reason.is_empty(), "{drained:?}");
    eventually("SiteNotify reports SERVING again", || async {
        (health(site_addr, "outbox.v1.SiteNotify").await == ServingStatus::Serving).then_some(())
    })
    .await;
    let after = "disk-full after recovery".to_owned();
    client
        .send(send_request(&after, "level 12%"))
        .await
        .expect("a Send after the drain is taken");
    acked.push(after);

    let mails = eventually("every acked Send is mailed", || {
        let mut by_subject: HashMap<String, usize> = HashMap::new();
        for mail in sink.messages() {
            if let Some(subject) = mail.subject() {
                *by_subject.entry(subject).or_default() += 1;
            }
        }
        let done = acked.iter().all(|s| by_subject.contains_key(s));
        async move { done.then_some(by_subject) }
    })
    .await;
    for subject in &acked {
        assert_eq!(mails.get(subject), Some(&1), "{subject} mailed once");
    }
    assert_eq!(
        metric(site_metrics, "outbox_site_sends_refused").await,
        Some(0.0)
    );
    // The acked rows were deleted once, not resent in a loop: at most one window's worth of
    // resends can come back DUPLICATE (a stream that broke before its acks were read).
    let duplicates = metric(
        central_metrics,
        "outbox_ingest_total{outcome=\"duplicate\"}",
    )
    .await
    .unwrap_or(0.0);
    assert!(
        duplicates <= acked.len() as f64,
        "{duplicates} DUPLICATE submits for {} Sends",
        acked.len()
    );

    drop(site);
    central.stop().await;
}
