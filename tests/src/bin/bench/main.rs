//! `bench` (run by `make bench`): measures the site-forwarder and central-outbox release
//! binaries end to end on loopback and prints one table of figures against their targets (each
//! figure and how it is measured: BENCHMARKS.md, "The figures"), and writes the same as JSON.
//!
//! Each figure group starts fresh processes on fresh copies of prepared database files, runs
//! `--runs` times and reports the median with the min–max. The services always run with their
//! durable defaults (WAL, `synchronous=FULL`) on a real disk under `--work-dir`. Timing never
//! decides pass or fail anywhere else; here a missed target is reported, not an error. The exit
//! status is non-zero only when a figure could not be measured (a component failed to start,
//! crashed, or answered with errors), and the message names the step.
//!
//! Central runs on SQLite unless `--database` names an MS SQL server (see [`backend`]); the
//! table's heading and the JSON's `central_database` say which. With `--tls` every gRPC hop
//! that crosses the network in a deployment (site -> central, clients -> central) runs over
//! mutual TLS with a CA made at start (see [`services`]); the heading and the JSON's `grpc_tls`
//! say so.

mod backend;
mod central_figures;
mod console;
mod e2e;
mod escalation;
mod failover;
mod first_minute;
mod fixtures;
mod fresh;
mod history;
mod history_reads;
mod load;
mod loopback;
mod memory;
mod mssql_history;
mod paired;
mod proc_stats;
mod report;
mod rig;
mod round_trips;
mod services;
mod site_figures;
mod site_status;
mod standby;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::json;

use backend::Backend;
use report::{GroupResult, GroupStatus, Metric, RunRecord, Target};
use rig::{Rig, Sizes};

