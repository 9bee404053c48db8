//! Figure 6, idle end-to-end latency: a site and central running together, Sends offered at a low
//! fixed rate, and for each one the time from when the Send was due to when the SMTP sink (in
//! this process, so on the same monotonic clock) received the message whose Message-ID carries
//! its id.
//!
//! Before the measured Sends, a few warm-up notifications go all the way through, so the
//! forwarding stream and the SMTP connections are open as they would be on a live system.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_tests::smtp_sink::SmtpSink;
use serde_json::json;

use crate::central_figures::{log_json, wait_for_deliveries};
use crate::fixtures;
use crate::load::{self, Percentiles};
use crate::proc_stats::{CpuWindow, flush_disk, own_pid};
use crate::report::RunRecord;
use crate::rig::Rig;
use crate::services::{self, FROM_DOMAIN, Service};
use crate::site_figures::{buffer_stats, send_once, site_clients};

/// Warm-up notifications sent (and delivered) before the measured ones.
const WARM_UP: u64 = 5;
/// Longest the last measured notification may take after its Send. Generous (an idle delivery
/// takes milliseconds on SQLite, up to about a second on Babelfish): it only bounds how long a
/// run that lost a notification waits before failing.
const DELIVERY_DEADLINE: Duration = Duration::from_secs(40);
/// Connections from the simulated scripts to the site.
const CONNECTIONS: usize = 4;

pub(crate) async fn e2e(rig: &mut Rig) -> Result<RunRecord> {
    let Running {
        _dir,
        central_db,
        sink,
        mut central,
        site,
    } = site_and_central(rig, "e2e").await?;
    wait_until_connected(&site).await?;

    let clients = site_clients(&site, CONNECTIONS).await?;
    for _ in 0..WARM_UP {
        send_once(clients[0].clone())
            .await
            .map_err(anyhow::Error::msg)?;
    }
    let warm = wait_for_deliveries(&sink, &mut central, WARM_UP, DELIVERY_DEADLINE).await?;
    if warm < WARM_UP {
        bail!("warm-up: {warm} of {WARM_UP} notifications delivered within {DELIVERY_DEADLINE:?}");
    }

    let sizes = rig.sizes.clone();
    flush_disk();
    let cpu = CpuWindow::start(&[
        ("site", site.pid()),
        ("central", central.pid()),
        ("bench", own_pid()),
    ])
    .with_server(central.pid(), rig.backend.server_port());
    let sends = load::open_loop(clients, sizes.e2e_rate, sizes.e2e_duration, send_once).await;
    if sends.errors > 0 {
        bail!(
            "{} Sends failed; first: {}",
            sends.errors,
            sends.first_error.as_deref().unwrap_or("?")
        );
    }
    let expected = WARM_UP + sends.samples.len() as u64;
    let received = wait_for_deliveries(&sink, &mut central, expected, DELIVERY_DEADLINE).await?;
    let cores = cpu.cores();
    site.stop().await?;
    let sessions = rig.backend.sessions_of(central.pid());
    let central_log = central.stop().await?;
    central_db.finish(&sessions).await;
    sink.stop();

    let receipts = sink.receipts();
    let distinct: HashSet<_> = receipts.iter().map(|r| &r.message_id).collect();
    let duplicates = receipts.len() - distinct.len();
    let arrived: HashMap<String, Instant> = receipts
        .into_iter()
        .filter_map(|r| Some((id_of(r.message_id.as_deref()?)?.to_string(), r.at)))
        .collect();
    let mut latencies = Vec::with_capacity(sends.samples.len());
    let mut missing = 0;
    for sample in &sends.samples {
        match arrived.get(&sample.value) {
            Some(at) => latencies.push(at.saturating_duration_since(sample.due)),
            None => missing += 1,
        }
    }
    if missing > 0 {
        bail!(
            "{missing} of {} notifications were not delivered within {DELIVERY_DEADLINE:?} \
             ({received} messages in all)",
            sends.samples.len()
        );
    }
    let latency = Percentiles::of(latencies);
    let send_latency = Percentiles::of(sends.samples.iter().map(|s| s.done - s.due).collect());
    Ok(RunRecord::new()
        .value("e2e.p50", latency.p50)
        .value("e2e.p99", latency.p99)
        .detail("latency", latency.to_json())
        .detail("send_ack_latency", send_latency.to_json())
        .detail("offered_per_s", json!(sizes.e2e_rate))
        .detail("duplicate_messages", json!(duplicates))
        .detail("central_log", log_json(&central_log))
        .cpu(cores))
}

/// A site forwarding to central, which delivers to an in-process sink, in a run directory of
/// their own; what a figure of the whole path starts from.
pub(crate) struct Running {
    pub _dir: crate::rig::RunDir,
    pub central_db: crate::backend::CentralDb,
    pub sink: SmtpSink,
    pub central: Service,
    pub site: Service,
}

/// Starts [`Running`] in a run directory labelled `label`.
pub(crate) async fn site_and_central(rig: &Rig, label: &str) -> Result<Running> {
    let dir = rig.run_dir(label)?;
    let central_db = rig.central_db(dir.path()).await?;
    let site_db = dir.path().join("site.db");
    fixtures::copy_db(&rig.site_template, &site_db)?;
    let sink = SmtpSink::start().await?;
    sink.discard_messages(true);
    let central_addr = services::free_addr()?;
    let toml = services::central_toml(central_addr, &central_db.url(), sink.addr());
    let central = Service::central(&rig.bins, dir.path(), "central", &toml).await?;
    let toml = services::site_toml(services::free_addr()?, &site_db, central_addr);
    let site = Service::site(&rig.bins, dir.path(), "site", &toml).await?;
    Ok(Running {
        _dir: dir,
        central_db,
        sink,
        central,
        site,
    })
}

/// The notification id inside a Message-ID `<id@FROM_DOMAIN>`.
pub(crate) fn id_of(message_id: &str) -> Option<&str> {
    message_id
        .strip_prefix('<')?
        .strip_suffix('>')?
        .strip_suffix(FROM_DOMAIN)?
        .strip_suffix('@')
}

/// Waits until the site's forwarding stream to central is up.
async fn wait_until_connected(site: &Service) -> Result<()> {
    let started = Instant::now();
    loop {
        if buffer_stats(site)
            .await
            .context("waiting for the site to reach central")?
            .central_reachable
        {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("the site did not connect to central within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_id_yields_the_notification_id() {
        assert_eq!(id_of("<0190a-b@bench.example.test>"), Some("0190a-b"));
        assert_eq!(id_of("<x@elsewhere.test>"), None);
    }
}
