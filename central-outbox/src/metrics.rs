//! Central's Prometheus metrics: what ingest and the dispatcher count as they go, and the KPI
//! figures, rendered as OpenMetrics text for the `/metrics` endpoint (see the `metrics-endpoint`
//! crate).
//!
//! Counters and the histogram are updated where the work happens (ingest, each finished
//! attempt); the lease and KPI gauges are set from outside, the KPIs from the same store query as
//! the `GetKpis` RPC, so both surfaces agree. Series for the outcomes known up front exist from the
//! start at 0, so `rate()` sees the first increment. Label values are the names the database and
//! the admin API already use (`Email`, `TransientFailure`), so a series and the attempt rows it
//! counts read the same.

use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use metrics_endpoint::{ListenerMetrics, ListenerStats};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use task_supervisor::SupervisionMetrics;

use crate::domain::NotificationType;
use crate::domain::delivery::AttemptOutcome;
use crate::domain::kpi::{KpiValues, Kpis};
use crate::domain::self_alert::{ChannelStreak, ConditionKind};
use crate::domain::site_health::NodeHealth;
use crate::records::{InsertOutcome, PurgeReport};

/// Upper bounds, in seconds, of the delivery duration buckets. A send to a relay on the LAN takes
/// a few milliseconds; a TLS handshake or a slow relay over a WAN, seconds; the SMTP timeout
/// (30 s by default, per operation) bounds the tail, so 60 s closes the range.
const DELIVERY_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
];

/// Upper bounds, in seconds, of the lease renewal buckets: a healthy renewal is one small
/// statement (about a millisecond); anything near the lease's TTL (15 s by default) is a lease
/// about to be lost.
const LEASE_RENEWAL_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 15.0,
];

/// The `listener` label of central's HTTP listeners.
const METRICS: &str = "metrics";
const CONSOLE: &str = "console";
const ACK_LINKS: &str = "ack_links";

/// Outcomes a finished attempt can have (`InFlight` is what an unfinished one leaves behind).
const FINISHED_OUTCOMES: [AttemptOutcome; 3] = [
    AttemptOutcome::Delivered,
    AttemptOutcome::TransientFailure,
    AttemptOutcome::PermanentFailure,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IngestLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptLabels {
    channel: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChannelLabels {
    channel: &'static str,
}

/// A self-alert condition's kind (`domain::self_alert::ConditionKind::as_str`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    condition: &'static str,
}

/// What a self-alert check could not read.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    figure: &'static str,
}

/// The steps of a retention pass, each a `step` label of its failures (exported at zero).
pub(crate) const PURGE_STEPS: [&str; 2] = ["notifications", "site_health"];

/// The figures the self-alert watch reads, each a `figure` label of its check failures
/// (exported at zero once self-alerts are on, so an alert rule sees the first failure).
pub(crate) const SELF_ALERT_FIGURES: [&str; 6] =
    ["history", "lease", "kpis", "queue", "held", "store"];

/// The steps of a channel loop's claim, each a `step` label of its failures (exported at zero
/// for each channel): reading the channel's settings, then claiming due rows with them.
pub(crate) const CLAIM_STEPS: [&str; 2] = ["settings", "claim"];

/// Which channel's claim failed, at which of [`CLAIM_STEPS`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimStepLabels {
    channel: &'static str,
    step: &'static str,
}

/// Why a channel moved to another provider (`domain::failover::MoveReason`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailoverLabels {
    channel: &'static str,
    reason: &'static str,
}

/// A webhook list with fallback URLs, by name (lists are few and named by admins, so the
/// label's values stay few).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListLabels {
    list: String,
}

/// Why a webhook list moved to another endpoint (`domain::failover::MoveReason`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListFailoverLabels {
    list: String,
    reason: &'static str,
}

/// Which step of a retention pass failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PurgeStepLabels {
    step: &'static str,
}

/// How a status callback call ended (`domain::status_callback::CallOutcome`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallOutcomeLabels {
    outcome: &'static str,
}

/// How a heartbeat call went.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HeartbeatLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SiteLabels {
    site: String,
}

/// One site-forwarder node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    site: String,
    node: String,
}

type SecondsGauge = Gauge<f64, AtomicU64>;

/// The global KPI gauges.
#[derive(Debug, Default)]
struct KpiGauges {
    queue_depth: Gauge,
    stuck: Gauge,
    parked: Gauge,
    delivered_recently: Gauge,
    oldest_pending_age: SecondsGauge,
    oldest_retry_wait_age: SecondsGauge,
}

/// The same figures per source site.
#[derive(Debug, Default)]
struct SiteKpiGauges {
    queue_depth: Family<SiteLabels, Gauge>,
    stuck: Family<SiteLabels, Gauge>,
    parked: Family<SiteLabels, Gauge>,
    delivered_recently: Family<SiteLabels, Gauge>,
    oldest_pending_age: Family<SiteLabels, SecondsGauge>,
    oldest_retry_wait_age: Family<SiteLabels, SecondsGauge>,
}

/// Each site node's latest health report (`domain::site_health`), per (site, node).
#[derive(Debug, Default)]
struct SiteHealthGauges {
    online: Family<NodeLabels, Gauge>,
    last_report_age: Family<NodeLabels, SecondsGauge>,
    buffer_depth: Family<NodeLabels, Gauge>,
    oldest_buffered_age: Family<NodeLabels, SecondsGauge>,
}