#[derive(Debug, Parser)]
#[command(
    name = "bench",
    about = "Benchmark the notification outbox end to end (see BENCHMARKS.md)"
)]
struct Args {
    /// Figure groups to run, comma-separated (default: all): send, send-latency, standby,
    /// forward, ingest, dispatch, loopback, rtt, e2e, first-minute, fresh, memory, console,
    /// escalation, failover, site-status, history.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Figure groups to leave out, comma-separated.
    #[arg(long, value_delimiter = ',')]
    skip: Vec<String>,
    /// Small sizes and one run per figure, for iterating (the figures then do not compare with
    /// the targets).
    #[arg(long)]
    quick: bool,
    /// Runs per figure (default 3; 1 with --quick).
    #[arg(long)]
    runs: Option<usize>,
    /// Seconds of load before measuring starts, in the throughput and Send latency figures.
    #[arg(long)]
    warmup: Option<f64>,
    /// Seconds measured, in the throughput and Send latency figures (default 5; 2 with --quick).
    #[arg(long)]
    measure: Option<f64>,
    /// Concurrent callers (each on its own connection) in the closed-loop figures.
    #[arg(long, default_value_t = 64)]
    callers: usize,
    /// Offered Sends per second in the Send latency figure.
    #[arg(long, default_value_t = 5000.0)]
    send_rate: f64,
    /// Backlog drained in the forwarding figure (default 200000; 20000 with --quick).
    #[arg(long)]
    forward_rows: Option<u64>,
    /// Pending rows delivered in the dispatch figure (default 10000; 2000 with --quick).
    #[arg(long)]
    dispatch_rows: Option<u64>,
    /// Longest a dispatch run waits for its deliveries, in seconds; if not all arrived, the
    /// rate is taken over those that did (and the run says so).
    #[arg(long, default_value_t = 30.0)]
    dispatch_deadline: f64,
    /// Messages each side sends in the `loopback` figure (Postfix's smtp-source -d, then
    /// central's dispatch, to Postfix's smtp-sink; default 20000, 4000 with --quick).
    #[arg(long)]
    loopback_rows: Option<u64>,
    /// Rows delivered at each round trip of the `rtt` figure, as seconds of delivery at the
    /// pipelined floor (default 3, i.e. 6,000 rows at 1 ms and 600 at 10 ms; 1 with --quick).
    #[arg(long)]
    rtt_seconds: Option<f64>,
    /// Offered Sends per second in the end-to-end latency figure: low, so the path is measured
    /// idle, not queueing.
    #[arg(long, default_value_t = 5.0)]
    e2e_rate: f64,
    /// Seconds of Sends in the end-to-end latency figure (default 20; 8 with --quick).
    #[arg(long)]
    e2e_seconds: Option<f64>,
    /// Seconds of submits after central starts in the `first-minute` figure, one every 200 ms
    /// (default 60; 15 with --quick).
    #[arg(long)]
    first_minute_seconds: Option<f64>,
    /// Rows held by central and by the site in the memory figure (default 1000000; 100000 with
    /// --quick).
    #[arg(long)]
    memory_rows: Option<u64>,
    /// Delivered rows (each with its attempt) in the `history` figures' database (default
    /// 5000000; 200000 with --quick).
    #[arg(long)]
    history_rows: Option<u64>,
    /// Notifications of one site waiting at central in the `fresh` figure (default 20000; 2000
    /// with --quick).
    #[arg(long)]
    fresh_backlog: Option<u64>,
    /// The relay's limit in the `fresh` figure (central's `[smtp] rate_limit_per_second`).
    #[arg(long, default_value_t = 100.0)]
    fresh_rate_limit: f64,
    /// Its burst (`[smtp] rate_limit_burst`; default one second's worth, central's default).
    #[arg(long)]
    fresh_burst: Option<u32>,
    /// Seconds the fresh streams submit in the `fresh` figure, one notification a second each
    /// (default 100; 10 with --quick). The backlog must last longer at the rate limit.
    #[arg(long)]
    fresh_seconds: Option<f64>,
    /// Runs of `fresh` that also measure the same load in plain oldest-first order (the first
    /// ones; default 1: those waits are set by the backlog and the rate limit, about
    /// backlog / rate each, not by noise, and one takes that long).
    #[arg(long)]
    fresh_baseline_runs: Option<usize>,
    /// Where the JSON results go.
    #[arg(long, default_value = "target/bench/results.json")]
    json: PathBuf,
    /// Where databases and logs are written: on a real disk (not tmpfs), or fsync costs nothing
    /// and the figures mean little.
    #[arg(long, default_value = "target/bench/work")]
    work_dir: PathBuf,
    /// Directory with the central-outbox and site-forwarder binaries to measure (default: built
    /// from the current sources next to bench).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Keep every run's directory (databases, configs, logs) for inspection.
    #[arg(long)]
    keep: bool,
    /// Run central on MS SQL Server instead of SQLite. URL names a server and a login that may
    /// CREATE DATABASE, as
    /// `server=tcp:HOST,PORT;user id=USER;password=PASSWORD;database=master;TrustServerCertificate=true`
    /// or `mssql://USER:PASSWORD@HOST:PORT/master?trust_server_certificate=true`. Every central process gets a new empty database there
    /// (outbox_test_*), dropped when it stops. On MS SQL: ingest, dispatch, e2e, fresh and
    /// forward run (the site's buffer is SQLite either way); send, send-latency and standby do
    /// not involve central and run as without it; memory is skipped, with the reason printed
    /// (its central fixture is a bulk-written SQLite file). The password is never printed or
    /// written to the results (the command line is recorded with the URL replaced).
    #[arg(
        long,
        value_name = "URL",
        env = "OUTBOX_BENCH_DATABASE",
        hide_env_values = true
    )]
    database: Option<String>,
    /// Mutual TLS on central's port: a throwaway CA and certificates are made at start, central
    /// requires client certificates, the site forwards over https:// with one, and the bench's
    /// clients of central (ingest, health) present one. Run the same figures with and without
    /// it to see the cost. The site's SiteNotify port stays plaintext loopback, as deployed, so
    /// the Send figures only change by what the site's forwarder does meanwhile (nothing: its
    /// central is down in those figures).
    #[arg(long)]
    tls: bool,
}

