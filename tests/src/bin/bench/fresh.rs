//! Fresh under backlog: how long a fresh notification waits while one site's backlog drains
//! through a rate-limited relay, in central's serve order (priority, then turns across sites:
//! central's `domain::serve_order`) and, as the baseline, in plain oldest-first order.
//!
//! The workload. Central starts on `fresh_backlog` Pending notifications of site A
//! ([`SITE_ID`], normal, due at once; written directly on SQLite, through central's own store
//! on MS SQL, see [`crate::backend`]) with its `[smtp]` limited to `fresh_rate_limit` messages
//! a second (burst `fresh_burst`). Once the drain runs at the relay's pace (the sink has the
//! burst plus one second's worth), two paced streams submit straight to central with unary
//! `SubmitNotification`, as a site's forwarder would, one notification a second each, half a
//! second apart, for `fresh_duration`:
//!
//! - serve order: site B ([`OTHER_SITE_ID`]) normal, and site A critical;
//! - oldest first: both streams normal from site A itself. Central's order then degenerates to
//!   exactly the old one (one queue per channel by due time, whatever the site or priority):
//!   site A's fresh rows get turns after its whole backlog, and the longest-waiting share takes
//!   the backlog's rows too. Same binary, same load shape; only who sends at what priority
//!   differs.
//!
//! Wait = from when a submit was due at the bench (the open loop's due time, so a stall of the
//! bench itself counts too) to when the in-process SMTP sink received the message whose
//! Message-ID carries its id; both instants on this process's monotonic clock. Each order runs
//! on a fresh central and ends once every fresh notification has arrived: the serve-order
//! measurement does not wait for the rest of the backlog, the oldest-first one by its nature
//! waits for nearly all of it (about backlog / rate: 200 s at full size). So only the first
//! `fresh_baseline_runs` runs (default 1) measure the baseline: its waits are set by the
//! backlog and the rate, not by noise.
//!
//! A run fails rather than report a figure of another workload when a submit is not ACCEPTED,
//! a fresh notification is not delivered within the deadline (sized from the backlog and the
//! rate), or the backlog had drained before the last fresh notification was submitted.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_proto::v1;
use outbox_proto::v1::NotificationPriority;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use outbox_tests::smtp_sink::SmtpSink;
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::central_figures::{log_json, submit_as, wait_for_deliveries};
use crate::e2e::id_of;
use crate::load::{self, Percentiles};
use crate::proc_stats::{CpuWindow, flush_disk, own_pid};
use crate::report::RunRecord;
use crate::rig::{Rig, Sizes};
use crate::services::{self, OTHER_SITE_ID, SITE_ID, Service};

/// Notifications a second each fresh stream submits: one, as the figure is stated.
const STREAM_RATE: f64 = 1.0;
/// Longest central may take to start draining the backlog (its start and first claims).
const DRAIN_START_DEADLINE: Duration = Duration::from_secs(60);
/// How often the sink's receipts are searched for the fresh notifications. Only how soon the
/// bench notices that the last one arrived; each wait is taken from the sink's own receipt
/// time, whenever it is looked at.
const POLL: Duration = Duration::from_millis(200);

/// The order a measurement shows, by the shape of the fresh load (central is the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Serve,
    OldestFirst,
}

/// One paced stream of fresh notifications.
#[derive(Debug, Clone, Copy)]
struct Stream {
    /// Its key in the JSON.
    name: &'static str,
    site: &'static str,
    priority: NotificationPriority,
}

impl Order {
    fn name(self) -> &'static str {
        match self {
            Order::Serve => "serve_order",
            Order::OldestFirst => "oldest_first",
        }
    }

    fn streams(self) -> [Stream; 2] {
        match self {
            Order::Serve => [
                Stream {
                    name: "site_b",
                    site: OTHER_SITE_ID,
                    priority: NotificationPriority::Normal,
                },
                Stream {
                    name: "critical",
                    site: SITE_ID,
                    priority: NotificationPriority::Critical,
                },
            ],
            // In place of those two, at the same instants: normal rows of the backlog's own
            // site, which central serves after all of its older rows.
            Order::OldestFirst => [
                Stream {
                    name: "in_place_of_site_b",
                    site: SITE_ID,
                    priority: NotificationPriority::Normal,
                },
                Stream {
                    name: "in_place_of_critical",
                    site: SITE_ID,
                    priority: NotificationPriority::Normal,
                },
            ],
        }
    }
}

