//! Central's figures: unary ingest throughput (closed loop), and dispatch throughput to the
//! in-process SMTP sink.
//!
//! Ingest runs central as a replica that does not hold the dispatcher lease (another holder is
//! written into `Leases` first), so the figure is ingest alone: nothing is claimed or delivered
//! while it runs. Dispatch starts central on a database that already holds the rows, so the
//! figure is the dispatcher alone, timed by the sink's receive times from the first message to
//! the last. Both run on whichever backend `--database` chose (see [`crate::backend`]).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Result, bail};
use chrono::Utc;
use outbox_proto::time::to_timestamp;
use outbox_proto::v1;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use outbox_tests::smtp_sink::SmtpSink;
use serde_json::json;

use crate::fixtures::{self, SOURCE_INSTANCE, SOURCE_SCRIPT};
use crate::load::{self, Window};
use crate::proc_stats::{CpuWindow, flush_disk, own_pid};
use crate::report::RunRecord;
use crate::rig::Rig;
use crate::services::{self, LIST, SITE_ID, Service};

static SUBMIT_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A submit as a site-forwarder makes it, with a fresh id.
pub(crate) fn submit() -> v1::NotificationSubmit {
    submit_as(SITE_ID, v1::NotificationPriority::Normal)
}

/// A submit as the forwarder of site `site` makes it, with a fresh id, at `priority`.
pub(crate) fn submit_as(site: &str, priority: v1::NotificationPriority) -> v1::NotificationSubmit {
    let (subject, body) = fixtures::content(SUBMIT_COUNTER.fetch_add(1, Ordering::Relaxed));
    v1::NotificationSubmit {
        notification_id: uuid::Uuid::now_v7().to_string(),
        r#type: v1::NotificationType::Email.into(),
        list_name: LIST.into(),
        subject,
        body,
        type_data: String::new(),
        source_site_id: site.into(),
        source_instance_id: SOURCE_INSTANCE.into(),
        source_script: SOURCE_SCRIPT.into(),
        site_enqueued_at: Some(to_timestamp(Utc::now())),
        origin_execution_id: Some(uuid::Uuid::new_v4().to_string()),
        origin_parent_execution_id: None,
        priority: priority.into(),
        condition_key: String::new(),
        cleared_at_site: None,
        deliver_after: None,
    }
}

/// Figure 4: SubmitNotification calls per second from `callers` concurrent clients.
pub(crate) async fn ingest(rig: &mut Rig) -> Result<RunRecord> {
    Ok(ingest_with(rig, false).await?.1)
}

/// The ingest figure; with `statuses`, the submitting site watches its final statuses (as a
/// site-forwarder does), so every insert passes the feed's trigger with a watch to look up.
/// Returns the rate with the record.
pub(crate) async fn ingest_with(rig: &mut Rig, statuses: bool) -> Result<(f64, RunRecord)> {
    let dir = rig.run_dir("ingest")?;
    let db = rig.central_db(dir.path()).await?;
    db.hold_dispatcher_lease().await?;
    if statuses {
        db.watch_site_status(SITE_ID).await?;
    }
    let toml = services::central_toml(services::free_addr()?, &db.url(), services::free_addr()?);
    let central = Service::central(&rig.bins, dir.path(), "central", &toml).await?;
    let clients: Vec<_> = central
        .connections(rig.sizes.callers)
        .await?
        .into_iter()
        .map(NotificationIngestClient::new)
        .collect();
    let window = Window {
        warmup: rig.sizes.warmup,
        measure: rig.sizes.measure,
    };
    flush_disk();
    let cpu = CpuWindow::start(&[("central", central.pid()), ("bench", own_pid())])
        .with_server(central.pid(), rig.backend.server_port());
    let result = load::closed_loop(clients, window, |mut client| async move {
        let ack = client
            .submit_notification(submit())
            .await
            .map_err(|status| format!("SubmitNotification: {status}"))?
            .into_inner();
        match ack.outcome() {
            v1::SubmitOutcome::Accepted => Ok(()),
            other => Err(format!("SubmitNotification: {other:?}: {}", ack.reason)),
        }
    })
    .await;
    let cores = cpu.cores();
    let sessions = rig.backend.sessions_of(central.pid());
    let central_log = central.stop().await?;
    db.finish(&sessions).await;
    if result.errors > 0 {
        bail!(
            "{} submits failed; first: {}",
            result.errors,
            result.first_error.as_deref().unwrap_or("?")
        );
    }
    let record = RunRecord::new();
    let record = if statuses {
        record
    } else {
        record.value("ingest.rate", result.rate)
    };
    Ok((
        result.rate,
        record
            .detail("closed_loop", result.to_json())
            .detail("central_log", log_json(&central_log))
            .cpu(cores),
    ))
}

/// Figure 5: central starts on `rows` Pending notifications and delivers them to the sink;
/// deliveries per second between the first and the last message the sink received.
pub(crate) async fn dispatch(rig: &mut Rig) -> Result<RunRecord> {
    Ok(dispatch_with(rig, Beside::default()).await?.record)
}

/// What central does beside the deliveries of a dispatch figure.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Beside {
    /// The rows' site watches its final statuses and this process takes them from central
    /// meanwhile, as the site-forwarder would (`crate::site_status`).
    pub statuses: bool,
    /// Central runs with this `terminal_retention`, so that its purge deletes the database's
    /// terminal rows resolved before then during the figure.
    pub retention: Option<Duration>,
    /// Central starts with its database out of the kernel's page cache
    /// (`CentralDb::evict_from_kernel_cache`).
    pub cold: bool,
}