/// Every figure group, in the order they run.
const GROUPS: [&str; 17] = [
    "send",
    "send-latency",
    "standby",
    "forward",
    "ingest",
    "dispatch",
    "loopback",
    "rtt",
    "e2e",
    "first-minute",
    "fresh",
    "memory",
    "console",
    "escalation",
    "failover",
    "site-status",
    "history",
];

impl Args {
    fn sizes(&self) -> Sizes {
        let quick = self.quick;
        let pick = |given: Option<f64>, full: f64, small: f64| {
            Duration::from_secs_f64(given.unwrap_or(if quick { small } else { full }))
        };
        let runs = self.runs.unwrap_or(if quick { 1 } else { 3 }).max(1);
        Sizes {
            runs,
            warmup: pick(self.warmup, 1.0, 0.5),
            measure: pick(self.measure, 5.0, 2.0),
            callers: self.callers.max(1),
            send_rate: self.send_rate,
            forward_rows: self
                .forward_rows
                .unwrap_or(if quick { 20_000 } else { 200_000 }),
            dispatch_rows: self
                .dispatch_rows
                .unwrap_or(if quick { 2_000 } else { 10_000 }),
            dispatch_deadline: Duration::from_secs_f64(self.dispatch_deadline),
            loopback_rows: self
                .loopback_rows
                .unwrap_or(if quick { 4_000 } else { 20_000 }),
            rtt_seconds: self
                .rtt_seconds
                .unwrap_or(if quick { 1.0 } else { 3.0 })
                .max(0.0),
            e2e_rate: self.e2e_rate,
            e2e_duration: pick(self.e2e_seconds, 20.0, 8.0),
            first_minute: pick(self.first_minute_seconds, 60.0, 15.0),
            memory_rows: self
                .memory_rows
                .unwrap_or(if quick { 100_000 } else { 1_000_000 }),
            fresh_backlog: self
                .fresh_backlog
                .unwrap_or(if quick { 2_000 } else { 20_000 }),
            fresh_rate_limit: self.fresh_rate_limit,
            fresh_burst: self
                .fresh_burst
                .unwrap_or(self.fresh_rate_limit.ceil().max(1.0) as u32),
            fresh_duration: pick(self.fresh_seconds, 100.0, 10.0),
            fresh_baseline_runs: self.fresh_baseline_runs.unwrap_or(1),
            history_rows: self
                .history_rows
                .unwrap_or(if quick { 200_000 } else { 5_000_000 }),
            failover_hung: !quick,
        }
    }

    fn selected(&self) -> Result<Vec<&'static str>> {
        for name in self.only.iter().chain(&self.skip) {
            if !GROUPS.contains(&name.as_str()) {
                anyhow::bail!(
                    "unknown figure group {name:?}; known: {}",
                    GROUPS.join(", ")
                );
            }
        }
        Ok(GROUPS
            .into_iter()
            .filter(|g| self.only.is_empty() || self.only.iter().any(|o| o == g))
            .filter(|g| !self.skip.iter().any(|s| s == g))
            .collect())
    }
}