/// What one order's measurement found.
struct Measured {
    /// Waits of each stream, in [`Order::streams`] order.
    streams: Vec<Percentiles>,
    /// Waits of both streams together.
    all: Percentiles,
    cores: BTreeMap<String, f64>,
    json: Value,
}

/// One run of the figure group: the serve order, then (in the first `fresh_baseline_runs` runs)
/// the oldest-first baseline.
pub(crate) async fn fresh(rig: &mut Rig) -> Result<RunRecord> {
    let sizes = rig.sizes.clone();
    check_sizes(&sizes)?;
    let run = rig.next_fresh_run();
    let serve = measure(rig, Order::Serve)
        .await
        .context("fresh notifications in serve order")?;
    let mut cores = serve.cores.clone();
    let mut record = RunRecord::new()
        .value("fresh.site_b.p50", serve.streams[0].p50)
        .value("fresh.site_b.p99", serve.streams[0].p99)
        .value("fresh.critical.p50", serve.streams[1].p50)
        .value("fresh.critical.p99", serve.streams[1].p99)
        .detail(
            "workload",
            json!({
                "backlog": sizes.fresh_backlog,
                "backlog_site": SITE_ID,
                "rate_limit_per_second": sizes.fresh_rate_limit,
                "rate_limit_burst": sizes.fresh_burst,
                "fresh_seconds": sizes.fresh_duration.as_secs_f64(),
                "per_stream_per_s": STREAM_RATE,
            }),
        )
        .detail("serve_order", serve.json);
    if run < sizes.fresh_baseline_runs {
        let oldest = measure(rig, Order::OldestFirst)
            .await
            .context("fresh notifications in oldest-first order")?;
        // Both measurements' windows: for each process the larger, so a disturbance in
        // either shows in the report's warning.
        cores = larger_of(&cores, &oldest.cores);
        record = record
            // Seconds: these waits are the backlog's length at the relay's rate.
            .value("fresh.oldest_first.p50", oldest.all.p50 / 1000.0)
            .value("fresh.oldest_first.p99", oldest.all.p99 / 1000.0)
            .detail("oldest_first", oldest.json);
    }
    Ok(record.cpu(cores))
}

/// Fails early when the backlog would drain before the fresh streams end.
fn check_sizes(s: &Sizes) -> Result<()> {
    if s.fresh_rate_limit <= 0.0 || s.fresh_burst == 0 {
        bail!("the fresh figure needs a positive rate limit and burst");
    }
    let before = drain_under_way(s) as f64;
    let during = s.fresh_rate_limit * s.fresh_duration.as_secs_f64();
    if (s.fresh_backlog as f64) <= before + during {
        bail!(
            "a backlog of {} drains in {:.0} s at {}/s, not enough for {:.0} s of fresh \
             notifications after the first {before} messages; raise --fresh-backlog or lower \
             --fresh-seconds",
            s.fresh_backlog,
            s.fresh_backlog as f64 / s.fresh_rate_limit,
            s.fresh_rate_limit,
            s.fresh_duration.as_secs_f64()
        );
    }
    Ok(())
}

/// Messages the sink has once the drain runs at the relay's pace: the burst spent and one
/// second at the limit. Fresh notifications go in only then, so none is served from the
/// start-up burst.
fn drain_under_way(s: &Sizes) -> u64 {
    u64::from(s.fresh_burst) + s.fresh_rate_limit.ceil() as u64
}

