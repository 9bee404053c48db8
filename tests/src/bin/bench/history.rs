//! A year of history (issue 37): whether the hot path keeps its speed when central's table
//! holds the seeds' 365 days of terminal rows. The dispatch, ingest and idle end-to-end
//! figures run as they do alone, twice on an empty database and twice on a copy of one holding
//! `sizes.history_rows` Delivered rows with their attempt rows (written directly, see
//! `fixtures`), in the order empty, history, history, empty; each is reported as the ratio of
//! the sums with/without (`paired`; for the latency without/with, so that higher is better
//! everywhere).
//!
//! The purge figure is the dispatch figure on the history again, with central's
//! `terminal_retention` set so that its purge (which starts when central becomes leader) has
//! the oldest fifth of the history to delete, at most [`PURGE_ROWS`], while the rows are
//! dispatched: the ratio of its mean to the dispatch's on the history alone, and the longest the
//! SMTP sink went without a message meanwhile.
//!
//! The cold figure is the dispatch figure on the history with central's database dropped from
//! the kernel's page cache first (as after a restart of the machine), against the empty
//! table's. After the rounds, `history_reads` times what operators read on the history.
//!
//! On MS SQL (`--database`) the server writes the history into each database that starts with
//! it (`mssql_history`); the cold and purge figures are SQLite's (a file in the kernel's cache,
//! and a count of the file's purgeable rows) and do not run there.

use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;

use crate::backend::Backend;
use crate::central_figures::{Beside, dispatch_with, ingest_with};
use crate::history_reads::{self, Reads};
use crate::paired::{self, Paired};
use crate::report::RunRecord;
use crate::rig::Rig;

/// The most terminal rows the purge figure deletes (the figure).
const PURGE_ROWS: u64 = 1_000_000;
/// The span the history fixture spreads its rows over (`fixtures::CentralRows::YearOfHistory`).
const HISTORY_SPAN: Duration = Duration::from_secs(365 * 24 * 3600);

pub(crate) async fn history(rig: &mut Rig) -> Result<RunRecord> {
    let fixture = rig.set_history(false)?;
    let measured = measure(rig).await;
    let reads = match measured {
        Ok(_) => {
            rig.set_history(true)?;
            Some(history_reads::reads(rig).await)
        }
        Err(_) => None,
    };
    // Whatever happened, the figures after this one start empty again.
    rig.set_history(false)?;
    let m = measured?;
    let reads: Reads = reads.context("the reads on the history did not run")??;
    let record = RunRecord::new()
        .value("history.dispatch_ratio", m.dispatch.ratio())
        .value("history.ingest_ratio", m.ingest.ratio())
        .value("history.e2e_p99_ratio", m.e2e_p99.inverse_ratio())
        .value("history.dispatch_rate", m.dispatch.mean_with())
        .value("history.kpis_p99", reads.kpis.p99)
        .value("history.console_list_p99", reads.pages.worst_p99)
        .value("history.central_rss", reads.memory.rss_mib());
    let record = if m.file_figures {
        record
            .value("history.cold_dispatch_ratio", m.cold_ratio())
            .value("history.purge_dispatch_ratio", m.purge_ratio())
            .value(
                "history.purge_longest_gap_ms",
                m.purge_gap.as_secs_f64() * 1000.0,
            )
    } else {
        record
    };
    Ok(record
        .detail("history_rows", json!(rig.sizes.history_rows))
        .detail("history_file_bytes", json!(fixture.bytes))
        .detail("history_build_seconds", json!(fixture.build_seconds))
        .detail(
            "dispatch_per_s",
            json!({
                "empty": m.dispatch.without,
                "history": m.dispatch.with,
                "history_cold": m.cold,
                "purging": m.purging,
            }),
        )
        .detail(
            "ingest_per_s",
            json!({"empty": m.ingest.without, "history": m.ingest.with}),
        )
        .detail(
            "e2e_p99_ms",
            json!({"empty": m.e2e_p99.without, "history": m.e2e_p99.with}),
        )
        .detail("purge_runs", json!(m.purge_runs))
        .detail("reads", reads.to_json()))
}

/// Each figure's runs without and with the history (`paired`: empty, history, history,
/// empty), and the dispatches on the history out of the kernel's cache and while purging (with
/// the longest of the purging runs' gaps: a stall is not averaged away).
struct Measured {
    /// Whether the cold and the purge figures ran (SQLite only; see [`measure`]).
    file_figures: bool,
    dispatch: Paired,
    ingest: Paired,
    e2e_p99: Paired,
    cold: Vec<f64>,
    purging: Vec<f64>,
    purge_gap: Duration,
    purge_runs: Vec<serde_json::Value>,
}

impl Measured {
    /// The cold dispatches' mean over the empty table's.
    fn cold_ratio(&self) -> f64 {
        paired::sum(&self.cold) / self.cold.len().max(1) as f64 / self.dispatch.mean_without()
    }

    /// The purging dispatches' mean over the history's (the same database, without a purge).
    fn purge_ratio(&self) -> f64 {
        paired::sum(&self.purging) / self.purging.len().max(1) as f64 / self.dispatch.mean_with()
    }
}

/// Rounds of the empty and history figures (`paired::order`).
const ROUNDS: usize = 2;

async fn measure(rig: &mut Rig) -> Result<Measured> {
    // The cold figure drops a file from the kernel's cache, and the purge figure counts the
    // purgeable rows in the file: on MS SQL the server keeps both to itself.
    let file_figures = matches!(rig.backend, Backend::Sqlite);
    let mut m = Measured {
        file_figures,
        dispatch: Paired::default(),
        ingest: Paired::default(),
        e2e_p99: Paired::default(),
        cold: Vec::new(),
        purging: Vec::new(),
        purge_gap: Duration::ZERO,
        purge_runs: Vec::new(),
    };
    let history_rows = rig.sizes.history_rows.max(1);
    let purged = PURGE_ROWS.min(history_rows / 5);
    // The rows are spread evenly over the span, so keeping all but the oldest `purged` of them
    // keeps that fraction of the span.
    let retention = HISTORY_SPAN.mul_f64(1.0 - purged as f64 / history_rows as f64);
    for round in 0..ROUNDS {
        for with_history in paired::order(round) {
            rig.set_history(with_history)?;
            let rate = dispatch_with(rig, Beside::default()).await?.rate;
            m.dispatch.push(with_history, rate);
            m.ingest
                .push(with_history, ingest_with(rig, false).await?.0);
            let e2e = crate::e2e::e2e(rig).await?;
            let p99 = e2e
                .values
                .get("e2e.p99")
                .copied()
                .context("the e2e figure has no p99")?;
            m.e2e_p99.push(with_history, p99);
        }
        if !file_figures {
            continue;
        }
        rig.set_history(true)?;
        let cold = Beside {
            cold: true,
            ..Beside::default()
        };
        m.cold.push(dispatch_with(rig, cold).await?.rate);
        let purging = dispatch_with(
            rig,
            Beside {
                retention: Some(retention),
                ..Beside::default()
            },
        )
        .await?;
        m.purging.push(purging.rate);
        m.purge_gap = m.purge_gap.max(purging.longest_gap);
        m.purge_runs.push(json!({
            "rate": purging.rate,
            "details": purging.record.details,
        }));
    }
    Ok(m)
}