/// The table's rows, labelled with the sizes in force, and those that involve central with its
/// database when that is not SQLite (so a table copied without its heading still says so).
fn metrics(s: &Sizes, backend: &Backend) -> Vec<Metric> {
    let rows = |n: u64| report::number(n as f64);
    let m = |key: &'static str, label: String, unit, target| {
        let involves_central =
            !(key.starts_with("send") || key.starts_with("standby") || key == "memory.site_rss");
        let label = if involves_central && backend.is_mssql() {
            format!("{label} [central on MS SQL]")
        } else {
            label
        };
        Metric {
            key,
            label,
            unit,
            target,
        }
    };
    let mut table = vec![
        m(
            "send.rate",
            format!("site Send, {} callers (closed loop)", s.callers),
            "/s",
            Some(Target::AtLeast(10_000.0)),
        ),
        m(
            "send_latency.p50",
            format!(
                "site Send latency p50 at {}/s offered",
                rows(s.send_rate as u64)
            ),
            "ms",
            Some(Target::AtMost(2.0)),
        ),
        m(
            "send_latency.p99",
            format!(
                "site Send latency p99 at {}/s offered",
                rows(s.send_rate as u64)
            ),
            "ms",
            Some(Target::AtMost(10.0)),
        ),
        m(
            "standby.ratio",
            "site Send with a standby on the same 2 cores / alone".into(),
            "x",
            Some(Target::AtLeast(0.9)),
        ),
        m(
            "standby.active_cpu_per_send",
            "  active's CPU per Send, with a standby / alone".into(),
            "x",
            None,
        ),
        m(
            "standby.rate",
            format!("  site Send with a standby, {} callers", s.callers),
            "/s",
            None,
        ),
        m(
            "standby.alone_rate",
            "  site Send alone (same run)".into(),
            "/s",
            None,
        ),
        m(
            "standby.p99",
            format!(
                "site Send latency p99 with a standby at {}/s offered",
                rows(s.send_rate as u64)
            ),
            "ms",
            Some(Target::AtMost(10.0)),
        ),
        m(
            "standby.lag_rows_max",
            "standby lag under closed-loop Sends, max".into(),
            "rows",
            None,
        ),
        m(
            "standby.lag_ms_p99",
            "standby lag under closed-loop Sends, p99".into(),
            "ms",
            None,
        ),
        m(
            "forward.rate",
            format!(
                "site -> central forwarding, {} backlog",
                rows(s.forward_rows)
            ),
            "/s",
            Some(Target::AtLeast(20_000.0)),
        ),
        m(
            "ingest.rate",
            format!("central SubmitNotification, {} clients", s.callers),
            "/s",
            Some(Target::AtLeast(5_000.0)),
        ),
        m(
            "dispatch.rate",
            format!("dispatch to local SMTP, {} rows", rows(s.dispatch_rows)),
            "/s",
            Some(Target::AtLeast(2_000.0)),
        ),
        m(
            "loopback.ratio",
            format!(
                "dispatch / Postfix smtp-source -d to Postfix smtp-sink, {} msgs, {} conns",
                rows(s.loopback_rows),
                round_trips::SMTP_CONNECTIONS
            ),
            "x",
            Some(Target::AtLeast(loopback::TARGET_RATIO)),
        ),
        m(
            "loopback.central_rate",
            "  central dispatch to smtp-sink (same run)".into(),
            "/s",
            None,
        ),
        m(
            "loopback.source_rate",
            "  smtp-source -d, central's message and recipients (same run)".into(),
            "/s",
            None,
        ),
        m(
            "loopback.central_cpu_us",
            "  central CPU per delivery".into(),
            "µs",
            None,
        ),
        m(
            "loopback.source_cpu_us",
            "  smtp-source CPU per message".into(),
            "µs",
            None,
        ),
    ];
    for rt in round_trips::ROUND_TRIPS {
        table.extend([
            m(
                rt.rate_key,
                format!(
                    "dispatch over a {} ms round trip, {} rows, {} SMTP connections",
                    rt.ms,
                    rows(rt.rows(s.rtt_seconds)),
                    round_trips::SMTP_CONNECTIONS
                ),
                "/s",
                None,
            ),
            m(
                rt.share_key,
                format!(
                    "  share of the pipelined floor ({} / (2 waits × {} ms) = {}/s)",
                    round_trips::SMTP_CONNECTIONS,
                    rt.ms,
                    report::number(rt.floor())
                ),
                "x",
                Some(Target::AtLeast(round_trips::TARGET_SHARE)),
            ),
            m(
                rt.waits_key,
                "  waits per message at the relay (pipelined: 2)".into(),
                "waits",
                None,
            ),
        ]);
    }
    table.extend([
        m(
            "e2e.p50",
            format!("idle end-to-end Send -> SMTP p50 at {}/s", s.e2e_rate),
            "ms",
            Some(Target::AtMost(15.0)),
        ),
        m(
            "e2e.p99",
            format!("idle end-to-end Send -> SMTP p99 at {}/s", s.e2e_rate),
            "ms",
            Some(Target::AtMost(50.0)),
        ),
        m(
            "first_minute.p50",
            format!(
                "delivery in the first {} s after a start, 5/s: DeliveredAt − CreatedAt p50",
                s.first_minute.as_secs_f64()
            ),
            "ms",
            None,
        ),
        m(
            "first_minute.p99",
            "  DeliveredAt − CreatedAt p99".into(),
            "ms",
            Some(Target::AtMost(50.0)),
        ),
        m(
            "first_minute.max",
            "  DeliveredAt − CreatedAt max".into(),
            "ms",
            None,
        ),
        m(
            "fresh.site_b.p50",
            format!(
                "fresh under {} backlog at {}/s: site B, normal, wait p50",
                rows(s.fresh_backlog),
                report::number(s.fresh_rate_limit)
            ),
            "ms",
            None,
        ),
        m(
            "fresh.site_b.p99",
            "  site B, normal, wait p99".into(),
            "ms",
            Some(Target::AtMost(1000.0)),
        ),
        m(
            "fresh.critical.p50",
            "  backlog's site, critical, wait p50".into(),
            "ms",
            None,
        ),
        m(
            "fresh.critical.p99",
            "  backlog's site, critical, wait p99".into(),
            "ms",
            Some(Target::AtMost(1000.0)),
        ),
        m(
            "fresh.oldest_first.p50",
            "  same load, plain oldest-first order: wait p50".into(),
            "s",
            None,
        ),
        m(
            "fresh.oldest_first.p99",
            "  same load, plain oldest-first order: wait p99".into(),
            "s",
            None,
        ),
        m(
            "memory.central_rss",
            format!("central RSS holding {} rows", rows(s.memory_rows)),
            "MiB",
            Some(Target::AtMost(150.0)),
        ),
        m(
            "memory.site_rss",
            format!("site RSS holding {} buffered", rows(s.memory_rows)),
            "MiB",
            Some(Target::AtMost(80.0)),
        ),
        m(
            "send_full.ratio",
            format!("Send rate, {} buffered / empty", rows(s.memory_rows)),
            "x",
            Some(Target::AtLeast(0.9)),
        ),
        m(
            "send_full.rate",
            format!("  site Send with {} buffered", rows(s.memory_rows)),
            "/s",
            None,
        ),
        m(
            "send_full.empty_rate",
            "  site Send, empty buffer (same runs)".into(),
            "/s",
            None,
        ),
        m(
            "console.list_p99",
            format!(
                "console list page with {} rows, p99 (worst filter)",
                rows(s.memory_rows)
            ),
            "ms",
            Some(Target::AtMost(100.0)),
        ),
        m(
            "console.deep_p99",
            format!("  pages 1-{} by next-page links, p99", console::DEEP_PAGES),
            "ms",
            Some(Target::AtMost(100.0)),
        ),
        m(
            "console.tiles_p50",
            "  dashboard (tiles and site health) p50".into(),
            "ms",
            None,
        ),
        m(
            "console.tiles_p99",
            "  dashboard (tiles and site health) p99".into(),
            "ms",
            None,
        ),
        m(
            "escalation.step_error_p99",
            format!(
                "escalation: a page's fired time − its due time, p99, {} incidents open",
                rows(escalation::BACKGROUND as u64)
            ),
            "ms",
            Some(Target::AtMost(2000.0)),
        ),
        m(
            "escalation.ack_p99",
            "  AcknowledgeIncident (the escalation stopped, unsent pages ended), p99".into(),
            "ms",
            Some(Target::AtMost(1000.0)),
        ),
        m(
            "failover.to_fallback_s",
            format!(
                "email channel to its fallback relay, the first refusing connections, {}/s alarms",
                failover::RATE
            ),
            "s",
            Some(Target::AtMost(60.0)),
        ),
        m(
            "failover.back_s",
            "  back on the first relay once it listens again (probed every 30 s)".into(),
            "s",
            None,
        ),
        m(
            "site_status.p50",
            format!(
                "final status at the site's WatchStatus after the relay's 250, p50 at {}/s",
                s.e2e_rate
            ),
            "ms",
            None,
        ),
        m(
            "site_status.p99",
            "  p99".into(),
            "ms",
            Some(Target::AtMost(100.0)),
        ),
        m(
            "site_status.dispatch_ratio",
            "  dispatch with the statuses going back / without".into(),
            "",
            Some(Target::AtLeast(0.95)),
        ),
        m(
            "site_status.ingest_ratio",
            "  ingest with the site watching / without".into(),
            "",
            Some(Target::AtLeast(0.95)),
        ),
        m(
            "history.dispatch_ratio",
            format!(
                "dispatch with {} terminal rows (and attempts) / empty",
                rows(s.history_rows)
            ),
            "",
            Some(Target::AtLeast(0.9)),
        ),
        m(
            "history.dispatch_rate",
            "  dispatch with them".into(),
            "/s",
            None,
        ),
        m(
            "history.cold_dispatch_ratio",
            "  dispatch with them out of the kernel's page cache / empty".into(),
            "",
            Some(Target::AtLeast(0.9)),
        ),
        m(
            "history.ingest_ratio",
            "  ingest with them / empty".into(),
            "",
            Some(Target::AtLeast(0.9)),
        ),
        m(
            "history.e2e_p99_ratio",
            "  idle end-to-end p99, empty / with them".into(),
            "",
            Some(Target::AtLeast(0.9)),
        ),
        m(
            "history.kpis_p99",
            "  GetKpis computed fresh with them, p99".into(),
            "ms",
            Some(Target::AtMost(10.0)),
        ),
        m(
            "history.console_list_p99",
            "  console list pages with them, p99 (worst filter, pages 1-20)".into(),
            "ms",
            Some(Target::AtMost(100.0)),
        ),
        m(
            "history.central_rss",
            "  central RSS after answering them".into(),
            "MiB",
            Some(Target::AtMost(150.0)),
        ),
        m(
            "failover.hung_s",
            "  to the fallback, the first accepting connections but never answering".into(),
            "s",
            None,
        ),
    ]);
    table
}

