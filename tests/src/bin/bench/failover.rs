//! The failover figure (issue 35): how long an email channel takes to move to its fallback
//! relay once its first relay goes down, with central's default failover policy
//! (`FailoverPolicy::default()`: three transient failures in a row or 30 s of failing, the first
//! relay probed every 30 s) and every other key at its default. Alarms arrive at [`RATE`] a
//! second from before the fault to the end, as a plant's do, so there is always a new row to
//! try: the figure is the channel's reaction, not a retry delay of the rows caught by the fault.
//!
//! One run, three moments, each timed on the bench's monotonic clock (the two relays are
//! `SmtpSink`s in this process, stamping each message as they accept it):
//! 1. the first relay stops accepting connections (its listener closed, its sessions cut):
//!    until the fallback accepts its first message. The figure; target ≤ 60 s.
//! 2. the first relay listens on its port again: until it accepts its first message (the probe's
//!    way back; informational, set by the probe interval).
//! 3. the first relay accepts connections but never answers (every reply held, as a relay that
//!    hangs): until the fallback accepts its first message after that (informational, set by the
//!    SMTP timeout). Left out with `--quick`, which keeps a run to about half a minute.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_proto::v1;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use outbox_tests::smtp_sink::SmtpSink;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::central_figures::{log_json, submit_as};
use crate::report::RunRecord;
use crate::rig::Rig;
use crate::services::{self, SITE_ID, Service};

/// Alarms submitted a second throughout a run: a steady stream well under what one relay
/// takes, so a delay in the figure is the channel's, never a queue's.
pub(crate) const RATE: u32 = 20;
/// Messages the first relay accepts before it goes down (a second of alarms): central's
/// connections to it are open and pooled when the fault comes, as on a live system.
const WARM: usize = RATE as usize;
/// Messages the first relay accepts after its return before it is made to hang, so every
/// attempt the fallback started before the channel moved back is finished.
const SETTLED: usize = RATE as usize;
/// Generous bound on each wait of a run: four times the figure's target, and longer than the
/// slowest path the defaults allow (a hung relay is given up at the 30 s SMTP timeout).
const DEADLINE: Duration = Duration::from_secs(240);
/// How long the first relay's port may take to be free again after its sink stopped (the
/// sink's accept task, which owns the listener, is dropped by the runtime shortly after).
const REBIND_DEADLINE: Duration = Duration::from_secs(5);

pub(crate) async fn failover(rig: &mut Rig) -> Result<RunRecord> {
    let dir = rig.run_dir("failover")?;
    let db = rig.central_db(dir.path()).await?;
    let first = SmtpSink::start().await?;
    first.discard_messages(true);
    let fallback = SmtpSink::start().await?;
    fallback.discard_messages(true);
    let first_addr = first.addr();
    let smtp_keys = format!(
        "fallback_relays = [\"{}:{} none\"]\n",
        fallback.addr().ip(),
        fallback.addr().port()
    );
    let toml =
        services::central_toml_with_smtp(services::free_addr()?, &db.url(), first_addr, &smtp_keys);
    let mut central = Service::central(&rig.bins, dir.path(), "central", &toml).await?;
    let alarms = Alarms::start(NotificationIngestClient::new(central.connect().await?));

    nth_receipt_after(
        &first,
        Instant::now(),
        WARM,
        &mut central,
        "the first relay before the fault",
    )
    .await?;
    if fallback.accepted_count() > 0 {
        bail!("the fallback relay received mail while the first relay worked");
    }

    // 1. The first relay refuses connections.
    let down_at = Instant::now();
    first.stop();
    let to_fallback =
        nth_receipt_after(&fallback, down_at, 1, &mut central, "the fallback relay").await?;

    // 2. The first relay listens again, on the port central knows it by.
    let back = rebind(first_addr).await?;
    back.discard_messages(true);
    let up_at = Instant::now();
    let way_back =
        nth_receipt_after(&back, up_at, 1, &mut central, "the first relay's return").await?;

    // 3. The first relay accepts connections and answers nothing.
    let hung = if rig.sizes.failover_hung {
        nth_receipt_after(
            &back,
            up_at,
            SETTLED,
            &mut central,
            "the first relay settling",
        )
        .await?;
        back.pause_replies();
        let hung_at = Instant::now();
        let moved = nth_receipt_after(
            &fallback,
            hung_at,
            1,
            &mut central,
            "the fallback after the hang",
        )
        .await?;
        Some(moved)
    } else {
        None
    };
    // Cuts the held sessions, so central's shutdown does not wait on them.
    back.stop();
    let submitted = alarms.stop().await?;
    let central_log = central.stop().await?;
    db.finish(&[]).await;
    fallback.stop();

    let mut record = RunRecord::new()
        .value("failover.to_fallback_s", to_fallback.as_secs_f64())
        .value("failover.back_s", way_back.as_secs_f64())
        .detail("alarms_per_second", json!(RATE))
        .detail("alarms_submitted", json!(submitted))
        .detail(
            "accepted",
            json!({
                "first_before_fault": first.accepted_count(),
                "fallback": fallback.accepted_count(),
                "first_after_return": back.accepted_count(),
            }),
        )
        .detail("central_log", log_json(&central_log));
    if let Some(hung) = hung {
        record = record.value("failover.hung_s", hung.as_secs_f64());
    }
    Ok(record)
}

