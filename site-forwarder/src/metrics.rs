//! The forwarder's Prometheus metrics, served on `metrics_listen` by the `metrics-endpoint`
//! crate.
//!
//! Counters (Sends committed, acks settled) are counted where the work happens, after the buffer
//! commit, so they never run ahead of the buffer. Every gauge is read at scrape time from the
//! same sources as `GetBufferStats` (the buffer's stats query, its room status, and snapshots
//! of the forwarding link's and the pair's figures), so the two surfaces cannot drift apart. A
//! scrape reads the buffer first and the counters as it encodes them, so one scrape may count an ack settled meanwhile whose row
//! its buffer gauges still show; the next scrape shows both.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use chrono::Utc;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use metrics_endpoint::{ListenerMetrics, ListenerStats};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use task_supervisor::SupervisionMetrics;

use crate::buffer::StatusReader;
use crate::domain::{ForwardSnapshot, PairStatus, Role};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

const ACCEPTED: OutcomeLabels = OutcomeLabels {
    outcome: "accepted",
};
const DUPLICATE: OutcomeLabels = OutcomeLabels {
    outcome: "duplicate",
};
const REJECTED: OutcomeLabels = OutcomeLabels {
    outcome: "rejected",
};

type SecondsGauge = Gauge<f64, AtomicU64>;

/// The `listener` label of the site's one HTTP listener.
const METRICS_LISTENER: &str = "metrics";

/// Every metric the forwarder exports. Shared by the `SiteNotify` service (Sends), the forwarder
/// (acks) and the scrape handler (everything else).
#[derive(Debug)]
pub(crate) struct SiteMetrics {
    registry: Registry,
    /// Restarts of the supervised tasks (the node, the health reporter, the room check).
    supervision: SupervisionMetrics,
    sends_accepted: Counter,
    forwarded: Family<OutcomeLabels, Counter>,
    buffer_depth: Gauge,
    buffer_rejected: Gauge,
    pending_clears: Gauge,
    pending_acks: Gauge,
    oldest_age: SecondsGauge,
    central_reachable: Gauge,
    /// 1 while central refuses this node's submits (PERMISSION_DENIED).
    forward_refused: Gauge,
    sends_refused: Gauge,
    buffer_bytes: Gauge,
    disk_available_bytes: Gauge,
    in_flight: Gauge,
    last_forward: SecondsGauge,
    pair_active: Gauge,
    pair_term: Gauge,
    pair_peer_connected: Gauge,
    standby_lag_rows: Gauge,
    standby_lag: SecondsGauge,
    active_silent: SecondsGauge,
    promotions: Counter,
    /// The final statuses central sends back (`crate::statuses`): whether the stream is open,
    /// how many arrived, how many are held.
    status_stream_up: Gauge,
    statuses_received: Counter,
    statuses_held: Gauge,
    /// The /metrics listener's own connections (see `metrics_endpoint::connections`).
    metrics_listener: ListenerStats,
    /// Held from setting the gauges to encoding them, so concurrent scrapes do not mix their
    /// gauge values.
    scrape: Mutex<()>,
}

impl Default for SiteMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl SiteMetrics {
    /// The supervisor's series, registered here.
    pub(crate) fn supervision(&self) -> SupervisionMetrics {
        self.supervision.clone()
    }