async fn run_once(group: &str, rig: &mut Rig) -> Result<RunRecord> {
    match group {
        "send" => site_figures::send_rate(rig).await,
        "send-latency" => site_figures::send_latency(rig).await,
        "standby" => standby::standby(rig).await,
        "forward" => site_figures::forward(rig).await,
        "ingest" => central_figures::ingest(rig).await,
        "dispatch" => central_figures::dispatch(rig).await,
        "loopback" => loopback::loopback(rig).await,
        "rtt" => round_trips::rtt(rig).await,
        "e2e" => e2e::e2e(rig).await,
        "first-minute" => first_minute::first_minute(rig).await,
        "fresh" => fresh::fresh(rig).await,
        "memory" => memory::memory(rig).await,
        "console" => console::console(rig).await,
        "escalation" => escalation::escalation(rig).await,
        "failover" => failover::failover(rig).await,
        "site-status" => site_status::site_status(rig).await,
        "history" => history::history(rig).await,
        other => anyhow::bail!("unknown figure group {other:?}"),
    }
}

async fn run_group(group: &'static str, rig: &mut Rig) -> GroupResult {
    let runs = rig.sizes.runs;
    let started = Instant::now();
    if let Some(why) = rig.backend.unsupported(group) {
        eprintln!("bench: {group}: skipped: {why}");
        return GroupResult {
            name: group,
            runs: Vec::new(),
            status: GroupStatus::Skipped(why.to_string()),
            seconds: 0.0,
        };
    }
    let mut records = Vec::new();
    let mut status = GroupStatus::Done;
    for run in 1..=runs {
        eprintln!("bench: {group}: run {run} of {runs}");
        match run_once(group, rig).await {
            Ok(record) => {
                let values: Vec<String> = record
                    .values
                    .iter()
                    .map(|(k, v)| format!("{k} = {}", report::number(*v)))
                    .collect();
                eprintln!("bench: {group}: run {run}: {}", values.join(", "));
                records.push(record);
            }
            Err(error) => {
                eprintln!("bench: {group}: FAILED: {error:#}");
                status = GroupStatus::Failed(format!("run {run}: {error:#}"));
                break;
            }
        }
    }
    GroupResult {
        name: group,
        runs: records,
        status,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// The configs as written for a run (addresses, paths and databases vary per run; an MS SQL
/// connection string holds a password, so it is never written here).
fn configs_json(backend: &Backend, sizes: &Sizes) -> serde_json::Value {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let db = match backend {
        Backend::Sqlite => "sqlite://<run dir>/central.db".to_string(),
        Backend::MsSql { .. } => {
            "<the --database connection string, with Database=<a new outbox_test_* database>>"
                .to_string()
        }
    };
    json!({
        "central": services::central_toml(addr, &db, addr),
        "central_fresh": services::central_toml_with_smtp(
            addr,
            &db,
            addr,
            &services::smtp_rate_limit(sizes.fresh_rate_limit, sizes.fresh_burst),
        ),
        "site": services::site_toml(addr, Path::new("<run dir>/site.db"), addr),
        "note": "keys not written are at the service's defaults; durability is never set, so \
                 both services run WAL + synchronous=FULL",
    })
}

/// How the gRPC hops to central ran, for the heading.
fn grpc_transport(tls: bool) -> &'static str {
    if tls {
        "mutual TLS to central (site -> central, bench -> central); SiteNotify plaintext loopback"
    } else {
        "plaintext"
    }
}

/// A command line (`args`, this process's) for the results, with the value of `--database`
/// (which holds a password) replaced by a description of the server.
fn recorded_command(args: impl IntoIterator<Item = String>, backend: &Backend) -> Vec<String> {
    let mut command = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--database" {
            command.push(arg);
            if args.next().is_some() {
                command.push(format!("<{}>", backend.describe()));
            }
        } else if arg.starts_with("--database=") {
            command.push(format!("--database=<{}>", backend.describe()));
        } else {
            command.push(arg);
        }
    }
    command
}