async fn measure(rig: &mut Rig, order: Order) -> Result<Measured> {
    let s = rig.sizes.clone();
    let dir = rig.run_dir(&format!("fresh-{}", order.name()))?;
    let db = rig.central_db(dir.path()).await?;
    db.add_pending_rows(s.fresh_backlog)
        .await
        .context("writing the backlog")?;
    let sink = SmtpSink::start().await.context("starting the SMTP sink")?;
    sink.discard_messages(true);
    let toml = services::central_toml_with_smtp(
        services::free_addr()?,
        &db.url(),
        sink.addr(),
        &services::smtp_rate_limit(s.fresh_rate_limit, s.fresh_burst),
    );
    flush_disk();
    let mut central = Service::central(&rig.bins, dir.path(), "central", &toml).await?;
    let streams = order.streams();
    let mut clients = Vec::with_capacity(streams.len());
    for stream in streams {
        let channel = central
            .connect_as(stream.site)
            .await
            .with_context(|| format!("connecting to central as {}", stream.site))?;
        clients.push((NotificationIngestClient::new(channel), stream));
    }

    let under_way = drain_under_way(&s);
    let drained = wait_for_deliveries(&sink, &mut central, under_way, DRAIN_START_DEADLINE).await?;
    if drained < under_way {
        bail!(
            "the backlog's drain did not get going: {drained} of the first {under_way} messages \
             within {DRAIN_START_DEADLINE:?}"
        );
    }

    let cpu = CpuWindow::start(&[("central", central.pid()), ("bench", own_pid())])
        .with_server(central.pid(), rig.backend.server_port());
    let window_started = Instant::now();
    // Round-robin over the two streams at twice the stream rate: each stream one a second,
    // the two half a second apart.
    let sends = load::open_loop(
        clients,
        STREAM_RATE * streams.len() as f64,
        s.fresh_duration,
        submit_once,
    )
    .await;
    if sends.errors > 0 {
        bail!(
            "{} of the fresh submits failed; first: {}",
            sends.errors,
            sends.first_error.as_deref().unwrap_or("?")
        );
    }
    let Some(last_due) = sends.samples.last().map(|sample| sample.due) else {
        bail!("no fresh notification was submitted");
    };
    let fresh: HashSet<String> = sends.samples.iter().map(|x| x.value.1.clone()).collect();
    // Every row, backlog and fresh, at the relay's rate, half again, plus central's start:
    // time enough for the last fresh one even if it queues behind the whole backlog.
    let total = s.fresh_backlog + fresh.len() as u64;
    let deadline = Duration::from_secs_f64(total as f64 / s.fresh_rate_limit * 1.5 + 30.0);
    let arrived = wait_for_fresh(&sink, &mut central, &fresh, deadline).await?;
    let cores = cpu.cores();
    let measured_seconds = window_started.elapsed().as_secs_f64();
    let sessions = rig.backend.sessions_of(central.pid());
    let central_log = central.stop().await?;
    db.finish(&sessions).await;
    sink.stop();

    if arrived.len() < fresh.len() {
        bail!(
            "{} of {} fresh notifications were not delivered within {deadline:?} of the last \
             submit",
            fresh.len() - arrived.len(),
            fresh.len()
        );
    }
    let receipts = sink.receipts();
    let is_fresh = |message_id: &Option<String>| {
        message_id
            .as_deref()
            .and_then(id_of)
            .is_some_and(|id| fresh.contains(id))
    };
    // The figure is about waiting under a backlog: some of it must still have been waiting
    // when the last fresh notification went in.
    let backlog_delivered_by_last_submit = receipts
        .iter()
        .filter(|r| r.at <= last_due && !is_fresh(&r.message_id))
        .count() as u64;
    let backlog_waiting = s
        .fresh_backlog
        .saturating_sub(backlog_delivered_by_last_submit);
    if backlog_waiting == 0 {
        bail!(
            "the backlog of {} had drained before the last fresh notification was submitted; \
             raise --fresh-backlog or lower --fresh-seconds",
            s.fresh_backlog
        );
    }
    // The relay's pace while the fresh notifications went in: the limit, if central kept the
    // channel busy.
    let submit_span = last_due.saturating_duration_since(window_started);
    let delivered_while_submitting = receipts
        .iter()
        .filter(|r| r.at >= window_started && r.at <= last_due)
        .count();
    let distinct: HashSet<_> = receipts.iter().map(|r| &r.message_id).collect();

    let mut per_stream: Vec<Vec<Duration>> = vec![Vec::new(); streams.len()];
    let mut acks = Vec::with_capacity(sends.samples.len());
    for sample in &sends.samples {
        let (stream, id) = &sample.value;
        let index = streams
            .iter()
            .position(|x| x.name == stream.name)
            .unwrap_or_default();
        // Present: every id was checked above.
        if let Some(at) = arrived.get(id) {
            per_stream[index].push(at.saturating_duration_since(sample.due));
        }
        acks.push(sample.done - sample.due);
    }
    let all = Percentiles::of(per_stream.concat());
    let waits: Vec<Percentiles> = per_stream.into_iter().map(Percentiles::of).collect();
    let stream_json: serde_json::Map<String, Value> = streams
        .iter()
        .zip(&waits)
        .map(|(stream, wait)| {
            (
                stream.name.to_string(),
                json!({
                    "source_site_id": stream.site,
                    "priority": stream.priority.as_str_name(),
                    "wait": wait.to_json(),
                }),
            )
        })
        .collect();
    let json = json!({
        "streams": stream_json,
        "wait_all": all.to_json(),
        "submit_ack": Percentiles::of(acks).to_json(),
        "max_send_lag_ms": sends.max_send_lag.as_secs_f64() * 1000.0,
        "backlog_waiting_at_last_submit": backlog_waiting,
        "delivered_per_s_while_submitting":
            delivered_while_submitting as f64 / submit_span.as_secs_f64().max(1e-6),
        "messages": receipts.len(),
        "duplicate_messages": receipts.len() - distinct.len(),
        "measured_seconds": measured_seconds,
        "central_log": log_json(&central_log),
        "cpu_cores": cores,
    });
    Ok(Measured {
        streams: waits,
        all,
        cores,
        json,
    })
}