/// A dispatch figure's rate and record, and the longest the sink went without a message.
pub(crate) struct Dispatched {
    pub rate: f64,
    pub longest_gap: Duration,
    pub record: RunRecord,
}

/// The dispatch figure, with what `beside` asks for running next to it.
pub(crate) async fn dispatch_with(rig: &mut Rig, beside: Beside) -> Result<Dispatched> {
    let rows = rig.sizes.dispatch_rows;
    if rows < 2 {
        bail!("the dispatch figure needs at least 2 rows");
    }
    let dir = rig.run_dir("dispatch")?;
    let db = rig.central_db(dir.path()).await?;
    db.add_pending_rows(rows).await?;
    let sink = SmtpSink::start().await?;
    sink.discard_messages(true);
    if beside.statuses {
        db.watch_site_status(SITE_ID).await?;
    }
    let mut toml = services::central_toml(services::free_addr()?, &db.url(), sink.addr());
    let purgeable = match beside.retention {
        Some(retention) => {
            toml.push_str(&services::retention_toml(retention));
            Some(db.terminal_rows_before(retention)?)
        }
        None => None,
    };
    flush_disk();
    if beside.cold {
        db.evict_from_kernel_cache()?;
    }
    let mut central = Service::central(&rig.bins, dir.path(), "central", &toml).await?;
    let consuming = if beside.statuses {
        Some(crate::site_status::Consuming::start(&central).await?)
    } else {
        None
    };
    let cpu = CpuWindow::start(&[("central", central.pid()), ("bench", own_pid())])
        .with_server(central.pid(), rig.backend.server_port());
    let deadline = rig.sizes.dispatch_deadline;
    let received = wait_for_deliveries(&sink, &mut central, rows, deadline).await?;
    let cores = cpu.cores();
    // Read before central stops: how many of the rows its purge was to delete are still there
    // (none left would mean the purge ended before the figure did, and the figure would be
    // partly without it).
    let purge_left = match beside.retention {
        Some(retention) => Some(db.terminal_rows_before(retention)?),
        None => None,
    };
    let statuses_taken = match consuming {
        Some(consuming) => Some(consuming.finish(rows, Duration::from_secs(60)).await?),
        None => None,
    };
    let sessions = rig.backend.sessions_of(central.pid());
    let central_log = central.stop().await?;
    db.finish(&sessions).await;
    sink.stop();
    let receipts = sink.receipts();
    let (Some(first), Some(last)) = (receipts.first(), receipts.last()) else {
        bail!("no message reached the SMTP sink within {deadline:?}");
    };
    if received < rows {
        eprintln!(
            "bench: dispatch: only {received} of {rows} delivered within {deadline:?}; the \
             rate is over those"
        );
    }
    let span = (last.at - first.at).as_secs_f64();
    if span <= 0.0 {
        bail!("all {received} deliveries arrived at the same instant");
    }
    let distinct: HashSet<_> = receipts.iter().map(|r| &r.message_id).collect();
    // N messages span N-1 intervals.
    let rate = (receipts.len() - 1) as f64 / span;
    let longest_gap = receipts
        .windows(2)
        .map(|pair| pair[1].at.saturating_duration_since(pair[0].at))
        .max()
        .unwrap_or_default();
    let mut record = RunRecord::new();
    record = match statuses_taken {
        Some(taken) => record.detail("final_statuses_taken", json!(taken)),
        None if beside.retention.is_some() => record,
        None => record.value("dispatch.rate", rate),
    };
    if let (Some(before), Some(left)) = (purgeable, purge_left) {
        if left == 0 {
            eprintln!(
                "bench: dispatch: the purge ended before the dispatch did; the figure is \
                 partly without it"
            );
        }
        record = record.detail(
            "purge_rows",
            json!({"before": before, "left_at_last_delivery": left}),
        );
    }
    let record = record
        .detail("rows", json!(rows))
        .detail("delivered", json!(receipts.len()))
        .detail("duplicate_messages", json!(receipts.len() - distinct.len()))
        .detail("first_to_last_seconds", json!(span))
        .detail("longest_gap_ms", json!(longest_gap.as_secs_f64() * 1000.0))
        .detail("smtp_sessions_max", json!(sink.max_concurrent_sessions()))
        .detail("central_log", log_json(&central_log))
        .cpu(cores);
    Ok(Dispatched {
        rate,
        longest_gap,
        record,
    })
}

/// A service's warnings and errors for the JSON: how many, and the first few.
pub(crate) fn log_json(lines: &[String]) -> serde_json::Value {
    json!({
        "warnings_and_errors": lines.len(),
        "first": lines.iter().take(5).collect::<Vec<_>>(),
    })
}

/// Waits until the sink has `n` messages or `deadline` passes, checking that central is alive;
/// returns how many arrived.
pub(crate) async fn wait_for_deliveries(
    sink: &SmtpSink,
    central: &mut Service,
    n: u64,
    deadline: Duration,
) -> Result<u64> {
    let until = tokio::time::Instant::now() + deadline;
    let n = usize::try_from(n).unwrap_or(usize::MAX);
    loop {
        let count = sink.wait_for_count(n, Duration::from_millis(500)).await;
        if count >= n || tokio::time::Instant::now() >= until {
            return Ok(count as u64);
        }
        central.check_alive()?;
    }
}