async fn run(args: Args) -> Result<bool> {
    let sizes = args.sizes();
    let groups = args.selected()?;
    let backend = Backend::from_arg(args.database.as_deref())?;
    let bins = services::Binaries::locate(args.bin_dir.as_deref())?;
    std::fs::create_dir_all(&args.work_dir)
        .with_context(|| format!("creating {}", args.work_dir.display()))?;
    // Outlives every service (they read their certificates at start); removed at the end.
    let tls_dir = if args.tls {
        let dir = tempfile::Builder::new()
            .prefix("tls-")
            .tempdir_in(&args.work_dir)
            .context("creating the certificate directory")?;
        services::enable_tls(dir.path())?;
        Some(dir)
    } else {
        None
    };
    let mut machine = proc_stats::machine(&args.work_dir);
    machine["fsync_before"] = proc_stats::fsync_probe(&args.work_dir);
    let started = Instant::now();
    eprintln!(
        "bench: {} cores, commit {}, groups: {}; central on {}; gRPC {}",
        machine["cores"],
        machine["git_commit"].as_str().unwrap_or("unknown"),
        groups.join(", "),
        backend.describe(),
        grpc_transport(args.tls),
    );
    let mut rig = Rig::prepare(
        bins,
        sizes.clone(),
        backend.clone(),
        args.work_dir.clone(),
        args.keep,
    )
    .await
    .context("preparing the empty databases")?;
    let mut results = Vec::new();
    for group in groups {
        results.push(run_group(group, &mut rig).await);
    }
    rig.finish();
    drop(tls_dir);
    machine["fsync_after"] = proc_stats::fsync_probe(&args.work_dir);

    let left_behind = backend::left_behind();
    let mut central_database = backend.to_json();
    central_database["left_behind"] = json!(left_behind);
    let metrics = metrics(&sizes, &backend);
    let header = json!({
        "generated_at": chrono::Utc::now().to_rfc3339(),
        "command": recorded_command(std::env::args(), &backend),
        "total_seconds": started.elapsed().as_secs_f64(),
        "machine": machine,
        "central_database": central_database,
        "grpc_tls": args.tls,
        "sizes": sizes.to_json(),
        "configs": configs_json(&backend, &sizes),
    });
    let document = report::to_json(header, &metrics, &results);
    println!();
    println!(
        "notification outbox benchmark: {} cores ({}), commit {}{}, {}",
        document["machine"]["cores"],
        document["machine"]["cpu_model"]
            .as_str()
            .unwrap_or("cpu unknown"),
        document["machine"]["git_commit"]
            .as_str()
            .map(|c| c.get(..10).unwrap_or(c))
            .unwrap_or("unknown"),
        if document["machine"]["git_tracked_changes"] == json!(true) {
            " (with uncommitted changes)"
        } else {
            ""
        },
        document["generated_at"].as_str().unwrap_or(""),
    );
    let fsync = |key: &str| {
        let probe = &document["machine"][key];
        match (probe["p50_ms"].as_f64(), probe["p99_ms"].as_f64()) {
            (Some(p50), Some(p99)) => format!("p50 {p50:.2} ms, p99 {p99:.2} ms"),
            _ => "unknown".to_string(),
        }
    };
    println!("central database: {}", backend.describe());
    println!("gRPC: {}", grpc_transport(args.tls));
    println!(
        "median of {} runs (fresh oldest-first: {}); work dir on {}; 4 KiB fsync before: {}, \
         after: {}\n",
        sizes.runs,
        sizes.fresh_baseline_runs.min(sizes.runs),
        document["machine"]["work_dir_filesystem"]
            .as_str()
            .unwrap_or("unknown fs"),
        fsync("fsync_before"),
        fsync("fsync_after"),
    );
    print!("{}", report::render(&metrics, &results));
    if !left_behind.is_empty() {
        println!(
            "\nWARNING: {} database(s) the bench created on the MS SQL server could not be \
             dropped (see above); drop them with DROP DATABASE: {}",
            left_behind.len(),
            left_behind.join(", ")
        );
    }
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&document)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    println!(
        "\nJSON: {} (total {:.0} s)",
        args.json.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(results
        .iter()
        .all(|g| !matches!(g.status, GroupStatus::Failed(_))))
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("bench: some figures could not be measured (see above)");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_command_holds_no_password() {
        let url = "server=tcp:db.test,1433;user id=u;password=s3cret;database=master";
        let backend = Backend::from_arg(Some(url)).unwrap();
        for args in [
            vec!["bench", "--database", url, "--quick"],
            vec!["bench", &format!("--database={url}"), "--quick"],
        ] {
            let recorded = recorded_command(args.into_iter().map(String::from), &backend);
            let text = recorded.join(" ");
            assert!(!text.contains("s3cret"), "{text}");
            assert!(text.contains("db.test:1433"), "{text}");
            assert_eq!(recorded.last().map(String::as_str), Some("--quick"));
        }
    }
}