/// One fresh notification of `stream`; the stream and the notification's id once ACCEPTED.
async fn submit_once(
    (mut client, stream): (NotificationIngestClient<Channel>, Stream),
) -> Result<(Stream, String), String> {
    let submit = submit_as(stream.site, stream.priority);
    let id = submit.notification_id.clone();
    let ack = client
        .submit_notification(submit)
        .await
        .map_err(|status| format!("SubmitNotification as {}: {status}", stream.site))?
        .into_inner();
    match ack.outcome() {
        v1::SubmitOutcome::Accepted => Ok((stream, id)),
        other => Err(format!(
            "SubmitNotification as {}: {other:?}: {}",
            stream.site, ack.reason
        )),
    }
}

/// When the sink received each of the `fresh` notifications, waiting until all have arrived or
/// `deadline` has passed (then with those that did), checking that central is alive.
async fn wait_for_fresh(
    sink: &SmtpSink,
    central: &mut Service,
    fresh: &HashSet<String>,
    deadline: Duration,
) -> Result<HashMap<String, Instant>> {
    let until = Instant::now() + deadline;
    let mut arrived = HashMap::with_capacity(fresh.len());
    // Receipts only ever grow, in arrival order: each look reads only the new ones.
    let mut seen = 0;
    let mut poll = tokio::time::interval(POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        poll.tick().await;
        let receipts = sink.receipts();
        for receipt in receipts.get(seen..).unwrap_or_default() {
            if let Some(id) = receipt.message_id.as_deref().and_then(id_of)
                && fresh.contains(id)
            {
                arrived.insert(id.to_string(), receipt.at);
            }
        }
        seen = receipts.len();
        if arrived.len() == fresh.len() || Instant::now() >= until {
            return Ok(arrived);
        }
        central.check_alive()?;
    }
}

/// Per process, the larger of two measurements' cores busy.
fn larger_of(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    let mut out = a.clone();
    for (process, cores) in b {
        let entry = out.entry(process.clone()).or_insert(*cores);
        *entry = entry.max(*cores);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_larger_cores_per_process_are_kept() {
        let a = BTreeMap::from([("central".to_string(), 0.5), ("other".to_string(), 0.1)]);
        let b = BTreeMap::from([("central".to_string(), 0.2), ("other".to_string(), 0.3)]);
        let both = larger_of(&a, &b);
        assert_eq!(both["central"], 0.5);
        assert_eq!(both["other"], 0.3);
    }

    #[test]
    fn oldest_first_sends_only_normal_rows_of_the_backlog_site() {
        for stream in Order::OldestFirst.streams() {
            assert_eq!(stream.site, SITE_ID);
            assert_eq!(stream.priority, NotificationPriority::Normal);
        }
        let serve = Order::Serve.streams();
        assert_eq!(serve[0].site, OTHER_SITE_ID);
        assert_eq!(serve[1].priority, NotificationPriority::Critical);
    }
}
