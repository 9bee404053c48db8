//! A year of history (issue 37): whether the hot path keeps its speed when central's table
//! holds the seeds' 365 days of terminal rows. The dispatch, ingest and idle end-to-end
//! figures run as they do alone, once on an empty database and once on a copy of one holding
//! `sizes.history_rows` Delivered rows with their attempt rows (written directly, see
//! `fixtures`), interleaved, best of two each; each is reported as the ratio with/without
//! (for the latency, without/with, so that higher is better everywhere).
//!
//! The purge figure is the dispatch figure on the history again, with central's
//! `terminal_retention` set so that its purge (which starts when central becomes leader) has
//! the oldest fifth of the history to delete, at most [`PURGE_ROWS`], while the rows are
//! dispatched: its ratio to the dispatch on the history alone, and the longest the SMTP sink
//! went without a message meanwhile.
//!
//! The cold figure is the dispatch figure on the history with central's database dropped from
//! the kernel's page cache first (as after a restart of the machine), against the empty
//! table's. After the rounds, `history_reads` times what operators read on the history.

use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;

use crate::central_figures::{Beside, dispatch_with, ingest_with};
use crate::history_reads::{self, Reads};
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
    Ok(RunRecord::new()
        .value("history.dispatch_ratio", m.dispatch[1] / m.dispatch[0])
        .value("history.ingest_ratio", m.ingest[1] / m.ingest[0])
        .value("history.e2e_p99_ratio", m.e2e_p99[0] / m.e2e_p99[1])
        .value("history.dispatch_rate", m.dispatch[1])
        .value("history.cold_dispatch_ratio", m.cold / m.dispatch[0])
        .value("history.kpis_p99", reads.kpis.p99)
        .value("history.console_list_p99", reads.pages.worst_p99)
        .value("history.central_rss", reads.memory.rss_mib())
        .value("history.purge_dispatch_ratio", m.purging / m.dispatch[1])
        .value(
            "history.purge_longest_gap_ms",
            m.purge_gap.as_secs_f64() * 1000.0,
        )
        .detail("history_rows", json!(rig.sizes.history_rows))
        .detail("history_file_bytes", json!(fixture.bytes))
        .detail("history_build_seconds", json!(fixture.build_seconds))
        .detail(
            "dispatch_per_s",
            json!({
                "empty": m.dispatch[0],
                "history": m.dispatch[1],
                "history_cold": m.cold,
                "purging": m.purging,
            }),
        )
        .detail(
            "ingest_per_s",
            json!({"empty": m.ingest[0], "history": m.ingest[1]}),
        )
        .detail(
            "e2e_p99_ms",
            json!({"empty": m.e2e_p99[0], "history": m.e2e_p99[1]}),
        )
        .detail("purge_runs", json!(m.purge_runs))
        .detail("reads", reads.to_json()))
}

/// The best of two of each figure, `[empty, history]`, and of the dispatch while purging (with
/// the longer of the two runs' longest gaps: a stall is not averaged away).
struct Measured {
    dispatch: [f64; 2],
    ingest: [f64; 2],
    e2e_p99: [f64; 2],
    cold: f64,
    purging: f64,
    purge_gap: Duration,
    purge_runs: Vec<serde_json::Value>,
}

async fn measure(rig: &mut Rig) -> Result<Measured> {
    let mut m = Measured {
        dispatch: [0.0; 2],
        ingest: [0.0; 2],
        e2e_p99: [f64::INFINITY; 2],
        cold: 0.0,
        purging: 0.0,
        purge_gap: Duration::ZERO,
        purge_runs: Vec::new(),
    };
    let history_rows = rig.sizes.history_rows.max(1);
    let purged = PURGE_ROWS.min(history_rows / 5);
    // The rows are spread evenly over the span, so keeping all but the oldest `purged` of them
    // keeps that fraction of the span.
    let retention = HISTORY_SPAN.mul_f64(1.0 - purged as f64 / history_rows as f64);
    // Interleaved: a ratio of two figures taken minutes apart on a shared two-core machine is
    // otherwise mostly the machine's drift.
    for _ in 0..2 {
        for (i, with_history) in [false, true].into_iter().enumerate() {
            rig.set_history(with_history)?;
            m.dispatch[i] = m.dispatch[i].max(dispatch_with(rig, Beside::default()).await?.rate);
            m.ingest[i] = m.ingest[i].max(ingest_with(rig, false).await?.0);
            let e2e = crate::e2e::e2e(rig).await?;
            let p99 = e2e.values.get("e2e.p99").copied().unwrap_or(f64::INFINITY);
            m.e2e_p99[i] = m.e2e_p99[i].min(p99);
        }
        rig.set_history(true)?;
        let cold = Beside {
            cold: true,
            ..Beside::default()
        };
        m.cold = m.cold.max(dispatch_with(rig, cold).await?.rate);
        let purging = dispatch_with(
            rig,
            Beside {
                retention: Some(retention),
                ..Beside::default()
            },
        )
        .await?;
        m.purging = m.purging.max(purging.rate);
        m.purge_gap = m.purge_gap.max(purging.longest_gap);
        m.purge_runs.push(json!({
            "rate": purging.rate,
            "details": purging.record.details,
        }));
    }
    Ok(m)
}
