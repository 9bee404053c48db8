//! Escalation's figures, with [`BACKGROUND`] incidents open (critical alarms of a list whose
//! next page is an hour away, all delivered): how late the escalation clock fires the pages
//! that fall due meanwhile (step timing error: a page's fired time minus its due time, from the
//! incident's own page rows), and how long an acknowledgement takes to stop an incident
//! (`AcknowledgeIncident` answered: the incident acknowledged and its unsent pages ended in the
//! one commit). Acknowledged incidents are then checked to page nobody.
//!
//! The probe alarms go out [`PROBE_SPACING`] apart, so their pages fall due spread over a few
//! seconds, as they would on a live system; half of them are acknowledged shortly before their
//! page is due.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_proto::v1;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use outbox_proto::v1::notification_outbox_client::NotificationOutboxClient;
use outbox_tests::smtp_sink::SmtpSink;
use serde_json::json;
use tonic::transport::Channel;

use crate::central_figures::{log_json, submit_as, wait_for_deliveries};
use crate::load::Percentiles;
use crate::report::RunRecord;
use crate::rig::Rig;
use crate::services::{self, RECIPIENTS, SITE_ID, Service};

/// Incidents open while the figures are taken.
pub(crate) const BACKGROUND: usize = 10_000;
/// Probe alarms whose page is timed, and as many that are acknowledged before it.
const PROBES: usize = 200;
/// How long a probe alarm waits for an acknowledgement before its next page.
const PROBE_WAIT: Duration = Duration::from_secs(8);
/// Between two probe alarms.
const PROBE_SPACING: Duration = Duration::from_millis(10);
/// How long before its page falls due an acknowledged probe is acknowledged.
const ACK_LEAD: Duration = Duration::from_millis(1500);
/// Clients submitting the background alarms.
const CALLERS: usize = 8;
/// Generous bound on any one wait of the run.
const DEADLINE: Duration = Duration::from_secs(300);

/// The escalating lists: the background's, the probes' and the one both page next.
const BACKGROUND_LIST: &str = "escalation-background";
const PROBE_LIST: &str = "escalation-probes";
const NEXT_LIST: &str = "escalation-supervisors";

