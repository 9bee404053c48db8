//! The site-forwarder's figures: durable `Send` throughput (closed loop), `Send` latency at a
//! fixed offered rate (open loop), and how fast a backlog drains into central.
//!
//! The Send figures run the site alone, its central address pointing at a closed port: they
//! measure the durable acceptance path (gRPC, validation, group commit, fsync), not forwarding,
//! which has its own figure. The forwarder then only retries a refused connection every 100 ms.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_proto::v1;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use serde_json::json;
use tonic::transport::Channel;

use crate::central_figures::log_json;
use crate::fixtures::{self, SOURCE_INSTANCE, SOURCE_SCRIPT};
use crate::load::{self, Window};
use crate::proc_stats::{CpuWindow, flush_disk, own_pid};
use crate::report::RunRecord;
use crate::rig::{Rig, check_count};
use crate::services::{self, LIST, Service};

/// Numbers the subjects and bodies of every Send this process makes, so rows differ.
static SEND_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A Send as a site script makes it.
pub(crate) fn send_request() -> v1::SendRequest {
    let (subject, body) = fixtures::content(SEND_COUNTER.fetch_add(1, Ordering::Relaxed));
    v1::SendRequest {
        r#type: v1::NotificationType::Email.into(),
        list_name: LIST.into(),
        subject,
        body,
        type_data: String::new(),
        source_instance_id: SOURCE_INSTANCE.into(),
        source_script: SOURCE_SCRIPT.into(),
        origin_execution_id: Some(uuid::Uuid::new_v4().to_string()),
        origin_parent_execution_id: None,
        priority: v1::NotificationPriority::Normal.into(),
        condition_key: String::new(),
        deliver_after: None,
    }
}

/// One Send; the notification id on success.
pub(crate) async fn send_once(mut client: SiteNotifyClient<Channel>) -> Result<String, String> {
    client
        .send(send_request())
        .await
        .map(|reply| reply.into_inner().notification_id)
        .map_err(|status| format!("Send: {status}"))
}

pub(crate) async fn site_clients(
    site: &Service,
    count: usize,
) -> Result<Vec<SiteNotifyClient<Channel>>> {
    Ok(services::connections(site.addr, count)
        .await?
        .into_iter()
        .map(SiteNotifyClient::new)
        .collect())
}

pub(crate) async fn buffer_stats(site: &Service) -> Result<v1::BufferStats> {
    Ok(SiteNotifyClient::new(site.connect().await?)
        .get_buffer_stats(v1::GetBufferStatsRequest {})
        .await
        .context("GetBufferStats")?
        .into_inner())
}

/// Starts a site with no central reachable, on `buffer` as it is (the caller's own copy), or
/// on a fresh copy of the empty template in `dir`.
pub(crate) async fn lone_site(
    rig: &Rig,
    dir: &std::path::Path,
    buffer: Option<&std::path::Path>,
) -> Result<Service> {
    let path = match buffer {
        Some(path) => path.to_path_buf(),
        None => {
            let path = dir.join("site.db");
            fixtures::copy_db(&rig.site_template, &path)?;
            path
        }
    };
    let toml = services::site_toml(services::free_addr()?, &path, services::free_addr()?);
    Service::site(&rig.bins, dir, "site", &toml).await
}

/// Closed-loop Sends against a running site; fails if any Send failed.
pub(crate) async fn send_closed_loop(rig: &Rig, site: &Service) -> Result<load::ClosedLoop> {
    let clients = site_clients(site, rig.sizes.callers).await?;
    let window = Window {
        warmup: rig.sizes.warmup,
        measure: rig.sizes.measure,
    };
    let result = load::closed_loop(clients, window, |client| async move {
        send_once(client).await.map(drop)
    })
    .await;
    if result.errors > 0 {
        bail!(
            "{} Sends failed; first: {}",
            result.errors,
            result.first_error.as_deref().unwrap_or("?")
        );
    }
    Ok(result)
}

/// Figure 1: durable Sends per second with `callers` concurrent callers, empty buffer.
pub(crate) async fn send_rate(rig: &mut Rig) -> Result<RunRecord> {
    let dir = rig.run_dir("send")?;
    let site = lone_site(rig, dir.path(), None).await?;
    flush_disk();
    let cpu = CpuWindow::start(&[("site", site.pid()), ("bench", own_pid())]);
    let result = send_closed_loop(rig, &site).await?;
    let cores = cpu.cores();
    site.stop().await?;
    Ok(RunRecord::new()
        .value("send.rate", result.rate)
        .detail("closed_loop", result.to_json())
        .cpu(cores))
}