/// Alarms submitted to central's ingest at [`RATE`] a second until stopped.
struct Alarms {
    stop: CancellationToken,
    task: JoinHandle<Result<u64>>,
}

impl Alarms {
    fn start(mut client: NotificationIngestClient<Channel>) -> Self {
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1) / RATE);
            let mut submitted = 0;
            loop {
                tokio::select! {
                    () = token.cancelled() => return Ok(submitted),
                    _ = tick.tick() => {}
                }
                let alarm = submit_as(SITE_ID, v1::NotificationPriority::Critical);
                let ack = client
                    .submit_notification(alarm)
                    .await
                    .context("submitting an alarm")?
                    .into_inner();
                if ack.outcome() != v1::SubmitOutcome::Accepted {
                    bail!(
                        "an alarm was not accepted: {:?}: {}",
                        ack.outcome(),
                        ack.reason
                    );
                }
                submitted += 1;
            }
        });
        Self { stop, task }
    }

    /// Stops submitting; how many alarms central accepted, or the first failure.
    async fn stop(self) -> Result<u64> {
        self.stop.cancel();
        self.task.await.context("the alarm submitter panicked")?
    }
}

/// How long after `since` `sink` accepted its `n`th message from then on, checking that central
/// is alive meanwhile; fails after [`DEADLINE`], naming `what` was awaited.
async fn nth_receipt_after(
    sink: &SmtpSink,
    since: Instant,
    n: usize,
    central: &mut Service,
    what: &str,
) -> Result<Duration> {
    loop {
        // Receipts are in arrival order; the ones before `since` are skipped.
        if let Some(receipt) = sink.receipts().iter().filter(|r| r.at >= since).nth(n - 1) {
            return Ok(receipt.at - since);
        }
        if since.elapsed() > DEADLINE {
            bail!("{what}: fewer than {n} messages within {DEADLINE:?}");
        }
        central.check_alive()?;
        sink.wait_for_count(sink.accepted_count() + 1, Duration::from_millis(200))
            .await;
    }
}

/// A sink on `addr` again, once the stopped one has let go of the port.
async fn rebind(addr: SocketAddr) -> Result<SmtpSink> {
    let started = Instant::now();
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => return Ok(SmtpSink::serve(listener)),
            Err(e) if started.elapsed() > REBIND_DEADLINE => {
                return Err(e).with_context(|| format!("binding the first relay's {addr} again"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}