pub(crate) async fn escalation(rig: &mut Rig) -> Result<RunRecord> {
    let dir = rig.run_dir("escalation")?;
    let db = rig.central_db(dir.path()).await?;
    let sink = SmtpSink::start().await?;
    sink.discard_messages(true);
    // `[auth] mode = "none"`: the admin API (incidents read, AcknowledgeIncident) is timed
    // without a token to present.
    let toml = format!(
        "{}\n[auth]\nmode = \"none\"\n{}",
        services::central_toml(services::free_addr()?, &db.url(), sink.addr()),
        lists_toml()
    );
    let mut central = Service::central(&rig.bins, dir.path(), "central", &toml).await?;
    let ingest: Vec<_> = central
        .connections(CALLERS)
        .await?
        .into_iter()
        .map(NotificationIngestClient::new)
        .collect();
    let mut outbox = NotificationOutboxClient::new(central.connect().await?);

    let opened = Instant::now();
    open_background(&ingest).await?;
    let open_s = opened.elapsed().as_secs_f64();
    let delivered = wait_for_deliveries(&sink, &mut central, BACKGROUND as u64, DEADLINE).await?;
    if delivered < BACKGROUND as u64 {
        bail!("{delivered} of {BACKGROUND} background alarms delivered within {DEADLINE:?}");
    }

    // The probes: every other one is acknowledged shortly before its page is due.
    let mut alarms = Vec::with_capacity(2 * PROBES);
    let mut client = ingest[0].clone();
    for i in 0..2 * PROBES {
        let sent = Instant::now();
        let mut alarm = submit_as(SITE_ID, v1::NotificationPriority::Critical);
        alarm.list_name = PROBE_LIST.into();
        let id = alarm.notification_id.clone();
        client
            .submit_notification(alarm)
            .await
            .context("submitting a probe alarm")?;
        alarms.push((id, sent, i % 2 == 1));
        tokio::time::sleep_until((sent + PROBE_SPACING).into()).await;
    }
    let incidents = probe_incidents(&mut outbox).await?;
    // Each acknowledgement is asked at its own moment, whatever the ones before it still wait
    // for (as operators answer independently), so a slow answer does not delay the next ask.
    let mut asks = tokio::task::JoinSet::new();
    for (alarm, sent, acknowledged) in &alarms {
        if !acknowledged {
            continue;
        }
        let id = *incidents
            .get(alarm)
            .with_context(|| format!("no incident for probe alarm {alarm}"))?;
        let at = *sent + PROBE_WAIT - ACK_LEAD;
        let mut outbox = outbox.clone();
        asks.spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let asked = Instant::now();
            outbox
                .acknowledge_incident(v1::AcknowledgeIncidentRequest { id })
                .await
                .context("acknowledging a probe incident")?;
            anyhow::Ok(asked.elapsed())
        });
    }
    let mut ack_latencies = Vec::with_capacity(PROBES);
    while let Some(answer) = asks.join_next().await {
        ack_latencies.push(answer.context("an acknowledgement task")??);
    }

    // Every unacknowledged probe's page fires; none of the acknowledged ones does.
    let mut errors = Vec::with_capacity(PROBES);
    let mut paged_after_ack = 0;
    let mut answered_late = 0;
    let waited = Instant::now();
    for (alarm, _, acknowledged) in &alarms {
        let id = incidents[alarm];
        loop {
            let detail = outbox
                .get_incident(v1::GetIncidentRequest { id })
                .await
                .context("reading a probe incident")?
                .into_inner();
            if *acknowledged {
                // A page fired before the acknowledgement was committed is the clock on time
                // and the answer late; one fired after it would be the escalation not stopping.
                let acked_at = detail
                    .incident
                    .as_ref()
                    .and_then(|i| i.acknowledged_at.as_ref())
                    .and_then(outbox_proto::time::from_timestamp)
                    .with_context(|| format!("acknowledged probe incident {id} has no time"))?;
                for page in detail.pages.iter().filter(|p| p.page_no > 1) {
                    let fired = page
                        .fired_at
                        .as_ref()
                        .and_then(outbox_proto::time::from_timestamp)
                        .with_context(|| format!("page {} has no fired time", page.page_no))?;
                    if fired >= acked_at {
                        paged_after_ack += 1;
                    } else {
                        answered_late += 1;
                    }
                }
                break;
            }
            if let Some(page) = detail.pages.iter().find(|p| p.page_no == 2) {
                errors.push(page_error(page)?);
                break;
            }
            if waited.elapsed() > DEADLINE {
                bail!("probe incident {id} was not paged within {DEADLINE:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    if paged_after_ack > 0 {
        bail!(
            "{paged_after_ack} acknowledged probe incidents were paged after their acknowledgement"
        );
    }
    let central_log = central.stop().await?;
    db.finish(&[]).await;
    sink.stop();

    let errors = Percentiles::of(errors);
    let acks = Percentiles::of(ack_latencies);
    Ok(RunRecord::new()
        .value("escalation.step_error_p99", errors.p99)
        .value("escalation.ack_p99", acks.p99)
        .detail("step_error", errors.to_json())
        .detail("acknowledgement", acks.to_json())
        .detail("background_incidents", json!(BACKGROUND))
        .detail("acknowledged_after_their_page", json!(answered_late))
        .detail("background_open_seconds", json!(open_s))
        .detail("central_log", log_json(&central_log)))
}

/// The escalating lists, as `[[lists]]` tables to append to central's configuration.
fn lists_toml() -> String {
    let recipients = RECIPIENTS
        .iter()
        .map(|r| format!("\"{r}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let list = |name: &str, wait: &str| {
        format!(
            "\n[[lists]]\nname = \"{name}\"\ntype = \"email\"\nrecipients = [{recipients}]\n\
             [lists.escalation]\nacknowledge_within = \"{wait}\"\n\
             steps = [{{ notify = [\"{NEXT_LIST}\"], wait = \"1h\" }}]\n"
        )
    };
    format!(
        "{}{}\n[[lists]]\nname = \"{NEXT_LIST}\"\ntype = \"email\"\nrecipients = [{recipients}]\n",
        list(BACKGROUND_LIST, "1h"),
        list(PROBE_LIST, &format!("{}s", PROBE_WAIT.as_secs())),
    )
}

/// Opens the background incidents: [`BACKGROUND`] critical alarms, from [`CALLERS`] clients.
async fn open_background(clients: &[NotificationIngestClient<Channel>]) -> Result<()> {
    let per_client = BACKGROUND.div_ceil(clients.len());
    let mut tasks = tokio::task::JoinSet::new();
    for (c, client) in clients.iter().enumerate() {
        let mut client = client.clone();
        let count = per_client.min(BACKGROUND.saturating_sub(c * per_client));
        tasks.spawn(async move {
            for _ in 0..count {
                let mut alarm = submit_as(SITE_ID, v1::NotificationPriority::Critical);
                alarm.list_name = BACKGROUND_LIST.into();
                client.submit_notification(alarm).await?;
            }
            Ok::<_, tonic::Status>(())
        });
    }
    while let Some(result) = tasks.join_next().await {
        result
            .context("a background caller failed")?
            .context("submitting a background alarm")?;
    }
    Ok(())
}

/// The probe list's incidents, by the id of the alarm that opened each.
async fn probe_incidents(
    outbox: &mut NotificationOutboxClient<Channel>,
) -> Result<HashMap<String, i64>> {
    let mut found = HashMap::new();
    let mut page_token = String::new();
    // The probes are the newest incidents: the first pages hold them all.
    loop {
        let page = outbox
            .list_incidents(v1::ListIncidentsRequest {
                page_size: 500,
                page_token,
                ..Default::default()
            })
            .await
            .context("listing incidents")?
            .into_inner();
        let mut older = false;
        for incident in page.incidents {
            if incident.list_name == PROBE_LIST {
                found.insert(incident.alarm_notification_id, incident.id);
            } else {
                older = true;
            }
        }
        if older || page.next_page_token.is_empty() || found.len() >= 2 * PROBES {
            return Ok(found);
        }
        page_token = page.next_page_token;
    }
}

/// How late `page` fired: its fired time minus its due time (never below zero).
fn page_error(page: &v1::IncidentPage) -> Result<Duration> {
    let due = page
        .due_at
        .as_ref()
        .and_then(outbox_proto::time::from_timestamp)
        .with_context(|| format!("page {} has no due time", page.page_no))?;
    let fired = page
        .fired_at
        .as_ref()
        .and_then(outbox_proto::time::from_timestamp)
        .with_context(|| format!("page {} has no fired time", page.page_no))?;
    Ok((fired - due).to_std().unwrap_or(Duration::ZERO))
}