/// Figure 2: Send latency at a fixed offered rate, measured from each call's due time.
pub(crate) async fn send_latency(rig: &mut Rig) -> Result<RunRecord> {
    let dir = rig.run_dir("send-latency")?;
    let site = lone_site(rig, dir.path(), None).await?;
    let clients = site_clients(&site, rig.sizes.callers).await?;
    let sizes = rig.sizes.clone();
    flush_disk();
    let cpu = CpuWindow::start(&[("site", site.pid()), ("bench", own_pid())]);
    let result = load::open_loop(
        clients,
        sizes.send_rate,
        sizes.warmup + sizes.measure,
        send_once,
    )
    .await;
    let cores = cpu.cores();
    site.stop().await?;
    if result.errors > 0 {
        bail!(
            "{} Sends failed; first: {}",
            result.errors,
            result.first_error.as_deref().unwrap_or("?")
        );
    }
    let latency = result.latencies_after(sizes.warmup);
    Ok(RunRecord::new()
        .value("send_latency.p50", latency.p50)
        .value("send_latency.p99", latency.p99)
        .detail("latency", latency.to_json())
        .detail("offered_per_s", json!(sizes.send_rate))
        .detail(
            "max_send_lag_ms",
            json!(result.max_send_lag.as_secs_f64() * 1000.0),
        )
        .cpu(cores))
}

/// Sends `rows` notifications with `callers` closed-loop callers; returns Sends per second.
pub(crate) async fn fill(site: &Service, rows: u64, callers: usize) -> Result<f64> {
    let clients = site_clients(site, callers).await?;
    let issued = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        let issued = Arc::clone(&issued);
        tasks.spawn(async move {
            while issued.fetch_add(1, Ordering::Relaxed) < rows {
                send_once(client.clone()).await?;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(task) = tasks.join_next().await {
        match task {
            Ok(Ok(())) => {}
            Ok(Err(e)) => bail!("filling the buffer: {e}"),
            Err(e) => bail!("filling the buffer: task failed: {e}"),
        }
    }
    let rate = rows as f64 / started.elapsed().as_secs_f64();
    let depth = buffer_stats(site).await?.depth;
    check_count("buffer depth after filling", depth, rows)?;
    Ok(rate)
}

/// How often the drain is checked. GetBufferStats counts the buffer's rows, which costs the
/// site a little CPU; every 100 ms that stays well under 1% of a core, and the end of the drain
/// is known to within 100 ms.
const DRAIN_POLL: Duration = Duration::from_millis(100);

/// Figure 3: a site holding `forward_rows` Sends made while central was down; central starts
/// (as a replica that does not dispatch, so the figure is forwarding + ingest only) and the
/// clock runs from central reporting SERVING until the site's buffer is empty.
pub(crate) async fn forward(rig: &mut Rig) -> Result<RunRecord> {
    let filled = rig.filled_buffer().await?;
    let dir = rig.run_dir("forward")?;
    let central_db = rig.central_db(dir.path()).await?;
    central_db.hold_dispatcher_lease().await?;
    let central_addr = services::free_addr()?;
    let site_db = dir.path().join("site.db");
    fixtures::copy_db(&filled.path, &site_db)?;
    let toml = services::site_toml(services::free_addr()?, &site_db, central_addr);
    let mut site = Service::site(&rig.bins, dir.path(), "site", &toml).await?;
    check_count(
        "buffered before central starts",
        buffer_stats(&site).await?.depth,
        filled.rows,
    )?;

    let toml = services::central_toml(central_addr, &central_db.url(), services::free_addr()?);
    flush_disk();
    let spawned = Instant::now();
    let mut central = Service::central(&rig.bins, dir.path(), "central", &toml).await?;
    let serving = Instant::now();
    let cpu = CpuWindow::start(&[
        ("site", site.pid()),
        ("central", central.pid()),
        ("bench", own_pid()),
    ])
    .with_server(central.pid(), rig.backend.server_port());
    // A backlog that drains at less than 1,000/s is a failure worth stopping for.
    let deadline = Duration::from_secs(60).max(Duration::from_millis(filled.rows));
    let drained = loop {
        tokio::time::sleep(DRAIN_POLL).await;
        site.check_alive()?;
        central.check_alive()?;
        if buffer_stats(&site).await?.depth == 0 {
            break Instant::now();
        }
        if serving.elapsed() > deadline {
            bail!("the buffer did not drain within {deadline:?}");
        }
    };
    let cores = cpu.cores();
    let seconds = (drained - serving).as_secs_f64();
    site.stop().await?;
    let sessions = rig.backend.sessions_of(central.pid());
    let central_log = central.stop().await?;
    let stored = central_db.stored_notifications().await?;
    central_db.finish(&sessions).await;
    check_count("rows in central after the drain", stored, filled.rows)?;
    Ok(RunRecord::new()
        .value("forward.rate", filled.rows as f64 / seconds)
        .detail("rows", json!(filled.rows))
        .detail("drain_seconds", json!(seconds))
        .detail(
            "central_startup_ms",
            json!((serving - spawned).as_secs_f64() * 1000.0),
        )
        .detail("fill_sends_per_s", json!(filled.fill_rate))
        .detail("central_log", log_json(&central_log))
        .cpu(cores))
}

/// One integer from a query on a stopped service's database.
pub(crate) fn count_rows(db: &std::path::Path, sql: &str) -> Result<u64> {
    let conn = rusqlite::Connection::open(db)?;
    let n: i64 = conn.query_row(sql, [], |row| row.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}
