//! Final statuses back to the site (issue 36): how soon a site knows what became of its
//! notification, and what sending the statuses back costs central.
//!
//! - Latency: a site and central run together, Sends go at the idle end-to-end rate, and a
//!   script's `WatchStatus` (all) on the site records when each Delivered arrives; the figure is
//!   that instant less the instant the SMTP sink (in this process, on the same monotonic clock)
//!   wrote its final 250.
//! - Cost: the dispatch figure twice in one run, without a watching site and with one whose
//!   statuses this process takes from central meanwhile (as the site-forwarder does:
//!   WatchSiteStatus, confirming each batch); and the ingest figure without and with a watch.
//!   Each is reported as the ratio with/without of the rates summed over four runs each, in the
//!   order without, with, with, without, twice (`paired`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_proto::v1;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use outbox_proto::v1::site_status_watch_message::Message as WatchMessage;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

use crate::central_figures::{Beside, dispatch_with, ingest_with, log_json, wait_for_deliveries};
use crate::e2e::{Running, id_of, site_and_central};
use crate::load::{self, Percentiles};
use crate::paired::{self, Paired};
use crate::report::RunRecord;
use crate::rig::Rig;
use crate::services::{SITE_ID, Service};
use crate::site_figures::{send_once, site_clients};

/// Longest the statuses may take to reach the site after the last delivery.
const STATUS_DEADLINE: Duration = Duration::from_secs(40);

pub(crate) async fn site_status(rig: &mut Rig) -> Result<RunRecord> {
    let (latency, details) = status_latency(rig).await?;
    let cost = cost(rig).await?;
    Ok(RunRecord::new()
        .value("site_status.p50", latency.p50)
        .value("site_status.p99", latency.p99)
        .value("site_status.dispatch_ratio", cost.dispatch.ratio())
        .value("site_status.ingest_ratio", cost.ingest.ratio())
        .detail("latency", latency.to_json())
        .detail("latency_run", details)
        .detail("dispatch_per_s", cost.dispatch.to_json())
        .detail(
            "dispatch_cpu_cores",
            json!({"without": cost.cpu.0, "with": cost.cpu.1}),
        )
        .detail("ingest_per_s", cost.ingest.to_json()))
}

/// Rounds of the cost figures (`paired::order`): twice without, with, with, without.
const COST_ROUNDS: usize = 4;

struct Cost {
    dispatch: Paired,
    ingest: Paired,
    /// The cores each process used in each dispatch figure, without and with.
    cpu: (Vec<serde_json::Value>, Vec<serde_json::Value>),
}

/// The dispatch and ingest figures without and with the statuses flowing back, interleaved.
async fn cost(rig: &mut Rig) -> Result<Cost> {
    let fed = Beside {
        statuses: true,
        ..Beside::default()
    };
    let mut cost = Cost {
        dispatch: Paired::default(),
        ingest: Paired::default(),
        cpu: (Vec::new(), Vec::new()),
    };
    for round in 0..COST_ROUNDS {
        for watched in paired::order(round) {
            let beside = if watched { fed } else { Beside::default() };
            let run = dispatch_with(rig, beside).await?;
            cost.dispatch.push(watched, run.rate);
            let cores = cores_of(&run);
            if watched {
                cost.cpu.1.push(cores);
            } else {
                cost.cpu.0.push(cores);
            }
            cost.ingest
                .push(watched, ingest_with(rig, watched).await?.0);
        }
    }
    Ok(cost)
}

/// The cores each process used during a dispatch figure, as its record holds them.
fn cores_of(run: &crate::central_figures::Dispatched) -> serde_json::Value {
    run.record
        .details
        .get("cpu_cores")
        .cloned()
        .unwrap_or_default()
}