/// Every metric central exports. Share it with an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    ingest: Family<IngestLabels, Counter>,
    /// Submit streams open now, and those refused at `server.max_ingest_streams`.
    ingest_streams_open: Gauge,
    ingest_streams_refused: Counter,
    /// The console's and /metrics' connections (see `metrics_endpoint::connections`).
    http_listeners: ListenerMetrics,
    attempts: Family<AttemptLabels, Counter>,
    durations: Family<ChannelLabels, Histogram, fn() -> Histogram>,
    leader: Gauge,
    lease_epoch: Gauge,
    /// Round trip of each lease renewal, including any that failed or timed out.
    lease_renewals: Histogram,
    lease_renewal_failures: Counter,
    /// Outcome writes the store refused (each try), and outcomes given up on after
    /// `claim_timeout`: the latter are the rows that may be mailed twice.
    outcome_write_failures: Counter,
    outcomes_unrecorded: Counter,
    purged: Counter,
    purged_parked: Counter,
    /// Site nodes the purge forgot (silent for `retention.site_health_retention`), and health
    /// reports refused because their site already had `MAX_NODES_PER_SITE` nodes.
    site_nodes_forgotten: Counter,
    purge_failures: Family<PurgeStepLabels, Counter>,
    kpi_read_failures: Counter,
    site_health_refused: Counter,
    /// The site status feed (`grpc::site_status`, `status_feed`, `purge`): changes sent back to
    /// sites, streams open, failed polls, and changes dropped unconfirmed after the retention.
    site_status_sent: Counter,
    site_status_streams: Gauge,
    site_status_poll_failures: Counter,
    site_status_dropped: Counter,
    /// The status callbacks (`status_callbacks`): calls by outcome, turns the store refused,
    /// and the changes waiting with the oldest one's age.
    status_callback_calls: Family<CallOutcomeLabels, Counter>,
    status_callback_failures: Counter,
    status_callbacks_waiting: Gauge,
    status_callback_oldest: SecondsGauge,
    /// The escalation clock (`escalation_clock`): pages fired, of them late, incidents
    /// exhausted, lists a page could not reach, and turns the store refused.
    escalation_pages: Counter,
    escalation_late_pages: Counter,
    escalation_exhausted: Counter,
    escalation_skipped: Counter,
    escalation_failures: Counter,
    /// 1 while ingest cannot tell sites apart (no client certificates required).
    site_identity_unverified: Gauge,
    /// Claimed rows released unsent (they waited too long for a slot), by channel.
    claims_released: Family<ChannelLabels, Counter>,
    claim_failures: Family<ClaimStepLabels, Counter>,
    /// Supervised tasks restarted after ending or panicking, and those given up on.
    supervision: SupervisionMetrics,
    /// Each channel's latest attempts (`ChannelStreak`), read by the self-alerts, and its
    /// consecutive transient failures as a gauge.
    streaks: Mutex<[ChannelStreak; 2]>,
    consecutive_failures: Family<ChannelLabels, Gauge>,
    /// Which of its providers each channel delivers through (0: its first), and its moves.
    channel_provider: Family<ChannelLabels, Gauge>,
    channel_failovers: Family<FailoverLabels, Counter>,
    /// The same per webhook list with fallback URLs (its endpoints are its providers); a
    /// list's gauge exists while the dispatching node follows the list.
    list_provider: Family<ListLabels, Gauge>,
    list_failovers: Family<ListFailoverLabels, Counter>,
    /// The self-alerts (`self_alerts`): notifications stored per condition kind, conditions
    /// raised now, alerts that could not go around a failing channel, figures a check could
    /// not read, and heartbeat calls. Their series exist only where self-alerts are on.
    self_alerts_raised: Family<ConditionLabels, Counter>,
    self_alerts_recovered: Family<ConditionLabels, Counter>,
    self_alerts_active: Family<ConditionLabels, Gauge>,
    self_alerts_unroutable: Family<ConditionLabels, Counter>,
    self_alert_check_failures: Family<CheckLabels, Counter>,
    heartbeats: Family<HeartbeatLabels, Counter>,
    kpis: KpiGauges,
    site_kpis: SiteKpiGauges,
    site_health: SiteHealthGauges,
    /// Held while the KPI gauges are rewritten and while the registry is encoded, so a scrape
    /// never sees the per-site families cleared and not yet refilled.
    kpi_update: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::default();
        let ingest = Family::<IngestLabels, Counter>::default();
        registry.register(
            "outbox_ingest",
            "Submits answered by ingest, by outcome (accepted: new row; duplicate: same id and \
             content; conflict: same id, other content; invalid: failed validation)",
            ingest.clone(),
        );
        for outcome in ["accepted", "duplicate", "conflict", "invalid"] {
            ingest.get_or_create_owned(&IngestLabels { outcome });
        }
        let ingest_streams_open = Gauge::default();
        registry.register(
            "outbox_ingest_streams_open",
            "Submit streams (SubmitNotifications) open on this node; at most \
             server.max_ingest_streams",
            ingest_streams_open.clone(),
        );
        let ingest_streams_refused = Counter::default();
        registry.register(
            "outbox_ingest_streams_refused",
            "Submit streams refused with RESOURCE_EXHAUSTED because this node had \
             server.max_ingest_streams open; the site retries, but its notifications wait",
            ingest_streams_refused.clone(),
        );
        let http_listeners =
            ListenerMetrics::register(&mut registry, &[METRICS, CONSOLE, ACK_LINKS]);

        let attempts = Family::<AttemptLabels, Counter>::default();
        registry.register(
            "outbox_delivery_attempts",
            "Finished delivery attempts, by channel and outcome",
            attempts.clone(),
        );
        let durations: Family<ChannelLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(|| Histogram::new(DELIVERY_BUCKETS));
        registry.register_with_unit(
            "outbox_delivery_duration",
            "Time from handing a notification to the channel's adapter to its outcome",
            Unit::Seconds,
            durations.clone(),
        );
        // Email is the only adapter so far; its series start at zero.
        let channel = NotificationType::Email.as_str();
        durations.get_or_create_owned(&ChannelLabels { channel });
        for outcome in FINISHED_OUTCOMES {
            attempts.get_or_create_owned(&AttemptLabels {
                channel,
                outcome: outcome.as_str(),
            });
        }

        let leader = Gauge::default();
        registry.register(
            "outbox_dispatcher_leader",
            "1 while this node holds the dispatcher lease, else 0",
            leader.clone(),
        );
        let lease_epoch = Gauge::default();
        registry.register(
            "outbox_dispatcher_lease_epoch",
            "Epoch (fencing token) of the dispatcher lease as this node last saw it; 0 if unknown",
            lease_epoch.clone(),
        );

        let lease_renewals = Histogram::new(LEASE_RENEWAL_BUCKETS);
        registry.register_with_unit(
            "outbox_dispatcher_lease_renewal",
            "Time each dispatcher lease renewal took, answered or not",
            Unit::Seconds,
            lease_renewals.clone(),
        );
        let lease_renewal_failures = Counter::default();
        registry.register(
            "outbox_dispatcher_lease_renewal_failures",
            "Lease renewals that failed or timed out (not those another holder refused)",
            lease_renewal_failures.clone(),
        );

        let outcome_write_failures = Counter::default();
        registry.register(
            "outbox_dispatcher_outcome_write_failures",
            "Writes of finished attempts' outcomes that failed (database unreachable, disk full); \
             each is tried again until the claim timeout",
            outcome_write_failures.clone(),
        );
        let outcomes_unrecorded = Counter::default();
        registry.register(
            "outbox_dispatcher_outcomes_unrecorded",
            "Finished attempts whose outcome could not be written within the claim timeout: each \
             row is delivered again, so its mail may arrive twice",
            outcomes_unrecorded.clone(),
        );

        let purged = Counter::default();
        registry.register(
            "outbox_purged_notifications",
            "Terminal notifications deleted by the retention purge, with their history",
            purged.clone(),
        );
        let purged_parked = Counter::default();
        registry.register(
            "outbox_purged_parked_notifications",
            "Of those purged, the Parked ones: failures no operator retried or discarded",
            purged_parked.clone(),
        );
        let site_nodes_forgotten = Counter::default();
        registry.register(
            "outbox_site_nodes_forgotten",
            "Site nodes whose health central forgot because they had not reported for \
             retention.site_health_retention (they no longer show in ListSiteHealth or here)",
            site_nodes_forgotten.clone(),
        );
        let escalation_pages = Counter::default();
        registry.register(
            "outbox_escalation_pages",
            "Pages the escalation clock fired: steps of incidents nobody acknowledged in time, \
             and reminders",
            escalation_pages.clone(),
        );
        let escalation_late_pages = Counter::default();
        registry.register(
            "outbox_escalation_late_pages",
            "Of those pages, the ones that fired 10 s or more after their due time (the \
             dispatcher was down or behind); each incident's history says how late",
            escalation_late_pages.clone(),
        );
        let escalation_exhausted = Counter::default();
        registry.register(
            "outbox_escalation_exhausted",
            "Incidents that ran out of pages with nobody acknowledging them",
            escalation_exhausted.clone(),
        );
        let escalation_skipped = Counter::default();
        registry.register(
            "outbox_escalation_skipped_lists",
            "Lists a page could not reach (the list no longer exists, or the alarm it quotes is \
             gone); each is a Skipped row in the incident's history",
            escalation_skipped.clone(),
        );
        let escalation_failures = Counter::default();
        registry.register(
            "outbox_escalation_failures",
            "Turns of the escalation clock the store refused; what was due stays due and is \
             fired at the next turn",
            escalation_failures.clone(),
        );
        let purge_failures = Family::<PurgeStepLabels, Counter>::default();
        registry.register(
            "outbox_purge_failures",
            "Retention passes whose step failed (the store refused it), by step: notifications \
             (terminal rows past retention) or site_health (silent nodes); tried again at the next \
             retention.purge_interval",
            purge_failures.clone(),
        );
        for step in PURGE_STEPS {
            purge_failures.get_or_create_owned(&PurgeStepLabels { step });
        }
        let kpi_read_failures = Counter::default();
        registry.register(
            "outbox_kpi_read_failures",
            "Reads of the KPIs and site health for the gauges that failed (the store refused \
             them): until one succeeds, those gauges keep their last values",
            kpi_read_failures.clone(),
        );
        let site_health_refused = Counter::default();
        registry.register(
            "outbox_site_health_reports_refused",
            format!(
                "Health reports refused (RESOURCE_EXHAUSTED) because they came from a new node of \
                 a site that already has the most nodes central keeps per site ({})",
                crate::domain::site_health::MAX_NODES_PER_SITE
            ),
            site_health_refused.clone(),
        );

        let site_status_sent = Counter::default();
        registry.register(
            "outbox_site_status_sent",
            "Final statuses sent back to their sites over WatchSiteStatus (a change is sent \
             again after a break until its site confirms it)",
            site_status_sent.clone(),
        );
        let site_status_streams = Gauge::default();
        registry.register(
            "outbox_site_status_streams",
            "WatchSiteStatus streams open on this node",
            site_status_streams.clone(),
        );
        let site_status_poll_failures = Counter::default();
        registry.register(
            "outbox_site_status_poll_failures",
            "Failed reads of the site status feed's heads (streams then read on their own every \
             few seconds, so statuses reach the sites later)",
            site_status_poll_failures.clone(),
        );
        let site_status_dropped = Counter::default();
        registry.register(
            "outbox_site_status_dropped",
            "Final statuses dropped by the purge because their site did not take them within \
             retention.site_status_keep (the site answers GetStatus for them from central)",
            site_status_dropped.clone(),
        );

        let status_callback_calls = Family::<CallOutcomeLabels, Counter>::default();
        // Every outcome's series exists from the start, so an alert's increase() sees the first.
        for outcome in ["answered", "failed", "given_up"] {
            drop(status_callback_calls.get_or_create(&CallOutcomeLabels { outcome }));
        }
        registry.register(
            "outbox_status_callback_calls",
            "Calls of the lists' status callback endpoints by outcome: answered (2xx), failed \
             (called again later) and given_up (never answered within \
             status_callbacks.give_up_after, or refused for good)",
            status_callback_calls.clone(),
        );
        let status_callback_failures = Counter::default();
        registry.register(
            "outbox_status_callback_failures",
            "Turns of the status callbacks the store refused (their changes are called again)",
            status_callback_failures.clone(),
        );
        let status_callbacks_waiting = Gauge::default();
        registry.register(
            "outbox_status_callbacks_waiting",
            "Final statuses waiting to be told to their list's status callback endpoint (on the \
             dispatcher lease holder)",
            status_callbacks_waiting.clone(),
        );
        let status_callback_oldest = SecondsGauge::default();
        registry.register(
            "outbox_status_callback_oldest_seconds",
            "Age of the oldest final status still waiting for its status callback (0: none)",
            status_callback_oldest.clone(),
        );

        let site_identity_unverified = Gauge::default();
        registry.register(
            "outbox_site_identity_unverified",
            "1 when central does not require client certificates ([tls] client_ca unset): any \
             client that reaches the gRPC port may submit, clear conditions and report health as \
             any site; 0 when each site is held to its certificate's name",
            site_identity_unverified.clone(),
        );
        let claims_released = Family::<ChannelLabels, Counter>::default();
        registry.register(
            "outbox_dispatcher_claims_released",
            "Claimed notifications released without being sent, because they waited longer for \
             a free delivery slot than half the claim timeout (each is due again at once; its \
             history has a NotSent attempt)",
            claims_released.clone(),
        );
        for channel in [NotificationType::Email, NotificationType::Webhook] {
            claims_released.get_or_create_owned(&ChannelLabels {
                channel: channel.as_str(),
            });
        }
        let claim_failures = Family::<ClaimStepLabels, Counter>::default();
        registry.register(
            "outbox_dispatcher_claim_failures",
            "Claims of due notifications that failed, by channel and step: settings (reading the \
             channel's settings) or claim (the claim itself); the channel tries again at its next \
             turn and delivers nothing new meanwhile",
            claim_failures.clone(),
        );
        for channel in [NotificationType::Email, NotificationType::Webhook] {
            for step in CLAIM_STEPS {
                claim_failures.get_or_create_owned(&ClaimStepLabels {
                    channel: channel.as_str(),
                    step,
                });
            }
        }
        let supervision = SupervisionMetrics::default();
        supervision.register(&mut registry);
        let consecutive_failures = Family::<ChannelLabels, Gauge>::default();
        registry.register(
            "outbox_channel_consecutive_failures",
            "Delivery attempts of the channel that failed transiently in a row, as this node saw \
             them; 0 after a delivery",
            consecutive_failures.clone(),
        );
        for channel in [NotificationType::Email, NotificationType::Webhook] {
            consecutive_failures.get_or_create_owned(&ChannelLabels {
                channel: channel.as_str(),
            });
        }
        let channel_provider = Family::<ChannelLabels, Gauge>::default();
        registry.register(
            "outbox_channel_provider",
            "Which provider the channel delivers through on this node: 0 its first (the relay its \
             settings name), n its n-th fallback relay",
            channel_provider.clone(),
        );
        for channel in [NotificationType::Email, NotificationType::Webhook] {
            channel_provider.get_or_create_owned(&ChannelLabels {
                channel: channel.as_str(),
            });
        }
        let channel_failovers = Family::<FailoverLabels, Counter>::default();
        registry.register(
            "outbox_channel_failovers",
            "Moves of a channel from one provider to another, by why: failures (transient failures \
             in a row), failing_for (failing too long) or first_is_back (a good probe of the first)",
            channel_failovers.clone(),
        );
        let list_provider = Family::<ListLabels, Gauge>::default();
        registry.register(
            "outbox_list_provider",
            "Which endpoint a webhook list with fallback URLs delivers through on this node: 0 \
             its endpoint, n its n-th fallback URL",
            list_provider.clone(),
        );
        let list_failovers = Family::<ListFailoverLabels, Counter>::default();
        registry.register(
            "outbox_list_failovers",
            "Moves of a webhook list from one endpoint to another, by why: failures, failing_for \
             or first_is_back (as outbox_channel_failovers)",
            list_failovers.clone(),
        );
        let self_alerts_raised = Family::<ConditionLabels, Counter>::default();
        registry.register(
            "outbox_self_alerts_raised",
            "Self-alerts this node stored (one per list), by condition",
            self_alerts_raised.clone(),
        );
        let self_alerts_recovered = Family::<ConditionLabels, Counter>::default();
        registry.register(
            "outbox_self_alerts_recovered",
            "Self-alert recoveries this node stored (one per list), by condition",
            self_alerts_recovered.clone(),
        );
        let self_alerts_active = Family::<ConditionLabels, Gauge>::default();
        registry.register(
            "outbox_self_alerts_active",
            "Self-alert conditions raised and not yet recovered, as this node watches them",
            self_alerts_active.clone(),
        );
        let self_alerts_unroutable = Family::<ConditionLabels, Counter>::default();
        registry.register(
            "outbox_self_alerts_unroutable",
            "Self-alerts about a failing channel with no list on another channel to go to: \
             stored on the failing channel's own list",
            self_alerts_unroutable.clone(),
        );
        let self_alert_check_failures = Family::<CheckLabels, Counter>::default();
        registry.register(
            "outbox_self_alert_check_failures",
            "Self-alert checks that could not read a figure (the store did not answer), by \
             figure; the conditions it decides were left as they were",
            self_alert_check_failures.clone(),
        );
        let heartbeats = Family::<HeartbeatLabels, Counter>::default();
        registry.register(
            "outbox_self_alert_heartbeats",
            "Calls of the heartbeat URL, by result (ok: a 2xx answer)",
            heartbeats.clone(),
        );

        let kpis = KpiGauges::default();
        let site_kpis = SiteKpiGauges::default();
        register_kpis(&mut registry, &kpis, &site_kpis);
        let site_health = SiteHealthGauges::default();
        register_site_health(&mut registry, &site_health);

        Self {
            registry,
            ingest,
            ingest_streams_open,
            ingest_streams_refused,
            http_listeners,
            attempts,
            durations,
            leader,
            lease_epoch,
            lease_renewals,
            lease_renewal_failures,
            outcome_write_failures,
            outcomes_unrecorded,
            purged,
            purged_parked,
            site_nodes_forgotten,
            purge_failures,
            kpi_read_failures,
            site_health_refused,
            site_status_sent,
            site_status_streams,
            site_status_poll_failures,
            site_status_dropped,
            status_callback_calls,
            status_callback_failures,
            status_callbacks_waiting,
            status_callback_oldest,
            escalation_pages,
            escalation_late_pages,
            escalation_exhausted,
            escalation_skipped,
            escalation_failures,
            site_identity_unverified,
            claims_released,
            claim_failures,
            supervision,
            streaks: Mutex::new([ChannelStreak::default(); 2]),
            consecutive_failures,
            channel_provider,
            channel_failovers,
            list_provider,
            list_failovers,
            self_alerts_raised,
            self_alerts_recovered,
            self_alerts_active,
            self_alerts_unroutable,
            self_alert_check_failures,
            heartbeats,
            kpis,
            site_kpis,
            site_health,
            kpi_update: Mutex::new(()),
        }
    }

    /// Counts one submit stored (or found) by the store.
    pub(crate) fn ingested(&self, outcome: InsertOutcome) {
        let outcome = match outcome {
            InsertOutcome::Accepted => "accepted",
            InsertOutcome::Duplicate => "duplicate",
            InsertOutcome::Conflict => "conflict",
        };
        self.ingest.get_or_create(&IngestLabels { outcome }).inc();
    }

    /// Counts one submit rejected before it reached the store.
    pub(crate) fn ingest_rejected_invalid(&self) {
        self.ingest
            .get_or_create(&IngestLabels { outcome: "invalid" })
            .inc();
    }

    /// One submit stream opened (`opened`) or ended.
    pub(crate) fn ingest_stream(&self, opened: bool) {
        if opened {
            self.ingest_streams_open.inc();
        } else {
            self.ingest_streams_open.dec();
        }
    }

    /// Counts one submit stream refused at `server.max_ingest_streams`.
    pub(crate) fn ingest_stream_refused(&self) {
        self.ingest_streams_refused.inc();
    }

    /// The `/metrics` listener's connection figures.
    pub(crate) fn metrics_listener(&self) -> ListenerStats {
        self.http_listeners.listener(METRICS)
    }

    /// The web console's connection figures.
    pub(crate) fn console_listener(&self) -> ListenerStats {
        self.http_listeners.listener(CONSOLE)
    }

    /// The acknowledgement page's own listener's connection figures (`[acknowledgement]
    /// listen`).
    pub(crate) fn ack_listener(&self) -> ListenerStats {
        self.http_listeners.listener(ACK_LINKS)
    }

    /// Counts one attempt that reached an outcome, and how long the adapter took.
    pub(crate) fn attempt_finished(
        &self,
        channel: NotificationType,
        outcome: AttemptOutcome,
        duration: Duration,
    ) {
        let kind = channel;
        let channel = channel.as_str();
        self.attempts
            .get_or_create(&AttemptLabels {
                channel,
                outcome: outcome.as_str(),
            })
            .inc();
        self.durations
            .get_or_create(&ChannelLabels { channel })
            .observe(duration.as_secs_f64());
        let consecutive = {
            let mut streaks = self.streaks.lock().unwrap_or_else(PoisonError::into_inner);
            let streak = &mut streaks[streak_index(kind)];
            streak.record(outcome, chrono::Utc::now());
            streak.consecutive_failures
        };
        self.consecutive_failures
            .get_or_create(&ChannelLabels { channel })
            .set(count(consecutive));
    }

    /// The channel's latest attempts as this node saw them.
    pub(crate) fn channel_streak(&self, kind: NotificationType) -> ChannelStreak {
        self.streaks.lock().unwrap_or_else(PoisonError::into_inner)[streak_index(kind)]
    }

    /// Self-alerts are on: their series exist from now on, at zero (the heartbeat's too when
    /// one is configured), so rules and dashboards find them on a healthy node.
    pub(crate) fn enable_self_alerts(&self, heartbeat: bool) {
        for kind in ConditionKind::ALL {
            let labels = ConditionLabels {
                condition: kind.as_str(),
            };
            self.self_alerts_raised.get_or_create_owned(&labels);
            self.self_alerts_recovered.get_or_create_owned(&labels);
            self.self_alerts_active.get_or_create_owned(&labels);
            self.self_alerts_unroutable.get_or_create_owned(&labels);
        }
        for figure in SELF_ALERT_FIGURES {
            self.self_alert_check_failures
                .get_or_create_owned(&CheckLabels { figure });
        }
        if heartbeat {
            for result in ["ok", "failed"] {
                self.heartbeats
                    .get_or_create_owned(&HeartbeatLabels { result });
            }
        }
    }

    /// One self-alert notification (`raised`: an alert, else a recovery) about `kind` was
    /// stored as a new row.
    pub(crate) fn self_alert_stored(&self, kind: ConditionKind, raised: bool) {
        let labels = ConditionLabels {
            condition: kind.as_str(),
        };
        if raised {
            self.self_alerts_raised.get_or_create(&labels).inc();
        } else {
            self.self_alerts_recovered.get_or_create(&labels).inc();
        }
    }

    /// An alert about a failing channel had no other channel's list to go to.
    pub(crate) fn self_alert_unroutable(&self, kind: ConditionKind) {
        self.self_alerts_unroutable
            .get_or_create(&ConditionLabels {
                condition: kind.as_str(),
            })
            .inc();
    }

    /// The conditions raised now, per kind.
    pub(crate) fn set_self_alerts_active(
        &self,
        counts: &std::collections::BTreeMap<ConditionKind, usize>,
    ) {
        for (kind, n) in counts {
            self.self_alerts_active
                .get_or_create(&ConditionLabels {
                    condition: kind.as_str(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// A self-alert check could not read `figure`.
    pub(crate) fn self_alert_check_failed(&self, figure: &'static str) {
        debug_assert!(SELF_ALERT_FIGURES.contains(&figure), "{figure}");
        self.self_alert_check_failures
            .get_or_create(&CheckLabels { figure })
            .inc();
    }

    /// One call of the heartbeat URL; `ok` when it answered 2xx.
    pub(crate) fn heartbeat_called(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.heartbeats
            .get_or_create(&HeartbeatLabels { result })
            .inc();
    }

    /// Whether this node holds the dispatcher lease, and its epoch if known.
    pub(crate) fn set_lease(&self, held: bool, epoch: Option<i64>) {
        self.leader.set(i64::from(held));
        self.lease_epoch.set(epoch.unwrap_or(0));
    }

    /// One lease renewal took `took`; `failed` if it errored or timed out.
    pub(crate) fn lease_renewed(&self, took: Duration, failed: bool) {
        self.lease_renewals.observe(took.as_secs_f64());
        if failed {
            self.lease_renewal_failures.inc();
        }
    }

    /// One write of finished attempts' outcomes failed; it will be tried again.
    pub(crate) fn outcome_write_failed(&self) {
        self.outcome_write_failures.inc();
    }

    /// `records` outcomes were given up on after the claim timeout.
    pub(crate) fn outcomes_unrecorded(&self, records: u64) {
        self.outcomes_unrecorded.inc_by(records);
    }

    /// `channel` moved to provider `to` (0: its first) because of `why`.
    pub(crate) fn channel_moved(&self, channel: NotificationType, to: usize, why: &'static str) {
        let label = ChannelLabels {
            channel: channel.as_str(),
        };
        self.channel_provider
            .get_or_create(&label)
            .set(i64::try_from(to).unwrap_or(i64::MAX));
        self.channel_failovers
            .get_or_create(&FailoverLabels {
                channel: channel.as_str(),
                reason: why,
            })
            .inc();
    }

    /// `channel` is on provider `index` (0: its first) without having moved: its list of
    /// providers changed, which starts it on the first.
    pub(crate) fn set_channel_provider(&self, channel: NotificationType, index: usize) {
        self.channel_provider
            .get_or_create(&ChannelLabels {
                channel: channel.as_str(),
            })
            .set(i64::try_from(index).unwrap_or(i64::MAX));
    }

    /// Webhook list `list` moved to endpoint `to` (0: its own, n: its n-th fallback URL)
    /// because of `why`.
    pub(crate) fn list_moved(&self, list: &str, to: usize, why: &'static str) {
        self.set_list_provider(list, to);
        self.list_failovers
            .get_or_create(&ListFailoverLabels {
                list: list.to_owned(),
                reason: why,
            })
            .inc();
    }

    /// Webhook list `list` is on endpoint `index` without having moved (it is new to the
    /// dispatcher, or its endpoints changed).
    pub(crate) fn set_list_provider(&self, list: &str, index: usize) {
        self.list_provider
            .get_or_create(&ListLabels {
                list: list.to_owned(),
            })
            .set(i64::try_from(index).unwrap_or(i64::MAX));
    }

    /// Webhook list `list` has nothing to choose from any more (gone, no fallbacks, or another
    /// node dispatches): its gauge goes, so no alert watches a list nobody follows.
    pub(crate) fn forget_list_provider(&self, list: &str) {
        self.list_provider.remove(&ListLabels {
            list: list.to_owned(),
        });
    }

    /// `rows` claimed rows of `channel` were released unsent.
    pub(crate) fn claims_released(&self, channel: NotificationType, rows: u64) {
        self.claims_released
            .get_or_create(&ChannelLabels {
                channel: channel.as_str(),
            })
            .inc_by(rows);
    }

    /// The supervisor's series, registered here.
    pub(crate) fn supervision(&self) -> SupervisionMetrics {
        self.supervision.clone()
    }

    /// Counts what one purge pass deleted.
    pub(crate) fn purged(&self, report: &PurgeReport) {
        self.purged.inc_by(report.notifications);
        self.purged_parked.inc_by(report.parked);
    }

    /// Counts site nodes the purge forgot.
    pub(crate) fn site_nodes_forgotten(&self, nodes: usize) {
        self.site_nodes_forgotten
            .inc_by(u64::try_from(nodes).unwrap_or(u64::MAX));
    }

    /// Counts a failed step (one of [`CLAIM_STEPS`]) of `channel`'s claim.
    pub(crate) fn claim_failed(&self, channel: NotificationType, step: &'static str) {
        debug_assert!(CLAIM_STEPS.contains(&step), "{step}");
        self.claim_failures
            .get_or_create(&ClaimStepLabels {
                channel: channel.as_str(),
                step,
            })
            .inc();
    }

    /// Counts a failed read of the KPI gauges' figures.
    pub(crate) fn kpi_read_failed(&self) {
        self.kpi_read_failures.inc();
    }

    /// Counts a failed step (one of [`PURGE_STEPS`]) of a retention pass.
    pub(crate) fn purge_failed(&self, step: &'static str) {
        debug_assert!(PURGE_STEPS.contains(&step), "{step}");
        self.purge_failures
            .get_or_create(&PurgeStepLabels { step })
            .inc();
    }

    /// Counts what one turn of the escalation clock did.
    pub(crate) fn escalation_turn(&self, turn: &crate::records::EscalationTurn) {
        self.escalation_pages.inc_by(u64::from(turn.pages));
        self.escalation_late_pages.inc_by(u64::from(turn.late));
        self.escalation_exhausted.inc_by(u64::from(turn.exhausted));
        self.escalation_skipped.inc_by(u64::from(turn.skipped));
    }

    /// Counts a turn of the escalation clock the store refused.
    pub(crate) fn escalation_failed(&self) {
        self.escalation_failures.inc();
    }

    /// Counts final statuses sent back to a site.
    pub(crate) fn site_status_sent(&self, n: u64) {
        self.site_status_sent.inc_by(n);
    }

    /// A WatchSiteStatus stream opened (`true`) or ended.
    pub(crate) fn site_status_stream(&self, open: bool) {
        if open {
            self.site_status_streams.inc();
        } else {
            self.site_status_streams.dec();
        }
    }

    /// Counts a failed read of the feed's heads.
    pub(crate) fn site_status_poll_failed(&self) {
        self.site_status_poll_failures.inc();
    }

    /// Counts final statuses the purge dropped unconfirmed.
    pub(crate) fn site_status_dropped(&self, n: u64) {
        self.site_status_dropped.inc_by(n);
    }

    /// Counts one status callback call.
    pub(crate) fn status_callback_called(
        &self,
        outcome: crate::domain::status_callback::CallOutcome,
    ) {
        use crate::domain::status_callback::CallOutcome;
        let outcome = match outcome {
            CallOutcome::Answered => "answered",
            CallOutcome::Failed => "failed",
            CallOutcome::GivenUp => "given_up",
        };
        self.status_callback_calls
            .get_or_create(&CallOutcomeLabels { outcome })
            .inc();
    }

    /// Counts a status callback turn (or a call's record) the store refused.
    pub(crate) fn status_callback_failed(&self) {
        self.status_callback_failures.inc();
    }

    /// The changes waiting for their status callback, and the oldest one's age.
    pub(crate) fn status_callback_backlog(&self, waiting: u64, oldest: Duration) {
        self.status_callbacks_waiting
            .set(i64::try_from(waiting).unwrap_or(i64::MAX));
        self.status_callback_oldest.set(oldest.as_secs_f64());
    }

    /// Counts a health report refused because its site is full.
    pub(crate) fn site_health_refused(&self) {
        self.site_health_refused.inc();
    }

    /// Adds the failed-login counters (`auth::FailedLogins`, which counts them) to `/metrics`.
    pub(crate) fn with_failed_logins(mut self, logins: &crate::auth::FailedLogins) -> Self {
        logins.register(&mut self.registry);
        self
    }

    /// Adds the MS SQL pools' count of connections opened (only that store has pools).
    pub(crate) fn with_store_connections(
        mut self,
        opened: &crate::store::mssql::ConnectionsOpened,
    ) -> Self {
        opened.register(&mut self.registry);
        self
    }

    /// Whether ingest holds each site to its client certificate's name.
    pub(crate) fn set_sites_verified(&self, verified: bool) {
        self.site_identity_unverified.set(i64::from(!verified));
    }

    /// Replaces every KPI gauge; sites missing from `kpis` disappear from the per-site series.
    pub(crate) fn set_kpis(&self, kpis: &Kpis) {
        let _update = self
            .kpi_update
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let global = &self.kpis;
        let values = &kpis.global;
        global.queue_depth.set(count(values.queue_depth));
        global.stuck.set(count(values.stuck_count));
        global.parked.set(count(values.parked_count));
        global
            .delivered_recently
            .set(count(values.delivered_recently));
        global
            .oldest_pending_age
            .set(seconds(values.oldest_pending_age));
        global
            .oldest_retry_wait_age
            .set(seconds(values.oldest_retry_wait_age));

        let sites = &self.site_kpis;
        sites.queue_depth.clear();
        sites.stuck.clear();
        sites.parked.clear();
        sites.delivered_recently.clear();
        sites.oldest_pending_age.clear();
        sites.oldest_retry_wait_age.clear();
        for (site, values) in &kpis.sites {
            let KpiValues {
                queue_depth,
                stuck_count,
                parked_count,
                delivered_recently,
                oldest_pending_age,
                oldest_retry_wait_age,
            } = values;
            let labels = SiteLabels { site: site.clone() };
            sites
                .queue_depth
                .get_or_create(&labels)
                .set(count(*queue_depth));
            sites.stuck.get_or_create(&labels).set(count(*stuck_count));
            sites
                .parked
                .get_or_create(&labels)
                .set(count(*parked_count));
            sites
                .delivered_recently
                .get_or_create(&labels)
                .set(count(*delivered_recently));
            sites
                .oldest_pending_age
                .get_or_create(&labels)
                .set(seconds(*oldest_pending_age));
            sites
                .oldest_retry_wait_age
                .get_or_create(&labels)
                .set(seconds(*oldest_retry_wait_age));
        }
    }

    /// Replaces the site health gauges: one series set per node central has a report of
    /// (offline ones included, with `outbox_site_health_online` 0), none for the others.
    pub(crate) fn set_site_health(&self, nodes: &[NodeHealth]) {
        let _update = self
            .kpi_update
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let gauges = &self.site_health;
        gauges.online.clear();
        gauges.last_report_age.clear();
        gauges.buffer_depth.clear();
        gauges.oldest_buffered_age.clear();
        for node in nodes {
            let report = &node.stored.report;
            let labels = NodeLabels {
                site: report.site.as_str().to_owned(),
                node: report.node.as_str().to_owned(),
            };
            gauges
                .online
                .get_or_create(&labels)
                .set(i64::from(node.online));
            gauges
                .last_report_age
                .get_or_create(&labels)
                .set(node.report_age.as_secs_f64());
            gauges
                .buffer_depth
                .get_or_create(&labels)
                .set(count(report.buffer_depth));
            gauges
                .oldest_buffered_age
                .get_or_create(&labels)
                .set(report.oldest_buffered_age.as_secs_f64());
        }
    }

    /// Every metric in the OpenMetrics text format (ending in `# EOF`).
    pub(crate) fn render(&self) -> String {
        let _update = self
            .kpi_update
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut text = String::new();
        // Writing to a String cannot fail; an encoder error would be a bug in a metric.
        if let Err(error) = encode(&mut text, &self.registry) {
            tracing::error!(%error, "cannot encode the metrics");
        }
        text
    }
}

fn register_kpis(registry: &mut Registry, global: &KpiGauges, sites: &SiteKpiGauges) {
    registry.register(
        "outbox_queue_depth",
        "Notifications waiting for delivery (Pending + Retrying)",
        global.queue_depth.clone(),
    );
    registry.register(
        "outbox_stuck",
        "Pending or Retrying notifications older than the stuck threshold",
        global.stuck.clone(),
    );
    registry.register(
        "outbox_parked",
        "Parked notifications, waiting for an operator's Retry or Discard",
        global.parked.clone(),
    );
    registry.register(
        "outbox_delivered_recently",
        "Notifications delivered within the KPI window",
        global.delivered_recently.clone(),
    );
    registry.register_with_unit(
        "outbox_oldest_pending_age",
        "Age of the oldest notification due for the dispatcher now; 0 if none",
        Unit::Seconds,
        global.oldest_pending_age.clone(),
    );
    registry.register_with_unit(
        "outbox_oldest_retry_wait_age",
        "Age of the oldest Retrying notification still waiting out its retry delay; 0 if none",
        Unit::Seconds,
        global.oldest_retry_wait_age.clone(),
    );
    registry.register(
        "outbox_by_site_queue_depth",
        "outbox_queue_depth for one source site",
        sites.queue_depth.clone(),
    );
    registry.register(
        "outbox_by_site_stuck",
        "outbox_stuck for one source site",
        sites.stuck.clone(),
    );
    registry.register(
        "outbox_by_site_parked",
        "outbox_parked for one source site",
        sites.parked.clone(),
    );
    registry.register(
        "outbox_by_site_delivered_recently",
        "outbox_delivered_recently for one source site",
        sites.delivered_recently.clone(),
    );
    registry.register_with_unit(
        "outbox_by_site_oldest_pending_age",
        "outbox_oldest_pending_age_seconds for one source site",
        Unit::Seconds,
        sites.oldest_pending_age.clone(),
    );
    registry.register_with_unit(
        "outbox_by_site_oldest_retry_wait_age",
        "outbox_oldest_retry_wait_age_seconds for one source site",
        Unit::Seconds,
        sites.oldest_retry_wait_age.clone(),
    );
}

fn register_site_health(registry: &mut Registry, gauges: &SiteHealthGauges) {
    registry.register(
        "outbox_site_health_online",
        "1 while the site node's latest health report is younger than site_offline_after, else 0",
        gauges.online.clone(),
    );
    registry.register_with_unit(
        "outbox_site_health_last_report_age",
        "Time since central received the site node's latest health report",
        Unit::Seconds,
        gauges.last_report_age.clone(),
    );
    registry.register(
        "outbox_site_health_buffer_depth",
        "Notifications buffered at the site node, not yet acked by central, as last reported",
        gauges.buffer_depth.clone(),
    );
    registry.register_with_unit(
        "outbox_site_health_oldest_buffered_age",
        "Age of the oldest notification buffered at the site node, as last reported; 0 if none",
        Unit::Seconds,
        gauges.oldest_buffered_age.clone(),
    );
}

/// Where a channel's streak is kept.
fn streak_index(kind: NotificationType) -> usize {
    match kind {
        NotificationType::Email => 0,
        NotificationType::Webhook => 1,
    }
}

/// A count as a gauge value (gauges are i64; no table holds 2^63 rows).
fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// An optional age as gauge seconds, 0 when there is nothing to measure.
fn seconds(age: Option<Duration>) -> f64 {
    age.map_or(0.0, |age| age.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use metrics_endpoint::sample;

    use super::*;

    fn values(queue_depth: u64, pending_age: Option<u64>) -> KpiValues {
        KpiValues {
            queue_depth,
            stuck_count: 1,
            parked_count: 2,
            delivered_recently: 3,
            oldest_pending_age: pending_age.map(Duration::from_secs),
            oldest_retry_wait_age: None,
        }
    }

    #[test]
    fn known_series_start_at_zero_and_render_ends_in_eof() {
        let text = Metrics::new().render();
        assert!(text.ends_with("# EOF\n"), "{text}");
        for outcome in ["accepted", "duplicate", "conflict", "invalid"] {
            let series = format!("outbox_ingest_total{{outcome=\"{outcome}\"}}");
            assert_eq!(sample(&text, &series), Some(0.0), "{series}\n{text}");
        }
        let series = "outbox_delivery_attempts_total{channel=\"Email\",outcome=\"Delivered\"}";
        assert_eq!(sample(&text, series), Some(0.0), "{text}");
        assert_eq!(sample(&text, "outbox_dispatcher_leader"), Some(0.0));
        assert_eq!(sample(&text, "outbox_queue_depth"), Some(0.0));
        assert_eq!(sample(&text, "outbox_ingest_streams_open"), Some(0.0));
        assert_eq!(
            sample(&text, "outbox_ingest_streams_refused_total"),
            Some(0.0)
        );
        for step in PURGE_STEPS {
            let series = format!("outbox_purge_failures_total{{step=\"{step}\"}}");
            assert_eq!(sample(&text, &series), Some(0.0), "{series}\n{text}");
        }
        assert_eq!(sample(&text, "outbox_kpi_read_failures_total"), Some(0.0));
        for (channel, step) in [("Email", "settings"), ("Webhook", "claim")] {
            let series = format!(
                "outbox_dispatcher_claim_failures_total{{channel=\"{channel}\",step=\"{step}\"}}"
            );
            assert_eq!(sample(&text, &series), Some(0.0), "{series}\n{text}");
        }
        for listener in ["metrics", "console"] {
            let series =
                format!("outbox_http_connections_refused_total{{listener=\"{listener}\"}}");
            assert_eq!(sample(&text, &series), Some(0.0), "{series}\n{text}");
        }
        assert!(text.contains("# UNIT outbox_oldest_pending_age_seconds seconds\n"));
        assert!(
            !text.contains("outbox_by_site_queue_depth{"),
            "no sites yet"
        );
    }

    #[test]
    fn self_alert_series_exist_only_once_enabled_and_streaks_follow_attempts() {
        let metrics = Metrics::new();
        let text = metrics.render();
        let raised = "outbox_self_alerts_raised_total{condition=\"site_offline\"}";
        assert_eq!(sample(&text, raised), None, "off unless configured");
        let failures = "outbox_channel_consecutive_failures{channel=\"Email\"}";
        assert_eq!(sample(&text, failures), Some(0.0));
        metrics.enable_self_alerts(true);
        let text = metrics.render();
        assert_eq!(sample(&text, raised), Some(0.0), "{text}");
        assert_eq!(
            sample(
                &text,
                "outbox_self_alert_heartbeats_total{result=\"failed\"}"
            ),
            Some(0.0)
        );
        assert_eq!(
            sample(
                &text,
                "outbox_self_alert_check_failures_total{figure=\"queue\"}"
            ),
            Some(0.0),
            "a rule sees the first failed check"
        );
        let email = NotificationType::Email;
        for _ in 0..3 {
            metrics.attempt_finished(email, AttemptOutcome::TransientFailure, Duration::ZERO);
        }
        assert_eq!(metrics.channel_streak(email).consecutive_failures, 3);
        assert_eq!(sample(&metrics.render(), failures), Some(3.0));
        metrics.attempt_finished(email, AttemptOutcome::Delivered, Duration::ZERO);
        assert_eq!(sample(&metrics.render(), failures), Some(0.0));
        metrics.self_alert_stored(ConditionKind::SiteOffline, true);
        assert_eq!(sample(&metrics.render(), raised), Some(1.0));
    }

    #[test]
    fn ingest_outcomes_are_counted() {
        let metrics = Metrics::new();
        metrics.ingested(InsertOutcome::Accepted);
        metrics.ingested(InsertOutcome::Accepted);
        metrics.ingested(InsertOutcome::Duplicate);
        metrics.ingested(InsertOutcome::Conflict);
        metrics.ingest_rejected_invalid();
        let text = metrics.render();
        for (outcome, n) in [
            ("accepted", 2.0),
            ("duplicate", 1.0),
            ("conflict", 1.0),
            ("invalid", 1.0),
        ] {
            let series = format!("outbox_ingest_total{{outcome=\"{outcome}\"}}");
            assert_eq!(sample(&text, &series), Some(n), "{series}\n{text}");
        }
    }

    #[test]
    fn attempts_are_counted_and_timed_per_channel() {
        let metrics = Metrics::new();
        let email = NotificationType::Email;
        metrics.attempt_finished(email, AttemptOutcome::Delivered, Duration::from_millis(3));
        metrics.attempt_finished(
            email,
            AttemptOutcome::TransientFailure,
            Duration::from_secs(2),
        );
        metrics.attempt_finished(email, AttemptOutcome::Delivered, Duration::from_secs(90));
        let text = metrics.render();
        let attempts = |outcome: &str| {
            let series = format!(
                "outbox_delivery_attempts_total{{channel=\"Email\",outcome=\"{outcome}\"}}"
            );
            sample(&text, &series)
        };
        assert_eq!(attempts("Delivered"), Some(2.0), "{text}");
        assert_eq!(attempts("TransientFailure"), Some(1.0));
        assert_eq!(attempts("PermanentFailure"), Some(0.0));

        let histogram = "outbox_delivery_duration_seconds";
        assert!(
            text.contains(&format!("# TYPE {histogram} histogram\n")),
            "{text}"
        );
        let bucket = |le: &str| {
            sample(
                &text,
                &format!("{histogram}_bucket{{le=\"{le}\",channel=\"Email\"}}"),
            )
        };
        assert_eq!(bucket("0.005"), Some(1.0), "{text}");
        assert_eq!(bucket("1.0"), Some(1.0));
        assert_eq!(bucket("2.5"), Some(2.0));
        assert_eq!(bucket("60.0"), Some(2.0));
        assert_eq!(bucket("+Inf"), Some(3.0));
        let count = sample(&text, &format!("{histogram}_count{{channel=\"Email\"}}"));
        assert_eq!(count, Some(3.0));
        let sum = sample(&text, &format!("{histogram}_sum{{channel=\"Email\"}}")).unwrap();
        assert!((sum - 92.003).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn lease_gauges_follow_the_last_call() {
        let metrics = Metrics::new();
        metrics.set_lease(true, Some(7));
        let text = metrics.render();
        assert_eq!(sample(&text, "outbox_dispatcher_leader"), Some(1.0));
        assert_eq!(sample(&text, "outbox_dispatcher_lease_epoch"), Some(7.0));
        metrics.set_lease(false, None);
        let text = metrics.render();
        assert_eq!(sample(&text, "outbox_dispatcher_leader"), Some(0.0));
        assert_eq!(sample(&text, "outbox_dispatcher_lease_epoch"), Some(0.0));
    }

    #[test]
    fn site_health_gauges_follow_the_latest_reports() {
        use crate::domain::SiteId;
        use crate::domain::site_health::{
            NodeRole, SiteHealthReport, SiteHealthSnapshot, StoredSiteHealth,
        };
        let read_at = chrono::Utc::now();
        let node = |name: &str, depth: u64, age_secs: i64| StoredSiteHealth {
            report: SiteHealthReport {
                site: SiteId::parse("north".into()).unwrap(),
                node: SiteId::parse(name.into()).unwrap(),
                role: NodeRole::Active,
                buffer_depth: depth,
                oldest_buffered_age: Duration::from_secs(7),
                last_forward_at: None,
                standby_lag_rows: 0,
                standby_lag: Duration::ZERO,
                version: "0.1.0".into(),
                central_reachable: true,
                rejected: 0,
                sends_refused: false,
            },
            received_at: read_at - chrono::Duration::seconds(age_secs),
        };
        let snapshot = SiteHealthSnapshot {
            read_at,
            nodes: vec![node("north-a", 12, 4), node("north-b", 0, 400)],
        };
        let metrics = Metrics::new();
        metrics.set_site_health(&snapshot.assess(Duration::from_secs(180)));
        let text = metrics.render();
        for (series, value) in [
            (
                "outbox_site_health_online{site=\"north\",node=\"north-a\"}",
                1.0,
            ),
            (
                "outbox_site_health_online{site=\"north\",node=\"north-b\"}",
                0.0,
            ),
            (
                "outbox_site_health_last_report_age_seconds{site=\"north\",node=\"north-a\"}",
                4.0,
            ),
            (
                "outbox_site_health_buffer_depth{site=\"north\",node=\"north-a\"}",
                12.0,
            ),
            (
                "outbox_site_health_oldest_buffered_age_seconds{site=\"north\",node=\"north-b\"}",
                7.0,
            ),
        ] {
            assert_eq!(sample(&text, series), Some(value), "{series}\n{text}");
        }
        metrics.set_site_health(&[]);
        assert!(!metrics.render().contains("north-a"));
    }

    #[test]
    fn kpis_replace_the_gauges_and_vanished_sites_disappear() {
        let metrics = Metrics::new();
        metrics.set_kpis(&Kpis {
            global: KpiValues {
                oldest_retry_wait_age: Some(Duration::from_millis(1500)),
                ..values(10, Some(42))
            },
            sites: vec![
                ("site-a".into(), values(4, Some(42))),
                ("site-b".into(), values(6, None)),
            ],
        });
        let text = metrics.render();
        for (series, value) in [
            ("outbox_queue_depth", 10.0),
            ("outbox_stuck", 1.0),
            ("outbox_parked", 2.0),
            ("outbox_delivered_recently", 3.0),
            ("outbox_oldest_pending_age_seconds", 42.0),
            ("outbox_oldest_retry_wait_age_seconds", 1.5),
            ("outbox_by_site_queue_depth{site=\"site-a\"}", 4.0),
            ("outbox_by_site_queue_depth{site=\"site-b\"}", 6.0),
            ("outbox_by_site_stuck{site=\"site-b\"}", 1.0),
            ("outbox_by_site_parked{site=\"site-b\"}", 2.0),
            ("outbox_by_site_delivered_recently{site=\"site-b\"}", 3.0),
            (
                "outbox_by_site_oldest_pending_age_seconds{site=\"site-a\"}",
                42.0,
            ),
            (
                "outbox_by_site_oldest_pending_age_seconds{site=\"site-b\"}",
                0.0,
            ),
            (
                "outbox_by_site_oldest_retry_wait_age_seconds{site=\"site-a\"}",
                0.0,
            ),
        ] {
            assert_eq!(sample(&text, series), Some(value), "{series}\n{text}");
        }

        metrics.set_kpis(&Kpis {
            global: values(4, None),
            sites: vec![("site-a".into(), values(4, None))],
        });
        let text = metrics.render();
        assert_eq!(sample(&text, "outbox_queue_depth"), Some(4.0));
        assert_eq!(
            sample(&text, "outbox_oldest_pending_age_seconds"),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, "outbox_by_site_queue_depth{site=\"site-a\"}"),
            Some(4.0)
        );
        assert!(!text.contains("site-b"), "{text}");
    }
}
