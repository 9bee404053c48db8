//! The standby figures: the site's durable Send rate and latency with a standby attached next
//! to the same site alone, measured back to back in one run so the ratio compares like with
//! like, and how far the standby trails the active meanwhile.
//!
//! In production the standby is another machine. Here the load generator, the active and the
//! standby share 2 cores, so the standby's own work (about a quarter of a core at full load)
//! comes out of what the active and the load generator get; the figure is a lower bound.
//! (Running the standby at `nice 19` did not change it measurably, so it is not offered.) What
//! replication costs the active itself is its CPU time per Send against the site alone's,
//! reported beside it.
//!
//! Both nodes run with no central reachable (like the other Send figures), so the figures are
//! the acceptance path plus replication. The lag is sampled from the active's GetBufferStats
//! every [`LAG_POLL`] during a second closed loop (the heaviest load the site sees), so the
//! sampling does not weigh on the rate.

use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::json;
use tokio::time::Instant;

use crate::fixtures;
use crate::load::{self, Percentiles};
use crate::proc_stats::{CpuWindow, flush_disk, own_pid};
use crate::report::RunRecord;
use crate::rig::Rig;
use crate::services::{self, Service};
use crate::site_figures::{buffer_stats, lone_site, send_closed_loop, send_once, site_clients};

/// How often the replication lag is sampled. GetBufferStats counts the buffer, which grows by
/// ~100,000 rows in a closed loop; sampling more often would load the active noticeably.
const LAG_POLL: Duration = Duration::from_millis(200);

pub(crate) async fn standby(rig: &mut Rig) -> Result<RunRecord> {
    if services::tls_enabled() {
        bail!("the standby figures run on a plaintext loopback pair; run them without --tls");
    }
    let dir = rig.run_dir("standby")?;

    // The same site alone first.
    let alone = lone_site(rig, dir.path(), None).await?;
    flush_disk();
    let alone_cpu = CpuWindow::start(&[("site", alone.pid())]);
    let alone_rate = send_closed_loop(rig, &alone).await?.rate;
    let alone_cores = alone_cpu.cores().get("site").copied().unwrap_or(0.0);
    alone.stop().await?;

    let (active, standby) = start_pair(rig, dir.path()).await?;
    wait_until_following(&active).await?;
    flush_disk();
    let cpu = CpuWindow::start(&[
        ("active", active.pid()),
        ("standby", standby.pid()),
        ("bench", own_pid()),
    ]);
    // The rate without anyone asking for stats (each GetBufferStats counts the growing buffer,
    // which the alone run does not pay either); the lag in a second loop of its own.
    let closed = send_closed_loop(rig, &active).await?;
    let cores = cpu.cores();
    let (lagged, lag) = tokio::join!(send_closed_loop(rig, &active), sample_lag(&active, rig));
    lagged?;
    let lag = lag?;
    // CPU time per Send on the active against the site alone: what replication costs the node
    // that takes the Sends, whatever the standby's own work takes from this shared machine.
    let active_cores = cores.get("active").copied().unwrap_or(0.0);
    let cost_ratio = (active_cores / closed.rate) / (alone_cores / alone_rate);

    let clients = site_clients(&active, rig.sizes.callers).await?;
    let sizes = rig.sizes.clone();
    let open = load::open_loop(
        clients,
        sizes.send_rate,
        sizes.warmup + sizes.measure,
        send_once,
    )
    .await;
    if open.errors > 0 {
        bail!(
            "{} Sends failed; first: {}",
            open.errors,
            open.first_error.as_deref().unwrap_or("?")
        );
    }
    let latency = open.latencies_after(sizes.warmup);
    // Everything the active holds reaches the standby once the load stops.
    let caught_up = catch_up(&active).await?;
    active.stop().await?;
    standby.stop().await?;
    Ok(RunRecord::new()
        .value("standby.rate", closed.rate)
        .value("standby.alone_rate", alone_rate)
        .value("standby.ratio", closed.rate / alone_rate)
        .value("standby.active_cpu_per_send", cost_ratio)
        .value("standby.p99", latency.p99)
        .value("standby.lag_rows_max", lag.rows_max as f64)
        .value("standby.lag_ms_p99", lag.ms.p99)
        .detail("closed_loop", closed.to_json())
        .detail("latency", latency.to_json())
        .detail("lag_ms", lag.ms.to_json())
        .detail("catch_up_ms", json!(caught_up.as_secs_f64() * 1000.0))
        .cpu(cores))
}

/// An active and its standby on fresh copies of the empty buffer template.
async fn start_pair(rig: &Rig, dir: &std::path::Path) -> Result<(Service, Service)> {
    let central = services::free_addr()?;
    let (a_pair, b_pair) = (services::free_addr()?, services::free_addr()?);
    let start = |name: &'static str, role: &'static str, listen, peer| async move {
        let buffer = dir.join(format!("{name}.db"));
        fixtures::copy_db(&rig.site_template, &buffer)?;
        let toml = format!(
            "{}\n[pair]\nnode_name = \"{name}\"\ninitial_role = \"{role}\"\n\
             listen = \"{listen}\"\npeer_url = \"http://{peer}\"\n",
            services::site_toml(services::free_addr()?, &buffer, central)
        );
        Service::site(&rig.bins, dir, name, &toml).await
    };
    let active = start("active", "active", a_pair, b_pair).await?;
    let standby = start("standby", "standby", b_pair, a_pair).await?;
    Ok((active, standby))
}

async fn wait_until_following(active: &Service) -> Result<()> {
    let started = Instant::now();
    while !buffer_stats(active).await?.peer_connected {
        if started.elapsed() > Duration::from_secs(30) {
            bail!("the standby did not attach within 30 s");
        }
        tokio::time::sleep(LAG_POLL).await;
    }
    Ok(())
}

/// Waits until the standby has confirmed every row; returns how long that took.
async fn catch_up(active: &Service) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let stats = buffer_stats(active).await?;
        if stats.standby_lag_rows == 0 {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!(
                "the standby still lags {} rows after 60 s",
                stats.standby_lag_rows
            );
        }
        tokio::time::sleep(LAG_POLL).await;
    }
}

struct Lag {
    rows_max: u64,
    ms: Percentiles,
}

/// Samples the active's reported lag over the closed loop's measured window (after its
/// warm-up).
async fn sample_lag(active: &Service, rig: &Rig) -> Result<Lag> {
    tokio::time::sleep(rig.sizes.warmup).await;
    let end = Instant::now() + rig.sizes.measure;
    let mut rows_max = 0;
    let mut ms = Vec::new();
    while Instant::now() < end {
        let stats = buffer_stats(active).await?;
        rows_max = rows_max.max(stats.standby_lag_rows);
        ms.push(Duration::from_secs_f64(stats.standby_lag_seconds));
        tokio::time::sleep(LAG_POLL).await;
    }
    Ok(Lag {
        rows_max,
        ms: Percentiles::of(ms),
    })
}
