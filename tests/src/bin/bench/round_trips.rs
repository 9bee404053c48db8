//! The `rtt` figures: email delivery over a link that is not loopback. Central starts on
//! Pending rows (as in the dispatch figure) and delivers them to the in-process SMTP sink
//! through a [`DelayLink`] that adds half of a fixed round trip each way (1 ms: an on-site
//! relay; 10 ms: a data-centre one), with central's default 4 SMTP connections and no rate
//! limit.
//!
//! Each round trip reports deliveries per second (first to last message at the sink, as the
//! dispatch figure), the *waits per message* the link saw (the client's turns, see
//! `outbox_tests::delay_link`, divided by the messages delivered; it includes each
//! connection's EHLO, a few hundredths per message at these sizes), and the figure as a
//! share of the floor a pipelining client would reach: two waits per message (MAIL, every RCPT
//! and DATA together; then the message) on each connection, so `connections / (2 × rtt)`
//! deliveries a second. The target is 80% of that floor; a miss is reported, like
//! every other target here.
//!
//! Sizes follow the floor: each round trip delivers the rows the floor would deliver in
//! `--rtt-seconds` (default 3), so the run stays short once delivery is pipelined and lasts
//! about three times longer while it is not. The link keeps the first turns of each
//! connection, so the run also prints what one transaction on a pooled connection sent.

use std::collections::BTreeMap;
use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use outbox_tests::delay_link::{DelayLink, LinkOptions};
use outbox_tests::smtp_sink::SmtpSink;
use serde_json::json;

use crate::central_figures::{log_json, wait_for_deliveries};
use crate::proc_stats::{CpuWindow, flush_disk, own_pid};
use crate::report::{self, RunRecord};
use crate::rig::Rig;
use crate::services::{self, Service};

/// The round trips measured and the keys of their figures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RoundTrip {
    pub ms: u32,
    pub rate_key: &'static str,
    pub share_key: &'static str,
    pub waits_key: &'static str,
}

/// 1 ms (a relay on the same site) and 10 ms (one in a data centre), as the issue asks.
pub(crate) const ROUND_TRIPS: [RoundTrip; 2] = [
    RoundTrip {
        ms: 1,
        rate_key: "rtt.1ms.rate",
        share_key: "rtt.1ms.share_of_floor",
        waits_key: "rtt.1ms.waits_per_message",
    },
    RoundTrip {
        ms: 10,
        rate_key: "rtt.10ms.rate",
        share_key: "rtt.10ms.share_of_floor",
        waits_key: "rtt.10ms.waits_per_message",
    },
];

/// Central's default `[smtp] max_concurrent_connections`, written into the config so the
/// floor's arithmetic and the config say the same thing.
pub(crate) const SMTP_CONNECTIONS: u32 = 4;

/// Waits per message of a pipelined transaction: MAIL, every RCPT and DATA in one, then the
/// message.
pub(crate) const PIPELINED_WAITS: f64 = 2.0;

/// Share of the floor the issue asks for.
pub(crate) const TARGET_SHARE: f64 = 0.8;

/// Turns kept per connection: the EHLO and the first three transactions, enough to see one
/// on a pooled connection whole, at up to ten turns each.
const RECORDED_TURNS: usize = 32;

/// Commands a turn's lines are recognised by; any other line is message content.
const SMTP_VERBS: [&str; 12] = [
    "EHLO", "HELO", "MAIL", "RCPT", "DATA", "BDAT", "NOOP", "RSET", "QUIT", "AUTH", "STARTTLS",
    "VRFY",
];

impl RoundTrip {
    pub(crate) fn round_trip(self) -> Duration {
        Duration::from_millis(u64::from(self.ms))
    }

    /// Deliveries per second with [`PIPELINED_WAITS`] per message on every connection.
    pub(crate) fn floor(self) -> f64 {
        f64::from(SMTP_CONNECTIONS) / (PIPELINED_WAITS * self.round_trip().as_secs_f64())
    }

    /// Rows for one measurement: what the floor delivers in `seconds`.
    pub(crate) fn rows(self, seconds: f64) -> u64 {
        ((self.floor() * seconds).ceil() as u64).max(2)
    }
}

