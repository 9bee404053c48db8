//! The `first-minute` figure: delivery latency in the first minute after central starts (issue
//! 26, item 5). Central starts alone on a new, migrated database (on MS SQL no connection of
//! central's has run a statement yet: a leader right after a start or a failover), and from the
//! moment it serves, one notification every 200 ms is submitted to it directly
//! (SubmitNotification, as a site's forwarder would) for `--first-minute-seconds` (default 60).
//! Each notification's `DeliveredAt − CreatedAt` (both as central stored them, read back with
//! GetNotificationStatus) is its latency; the figure is p50 and p99 over all of them, target
//! p99 ≤ 50 ms, and the run prints the first dozen in order, where a warm-up tail shows.
//!
//! On Babelfish every new connection used to pay for its backend's cold caches on its first
//! statements (seconds; see `central-outbox/src/store/mssql/warm.rs`), and the first dozen
//! deliveries after a start took 0.1-1.8 s. SQLite has no such cost; there the figure is a
//! reference.
//!
//! Every submit and delivery waits for a durable commit, so a stall of the disk shows in the
//! tail whatever central does: on the virtual disk this was measured on, a 4 KiB fsync now and
//! then takes 50 ms to 1 s. The run times one every 50 ms on the same disk while it submits
//! and reports them beside the figure, so a tail can be told from a disk stall.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use outbox_proto::v1;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use outbox_proto::v1::notification_outbox_client::NotificationOutboxClient;
use outbox_tests::smtp_sink::SmtpSink;
use serde_json::json;
use tonic::transport::Channel;

use crate::central_figures::{log_json, submit, wait_for_deliveries};
use crate::load::{self, Percentiles};
use crate::proc_stats::{CpuWindow, FsyncWatch, own_pid};
use crate::report::RunRecord;
use crate::rig::Rig;
use crate::services::{self, Service};

/// One notification every 200 ms, as the issue measured it.
const RATE_PER_S: f64 = 5.0;
/// Longest the last notification may take after its submit: only bounds how long a run that
/// lost one waits before failing.
const DELIVERY_DEADLINE: Duration = Duration::from_secs(60);
/// Latencies printed in submit order, where a warm-up tail would be.
const SHOWN: usize = 12;

pub(crate) async fn first_minute(rig: &mut Rig) -> Result<RunRecord> {
    let dir = rig.run_dir("first-minute")?;
    let central_db = rig.central_db(dir.path()).await?;
    let sink = SmtpSink::start().await?;
    sink.discard_messages(true);
    // The latencies are read back through the admin API, without credentials: loopback only.
    let toml = format!(
        "{}\n[auth]\nmode = \"none\"\n",
        services::central_toml(services::free_addr()?, &central_db.url(), sink.addr())
    );
    let mut central = Service::central(&rig.bins, dir.path(), "central", &toml).await?;
    let cpu = CpuWindow::start(&[("central", central.pid()), ("bench", own_pid())])
        .with_server(central.pid(), rig.backend.server_port());

    let ingest = NotificationIngestClient::new(central.connect().await?);
    let duration = rig.sizes.first_minute;
    // The disk under the run: its stalls show in every durable commit's time (see the module).
    let disk = FsyncWatch::start(dir.path());
    let submits = load::open_loop(vec![ingest], RATE_PER_S, duration, submit_once).await;
    let disk = disk.finish();
    if submits.errors > 0 {
        bail!(
            "{} submits failed; first: {}",
            submits.errors,
            submits.first_error.as_deref().unwrap_or("?")
        );
    }
    let expected = submits.samples.len() as u64;
    let delivered = wait_for_deliveries(&sink, &mut central, expected, DELIVERY_DEADLINE).await?;
    if delivered < expected {
        bail!("{delivered} of {expected} notifications delivered within {DELIVERY_DEADLINE:?}");
    }
    let cores = cpu.cores();

    let mut outbox = NotificationOutboxClient::new(central.connect().await?);
    let mut latencies = Vec::with_capacity(submits.samples.len());
    for sample in &submits.samples {
        latencies.push(stored_latency(&mut outbox, &sample.value).await?);
    }
    let sessions = rig.backend.sessions_of(central.pid());
    let central_log = central.stop().await?;
    central_db.finish(&sessions).await;
    sink.stop();

    let first: Vec<f64> = latencies
        .iter()
        .take(SHOWN)
        .map(|d| d.as_secs_f64() * 1e3)
        .collect();
    eprintln!(
        "bench: first-minute: first {} latencies (ms, in submit order): {}",
        first.len(),
        first
            .iter()
            .map(|ms| format!("{ms:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let ms = |key: &str| disk[key].as_f64().unwrap_or(f64::NAN);
    eprintln!(
        "bench: first-minute: 4 KiB fsync on the same disk every 50 ms meanwhile: p99 {:.1} ms, \
         max {:.0} ms, {} over 50 ms",
        ms("p99_ms"),
        ms("max_ms"),
        disk["over_50_ms"]
    );
    let all = Percentiles::of(latencies);
    let submit_ack = Percentiles::of(submits.samples.iter().map(|s| s.done - s.due).collect());
    Ok(RunRecord::new()
        .value("first_minute.p50", all.p50)
        .value("first_minute.p99", all.p99)
        .value("first_minute.max", all.max)
        .detail("latency", all.to_json())
        .detail("first_latencies_ms", json!(first))
        .detail("submit_ack_latency", submit_ack.to_json())
        .detail("disk_fsync_during", disk)
        .detail("offered_per_s", json!(RATE_PER_S))
        .detail("central_log", log_json(&central_log))
        .cpu(cores))
}

/// One notification; its id once ACCEPTED.
async fn submit_once(mut client: NotificationIngestClient<Channel>) -> Result<String, String> {
    let submit = submit();
    let id = submit.notification_id.clone();
    let ack = client
        .submit_notification(submit)
        .await
        .map_err(|status| format!("SubmitNotification: {status}"))?
        .into_inner();
    match ack.outcome() {
        v1::SubmitOutcome::Accepted => Ok(id),
        other => Err(format!("SubmitNotification: {other:?}: {}", ack.reason)),
    }
}

/// `DeliveredAt − CreatedAt` of notification `id`, as central stored them.
async fn stored_latency(
    outbox: &mut NotificationOutboxClient<Channel>,
    id: &str,
) -> Result<Duration> {
    let view = outbox
        .get_notification_status(v1::GetNotificationStatusRequest {
            notification_id: id.to_string(),
        })
        .await
        .with_context(|| format!("GetNotificationStatus {id}"))?
        .into_inner();
    // Nanoseconds since the epoch; stored at millisecond precision on MS SQL.
    let created = view
        .created_at
        .as_ref()
        .map(|t| i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos));
    let delivered = view
        .delivered_at
        .as_ref()
        .map(|t| i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos));
    match (created, delivered) {
        (Some(created), Some(delivered)) => Ok(Duration::from_nanos(
            u64::try_from(delivered - created).unwrap_or(0),
        )),
        _ => bail!("notification {id} has no CreatedAt or DeliveredAt"),
    }
}