    pub(crate) fn new() -> Self {
        let mut registry = Registry::default();
        let supervision = SupervisionMetrics::default();
        supervision.register(&mut registry);
        let sends_accepted = Counter::default();
        registry.register(
            "outbox_site_sends_accepted",
            "Send calls answered with an id, i.e. committed to the buffer",
            sends_accepted.clone(),
        );
        let forwarded = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "outbox_site_forwarded",
            "Notifications acked by central and settled in the buffer, by ack outcome \
             (accepted, duplicate: deleted from the buffer; rejected: moved to the rejected table)",
            forwarded.clone(),
        );
        for labels in [ACCEPTED, DUPLICATE, REJECTED] {
            // Present at 0 from the start, so rate() sees the first ack.
            forwarded.get_or_create_owned(&labels);
        }
        let buffer_depth = Gauge::default();
        registry.register(
            "outbox_site_buffer_depth",
            "Notifications in the buffer waiting for central's ack",
            buffer_depth.clone(),
        );
        let buffer_rejected = Gauge::default();
        registry.register(
            "outbox_site_buffer_rejected",
            "Notifications central rejected, kept in the local rejected table",
            buffer_rejected.clone(),
        );
        let pending_clears = Gauge::default();
        registry.register(
            "outbox_site_pending_clears",
            "Condition keys cleared at the site whose clear central has not applied yet (it waits \
             for the rows buffered before it to be forwarded, and for central)",
            pending_clears.clone(),
        );
        let pending_acks = Gauge::default();
        registry.register(
            "outbox_site_pending_acknowledgements",
            "Acknowledgements made at the site that central has not applied yet (they wait for \
             the rows buffered before them to be forwarded, and for central)",
            pending_acks.clone(),
        );
        let oldest_age = SecondsGauge::default();
        registry.register_with_unit(
            "outbox_site_buffer_oldest_age",
            "Age of the oldest notification in the buffer; 0 when it is empty",
            Unit::Seconds,
            oldest_age.clone(),
        );
        let central_reachable = Gauge::default();
        registry.register(
            "outbox_site_central_reachable",
            "1 while the forwarding stream to central is open, else 0",
            central_reachable.clone(),
        );
        let forward_refused = Gauge::default();
        registry.register(
            "outbox_site_forward_refused",
            "1 while central refuses this node's submits (PERMISSION_DENIED: with client \
             certificates required, its certificate names another site than site_id), else 0. \
             Nothing is lost: every notification stays buffered and the forwarder retries with \
             a backoff up to a minute; GetBufferStats.forward_refused_reason says why",
            forward_refused.clone(),
        );
        let sends_refused = Gauge::default();
        registry.register(
            "outbox_site_sends_refused",
            "1 while the buffer refuses Sends to keep room on its disk for deleting what central \
             acks (min_free_disk_bytes, max_buffer_bytes; GetBufferStats says which), else 0",
            sends_refused.clone(),
        );
        let buffer_bytes = Gauge::default();
        registry.register_with_unit(
            "outbox_site_buffer",
            "Bytes of the buffer file holding data (its pages in use)",
            Unit::Bytes,
            buffer_bytes.clone(),
        );
        let disk_available_bytes = Gauge::default();
        registry.register_with_unit(
            "outbox_site_buffer_disk_available",
            "Bytes available on the buffer's filesystem as of the last check; 0 if unreadable",
            Unit::Bytes,
            disk_available_bytes.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "outbox_site_in_flight",
            "Submits sent on the stream and not yet acked by central",
            in_flight.clone(),
        );
        let last_forward = SecondsGauge::default();
        registry.register_with_unit(
            "outbox_site_last_forward_timestamp",
            "Unix time of the last accepted or duplicate ack; 0 if none since start",
            Unit::Seconds,
            last_forward.clone(),
        );
        let pair_active = Gauge::default();
        registry.register(
            "outbox_site_pair_active",
            "1 while this node is the active one (a single node always is), 0 as standby",
            pair_active.clone(),
        );
        let pair_term = Gauge::default();
        registry.register(
            "outbox_site_pair_term",
            "The pair's term as this node knows it; every promotion raises it",
            pair_term.clone(),
        );
        let pair_peer_connected = Gauge::default();
        registry.register(
            "outbox_site_pair_peer_connected",
            "Active: 1 while a standby follows it. Standby: 1 while it follows the active",
            pair_peer_connected.clone(),
        );
        let standby_lag_rows = Gauge::default();
        registry.register(
            "outbox_site_standby_lag_rows",
            "Active: Sends committed here that the standby has not yet confirmed as durable",
            standby_lag_rows.clone(),
        );
        let standby_lag = SecondsGauge::default();
        registry.register_with_unit(
            "outbox_site_standby_lag",
            "Active: age of the oldest Send the standby has not yet confirmed; 0 when none",
            Unit::Seconds,
            standby_lag.clone(),
        );
        let active_silent = SecondsGauge::default();
        registry.register_with_unit(
            "outbox_site_active_silent",
            "Standby: time since it last heard from the active; it promotes itself at \
             pair.failover_timeout",
            Unit::Seconds,
            active_silent.clone(),
        );
        let promotions = Counter::default();
        registry.register(
            "outbox_site_promotions",
            "Times this process promoted its node to active",
            promotions.clone(),
        );
        let status_stream_up = Gauge::default();
        registry.register(
            "outbox_site_status_stream_up",
            "Active: 1 while the stream of final statuses from central (WatchSiteStatus) is \
             open, else 0 (statuses then wait at central; GetStatus answers from those held)",
            status_stream_up.clone(),
        );
        let statuses_received = Counter::default();
        registry.register(
            "outbox_site_statuses_received",
            "Final statuses central sent back and this node stored (a status may come twice)",
            statuses_received.clone(),
        );
        let statuses_held = Gauge::default();
        registry.register(
            "outbox_site_statuses_held",
            "Final statuses held for GetStatus and WatchStatus, as of the last prune",
            statuses_held.clone(),
        );
        let metrics_listener = ListenerMetrics::register(&mut registry, &[METRICS_LISTENER])
            .listener(METRICS_LISTENER);
        Self {
            supervision,
            registry,
            metrics_listener,
            pair_active,
            pair_term,
            pair_peer_connected,
            standby_lag_rows,
            standby_lag,
            active_silent,
            promotions,
            status_stream_up,
            statuses_received,
            statuses_held,
            sends_accepted,
            forwarded,
            buffer_depth,
            buffer_rejected,
            pending_clears,
            pending_acks,
            oldest_age,
            central_reachable,
            forward_refused,
            sends_refused,
            buffer_bytes,
            disk_available_bytes,
            in_flight,
            last_forward,
            scrape: Mutex::new(()),
        }
    }

    /// Counts one Send committed to the buffer.
    pub(crate) fn send_accepted(&self) {
        self.sends_accepted.inc();
    }

    /// Whether the status stream from central is open.
    pub(crate) fn status_stream_up(&self, up: bool) {
        self.status_stream_up.set(i64::from(up));
    }

    /// Counts final statuses stored.
    pub(crate) fn statuses_received(&self, n: usize) {
        self.statuses_received.inc_by(n as u64);
    }

    /// How many final statuses are held.
    pub(crate) fn statuses_held(&self, n: u64) {
        self.statuses_held.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Counts a promotion of this node to active.
    pub(crate) fn promoted(&self) {
        self.promotions.inc();
    }

    /// Counts acks whose settlement the buffer has committed.
    pub(crate) fn forwarded(&self, accepted: usize, duplicate: usize, rejected: usize) {
        for (labels, n) in [
            (ACCEPTED, accepted),
            (DUPLICATE, duplicate),
            (REJECTED, rejected),
        ] {
            if n > 0 {
                self.forwarded
                    .get_or_create(&labels)
                    .inc_by(u64::try_from(n).unwrap_or(u64::MAX));
            }
        }
    }

    /// Reads the buffer, then `figures` (the link's and the pair's), and renders every metric as OpenMetrics
    /// text. If the buffer cannot be read, its gauges keep their last values (and a warning is
    /// logged); the rest is still current.
    pub(crate) async fn render(
        &self,
        buffer: &StatusReader,
        figures: impl FnOnce() -> (ForwardSnapshot, PairStatus),
    ) -> String {
        let stats = buffer.stats().await;
        let room = buffer.room_status();
        let (forward, pair) = figures();
        let now = Utc::now();
        let _scrape = self.scrape.lock().unwrap_or_else(PoisonError::into_inner);
        match stats {
            Ok(stats) => {
                self.buffer_depth.set(gauge_count(stats.depth));
                self.buffer_rejected.set(gauge_count(stats.rejected));
                self.pending_clears.set(gauge_count(stats.pending_clears));
                self.pending_acks.set(gauge_count(stats.pending_acks));
                self.oldest_age.set(stats.oldest_age_seconds(now));
            }
            Err(error) => {
                tracing::warn!(%error, "metrics: cannot read the buffer; its gauges are stale");
            }
        }
        self.central_reachable
            .set(i64::from(forward.central_reachable));
        self.forward_refused
            .set(i64::from(forward.refused.is_some()));
        self.sends_refused.set(i64::from(room.refusing.is_some()));
        self.buffer_bytes.set(gauge_count(room.buffer_bytes));
        self.disk_available_bytes
            .set(gauge_count(room.disk_available_bytes.unwrap_or(0)));
        self.in_flight.set(gauge_count(forward.in_flight));
        self.last_forward.set(
            forward
                .last_forward_at
                .map_or(0.0, |at| at.timestamp_millis() as f64 / 1000.0),
        );
        self.pair_active.set(i64::from(pair.role == Role::Active));
        self.pair_term
            .set(i64::try_from(pair.term).unwrap_or(i64::MAX));
        self.pair_peer_connected.set(i64::from(pair.peer_connected));
        self.standby_lag_rows
            .set(gauge_count(pair.standby_lag_rows));
        self.standby_lag.set(pair.standby_lag_seconds);
        self.active_silent.set(pair.active_silent_seconds);
        let mut text = String::new();
        // Writing to a String cannot fail; an encoder error would be a bug in a metric.
        if let Err(error) = encode(&mut text, &self.registry) {
            tracing::error!(%error, "cannot encode the metrics");
        }
        text
    }

    /// The figures [`metrics_endpoint::serve`] counts the /metrics connections in.
    pub(crate) fn metrics_listener(&self) -> ListenerStats {
        self.metrics_listener.clone()
    }

    /// The `render` function [`metrics_endpoint::serve`] calls on each scrape.
    pub(crate) fn scraper(
        self: Arc<Self>,
        buffer: StatusReader,
        figures: impl Fn() -> (ForwardSnapshot, PairStatus) + Clone + Send + Sync + 'static,
    ) -> impl Fn() -> BoxFuture<'static, String> + Clone + Send + Sync + 'static {
        move || {
            let (metrics, buffer, figures) = (Arc::clone(&self), buffer.clone(), figures.clone());
            async move { metrics.render(&buffer, figures).await }.boxed()
        }
    }
}