/// Both round trips, one after the other, each with its own central and database.
pub(crate) async fn rtt(rig: &mut Rig) -> Result<RunRecord> {
    let mut record = RunRecord::new();
    let mut busiest: BTreeMap<String, f64> = BTreeMap::new();
    for round_trip in ROUND_TRIPS {
        let measured = measure(rig, round_trip)
            .await
            .with_context(|| format!("at {} ms round trip", round_trip.ms))?;
        eprintln!(
            "bench: rtt: {} ms: {} deliveries/s, {:.2} waits per message; one transaction on a \
             pooled connection: {}",
            round_trip.ms,
            report::number(measured.rate),
            measured.waits,
            if measured.transaction.is_empty() {
                "not seen".to_string()
            } else {
                measured.transaction.join(", ")
            },
        );
        // The group's cores are the busier window of the two, per process, so a disturbed
        // measurement is never hidden by a quiet one.
        for (process, cores) in &measured.cores {
            let entry = busiest.entry(process.clone()).or_default();
            *entry = entry.max(*cores);
        }
        record = record
            .value(round_trip.rate_key, measured.rate)
            .value(round_trip.share_key, measured.rate / round_trip.floor())
            .value(round_trip.waits_key, measured.waits)
            .detail(&format!("{}ms", round_trip.ms), measured.details);
    }
    Ok(record.cpu(busiest))
}

/// What one round trip measured.
struct Measured {
    rate: f64,
    waits: f64,
    /// The turns of one transaction on a pooled connection, labelled (see [`turn_label`]).
    transaction: Vec<String>,
    cores: BTreeMap<String, f64>,
    details: serde_json::Value,
}

async fn measure(rig: &mut Rig, round_trip: RoundTrip) -> Result<Measured> {
    let rows = round_trip.rows(rig.sizes.rtt_seconds);
    // Generous: a tenth of the floor still finishes (a client waiting for every reply reaches
    // about a third of it; central, sending each envelope behind the message before, about
    // one and a half times it), and never less than the dispatch figure's own deadline.
    let deadline = rig.sizes.dispatch_deadline.max(Duration::from_secs_f64(
        rows as f64 / round_trip.floor() * 10.0,
    ));
    let dir = rig.run_dir(&format!("rtt-{}ms", round_trip.ms))?;
    let db = rig.central_db(dir.path()).await?;
    db.add_pending_rows(rows).await?;
    let sink = SmtpSink::start().await?;
    sink.discard_messages(true);
    let link = DelayLink::start_with(
        sink.addr(),
        LinkOptions {
            one_way: round_trip.round_trip() / 2,
            record_turns: RECORDED_TURNS,
        },
    )
    .await
    .context("starting the delay link")?;
    let toml = services::central_toml_with_smtp(
        services::free_addr()?,
        &db.url(),
        link.addr(),
        &format!("max_concurrent_connections = {SMTP_CONNECTIONS}\n"),
    );
    flush_disk();
    let mut central = Service::central(&rig.bins, dir.path(), "central", &toml).await?;
    let cpu = CpuWindow::start(&[("central", central.pid()), ("bench", own_pid())])
        .with_server(central.pid(), rig.backend.server_port());
    let received = wait_for_deliveries(&sink, &mut central, rows, deadline).await?;
    // Taken at once: after the last message nothing more is sent but the pool's idle checks.
    let turns = link.client_turns();
    let connections = link.connections();
    let lateness = link.lateness();
    let cores = cpu.cores();
    let sessions = rig.backend.sessions_of(central.pid());
    let central_log = central.stop().await?;
    db.finish(&sessions).await;
    link.stop();
    sink.stop();
    let receipts = sink.receipts();
    let (Some(first), Some(last)) = (receipts.first(), receipts.last()) else {
        bail!("no message reached the SMTP sink within {deadline:?}");
    };
    if received < rows {
        eprintln!(
            "bench: rtt: {} ms: only {received} of {rows} delivered within {deadline:?}; the \
             rate is over those",
            round_trip.ms
        );
    }
    let span = (last.at - first.at).as_secs_f64();
    if span <= 0.0 {
        bail!("all {received} deliveries arrived at the same instant");
    }
    let distinct: HashSet<_> = receipts.iter().map(|r| &r.message_id).collect();
    // N messages span N-1 intervals.
    let rate = (receipts.len() - 1) as f64 / span;
    let waits = turns as f64 / receipts.len() as f64;
    let labelled: Vec<Vec<String>> = link
        .transcripts()
        .iter()
        .map(|turns| turns.iter().map(|t| turn_label(t)).collect())
        .collect();
    let transaction = labelled
        .iter()
        .find_map(|turns| pooled_transaction(turns))
        .unwrap_or_default();
    let details = json!({
        "rows": rows,
        "delivered": receipts.len(),
        "duplicate_messages": receipts.len() - distinct.len(),
        "first_to_last_seconds": span,
        "round_trip_ms": round_trip.ms,
        "smtp_connections": SMTP_CONNECTIONS,
        "floor_per_s": round_trip.floor(),
        "client_turns": turns,
        "link_connections": connections,
        "smtp_sessions_max": sink.max_concurrent_sessions(),
        // Sleeping is never exact: how much later than asked the link delivered, so the round
        // trip the figure really had is 2 × (one way + mean lateness).
        "link_lateness_mean_ms": lateness.mean.as_secs_f64() * 1e3,
        "link_lateness_max_ms": lateness.max.as_secs_f64() * 1e3,
        "link_chunks": lateness.chunks,
        "pooled_transaction_turns": transaction,
        "first_turns_per_connection": labelled,
        "cpu_cores": cores,
        "central_log": log_json(&central_log),
    });
    Ok(Measured {
        rate,
        waits,
        transaction,
        cores,
        details,
    })
}