/// Send -> SMTP 250 -> Delivered at the site's WatchStatus, for Sends at the e2e rate.
async fn status_latency(rig: &mut Rig) -> Result<(Percentiles, serde_json::Value)> {
    let Running {
        _dir,
        central_db,
        sink,
        mut central,
        site,
    } = site_and_central(rig, "site-status").await?;

    let arrived: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut watch = SiteNotifyClient::new(site.connect().await?)
        .watch_status(v1::WatchStatusRequest {
            all: true,
            ..Default::default()
        })
        .await
        .context("WatchStatus")?
        .into_inner();
    let watcher = tokio::spawn({
        let arrived = Arc::clone(&arrived);
        async move {
            while let Ok(Some(view)) = watch.message().await {
                if view.status == i32::from(v1::NotificationStatus::Delivered) {
                    let mut arrived = arrived.lock().unwrap_or_else(|e| e.into_inner());
                    arrived
                        .entry(view.notification_id)
                        .or_insert_with(Instant::now);
                }
            }
        }
    });

    let clients = site_clients(&site, 4).await?;
    // Warm-up: the streams and the SMTP connections open, the site's watch at central started.
    let warm_up = 5;
    for _ in 0..warm_up {
        send_once(clients[0].clone())
            .await
            .map_err(anyhow::Error::msg)?;
    }
    wait_for_deliveries(&sink, &mut central, warm_up, STATUS_DEADLINE).await?;
    let sizes = rig.sizes.clone();
    let sends = load::open_loop(clients, sizes.e2e_rate, sizes.e2e_duration, send_once).await;
    if sends.errors > 0 {
        bail!(
            "{} Sends failed; first: {}",
            sends.errors,
            sends.first_error.as_deref().unwrap_or("?")
        );
    }
    let expected = warm_up + sends.samples.len() as u64;
    wait_for_deliveries(&sink, &mut central, expected, STATUS_DEADLINE).await?;
    let ids: Vec<String> = sends.samples.iter().map(|s| s.value.clone()).collect();
    let started = Instant::now();
    loop {
        let have = {
            let arrived = arrived.lock().unwrap_or_else(|e| e.into_inner());
            ids.iter().filter(|id| arrived.contains_key(*id)).count()
        };
        if have == ids.len() {
            break;
        }
        if started.elapsed() > STATUS_DEADLINE {
            bail!(
                "{have} of {} final statuses reached the site within {STATUS_DEADLINE:?}",
                ids.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    watcher.abort();
    site.stop().await?;
    let sessions = rig.backend.sessions_of(central.pid());
    let central_log = central.stop().await?;
    central_db.finish(&sessions).await;
    sink.stop();

    let relayed: HashMap<String, Instant> = sink
        .receipts()
        .into_iter()
        .filter_map(|r| Some((id_of(r.message_id.as_deref()?)?.to_string(), r.at)))
        .collect();
    let arrived = arrived.lock().unwrap_or_else(|e| e.into_inner());
    let mut latencies = Vec::with_capacity(ids.len());
    for id in &ids {
        let (Some(relayed), Some(known)) = (relayed.get(id), arrived.get(id)) else {
            bail!("{id}: no SMTP receipt or no status at the site");
        };
        latencies.push(known.saturating_duration_since(*relayed));
    }
    Ok((
        Percentiles::of(latencies),
        json!({
            "offered_per_s": sizes.e2e_rate,
            "notifications": ids.len(),
            "central_log": log_json(&central_log),
        }),
    ))
}

/// This process taking a site's final statuses from central, as its site-forwarder would.
pub(crate) struct Consuming {
    taken: Arc<AtomicU64>,
    task: JoinHandle<Result<()>>,
}

impl Consuming {
    /// Opens WatchSiteStatus for [`SITE_ID`] on `central` and confirms each batch it gets.
    pub(crate) async fn start(central: &Service) -> Result<Self> {
        let channel = central.connect().await?;
        let (confirm, outbound) = mpsc::channel(4);
        confirm
            .send(v1::SiteStatusWatchMessage {
                message: Some(WatchMessage::WatchSiteId(SITE_ID.into())),
            })
            .await
            .context("opening WatchSiteStatus")?;
        let mut inbound = NotificationIngestClient::new(channel)
            .watch_site_status(ReceiverStream::new(outbound))
            .await
            .context("WatchSiteStatus")?
            .into_inner();
        let taken = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let taken = Arc::clone(&taken);
            async move {
                while let Some(batch) = inbound.message().await.context("the status stream")? {
                    taken.fetch_add(batch.changes.len() as u64, Ordering::Relaxed);
                    let stored = v1::SiteStatusWatchMessage {
                        message: Some(WatchMessage::StoredBatch(batch.batch)),
                    };
                    if confirm.send(stored).await.is_err() {
                        break;
                    }
                }
                Ok(())
            }
        });
        Ok(Self { taken, task })
    }

    /// Waits until `n` statuses were taken (or `deadline`), then stops; returns how many.
    pub(crate) async fn finish(self, n: u64, deadline: Duration) -> Result<u64> {
        let started = Instant::now();
        while self.taken.load(Ordering::Relaxed) < n && started.elapsed() < deadline {
            if self.task.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let taken = self.taken.load(Ordering::Relaxed);
        if self.task.is_finished() {
            self.task.await.context("the status consumer")??;
        } else {
            self.task.abort();
        }
        if taken < n {
            bail!("{taken} of {n} final statuses taken from central within {deadline:?}");
        }
        Ok(taken)
    }
}