/// A count as a gauge value (gauges are i64).
fn gauge_count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use metrics_endpoint::sample;

    use super::*;

    #[test]
    fn counters_start_at_zero_and_count_by_outcome() {
        let metrics = SiteMetrics::new();
        metrics.send_accepted();
        metrics.send_accepted();
        metrics.forwarded(3, 1, 0);
        metrics.forwarded(0, 0, 2);
        let mut text = String::new();
        encode(&mut text, &metrics.registry).unwrap();
        assert_eq!(sample(&text, "outbox_site_sends_accepted_total"), Some(2.0));
        for (outcome, n) in [("accepted", 3.0), ("duplicate", 1.0), ("rejected", 2.0)] {
            let series = format!("outbox_site_forwarded_total{{outcome=\"{outcome}\"}}");
            assert_eq!(sample(&text, &series), Some(n), "{series}\n{text}");
        }
        assert!(
            text.contains("# UNIT outbox_site_buffer_oldest_age_seconds seconds\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[tokio::test]
    async fn pair_gauges_show_the_role_and_the_term() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = crate::buffer::Buffer::open(&dir.path().join("b.db"))
            .unwrap()
            .status();
        let pair = crate::pair::Pair::new(
            &crate::config::Config::new("site-a"),
            crate::domain::RoleState {
                role: Role::Standby,
                term: 7,
            },
        );
        let metrics = SiteMetrics::new();
        metrics.promoted();
        let text = metrics
            .render(&buffer, || (ForwardSnapshot::default(), pair.status()))
            .await;
        assert_eq!(
            sample(&text, "outbox_site_pair_active"),
            Some(0.0),
            "{text}"
        );
        assert_eq!(sample(&text, "outbox_site_pair_term"), Some(7.0));
        assert_eq!(sample(&text, "outbox_site_pair_peer_connected"), Some(0.0));
        assert_eq!(sample(&text, "outbox_site_standby_lag_rows"), Some(0.0));
        assert_eq!(sample(&text, "outbox_site_promotions_total"), Some(1.0));
    }
}