/// What a recorded turn sent, by its command lines: `MAIL`, `RCPT`, `MAIL+RCPT+RCPT+DATA` for
/// a pipelined group, `message` for content (the lines after DATA's 354).
fn turn_label(turn: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for line in turn.split_inclusive('\n') {
        let word = line
            .split([' ', ':', '\r', '\n'])
            .next()
            .unwrap_or_default();
        match SMTP_VERBS.iter().find(|verb| **verb == word) {
            Some(verb) => parts.push(verb),
            None => {
                parts.push("message");
                break;
            }
        }
    }
    if parts.is_empty() {
        "(empty)".to_string()
    } else {
        parts.join("+")
    }
}

/// The turns of the second transaction on a connection: those after the first one's message,
/// up to and including the second message. That is what every message on a pooled connection
/// costs (the first also paid for EHLO).
fn pooled_transaction(turns: &[String]) -> Option<Vec<String>> {
    let is_message = |t: &String| t.ends_with("message");
    let first = turns.iter().position(is_message)?;
    let rest = turns.get(first + 1..)?;
    let second = rest.iter().position(is_message)?;
    Some(rest.get(..=second)?.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_two_waits_per_message_on_each_connection() {
        assert_eq!(ROUND_TRIPS[0].floor().round(), 2000.0);
        assert_eq!(ROUND_TRIPS[1].floor().round(), 200.0);
        assert_eq!(ROUND_TRIPS[1].rows(3.0), 600);
    }

    #[test]
    fn turns_are_labelled_by_their_commands() {
        assert_eq!(turn_label("EHLO bench\r\n"), "EHLO");
        assert_eq!(turn_label("MAIL FROM:<a@b>\r\n"), "MAIL");
        assert_eq!(
            turn_label("MAIL FROM:<a@b>\r\nRCPT TO:<c@d>\r\nRCPT TO:<e@f>\r\nDATA\r\n"),
            "MAIL+RCPT+RCPT+DATA"
        );
        assert_eq!(turn_label("From: a@b\r\nTo: c@d\r\n"), "message");
        assert_eq!(turn_label("Date: Mon, 1 Jan"), "message");
        assert_eq!(turn_label(""), "(empty)");
    }

    #[test]
    fn the_pooled_transaction_is_the_second_one() {
        let turns: Vec<String> = [
            "EHLO", "MAIL", "RCPT", "RCPT", "DATA", "message", "NOOP", "MAIL", "RCPT", "RCPT",
            "DATA", "message", "NOOP",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            pooled_transaction(&turns).unwrap(),
            ["NOOP", "MAIL", "RCPT", "RCPT", "DATA", "message"]
        );
        assert_eq!(pooled_transaction(&turns[..6]), None);
    }
}
