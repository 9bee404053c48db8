//! The notifier alerts on itself (`[self_alerts]`, off unless configured): a watch that checks
//! central's own state every `check_interval` and sends what it finds as ordinary
//! notifications, to the lists the section names, through the store's ingest path
//! (`IngestStore::submit`), from the reserved source site [`SiteId::CENTRAL`]; and an optional
//! heartbeat ([`heartbeat`]) that calls an outside watchdog's URL while this node dispatches.
//!
//! Who watches what. The node holding the dispatcher lease watches everything it can see
//! (sites offline, failing channels, parked rising, held past their window, its tasks
//! restarting, its certificates expiring), so there is one watcher; every node watches the
//! lease itself, because with no leader there is no lease holder to notice. Conditions, their
//! keys, the episode rule and the routing are `domain::self_alert`.
//!
//! State. What is raised lives in the store, as the rows themselves: a node that starts
//! dispatching reads the latest self-alert row of each condition back (`adopt`), and before it
//! raises a condition it knows nothing of, it looks that condition's latest row up, so neither
//! a restart, a change of leader nor two replicas noticing the same missing leader repeats an
//! alert or forgets to recover it. The ids are name-based (`Transition::notification_id`), so
//! a race between two replicas stores one row. The watch keeps what it must remember between
//! checks (history of the Parked count, of task restarts) outside the task, so a restart by
//! the supervisor keeps it.
//!
//! Nothing here fails silently: a figure that cannot be read is counted
//! (`outbox_self_alert_check_failures_total{figure}`) and logged, and the conditions it decides
//! stay as they were; a notification the store refuses is planned again at the next check.

pub(crate) mod heartbeat;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_domain::ScriptOrigin;
use tokio::sync::{Mutex, Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::dispatcher::DISPATCHER_LEASE;
use crate::domain::kpi::Kpis;
use crate::domain::query::{NotificationFilter, PageRequest};
use crate::domain::self_alert::{
    Condition, ConditionKind, Observation, Reading, RiseWindow, Routes, SCRIPT, Tracker, Transition,
};
use crate::domain::site_health::NodeHealth;
use crate::domain::status::Status;
use crate::domain::webhook::cut_urls;
use crate::domain::{NotificationContent, NotificationType, Priority, SiteId, Submission};
use crate::kpi_gauges::KpiGauges;
use crate::metrics::Metrics;
use crate::records::{InsertOutcome, LeaseEpoch, NewNotification, NotificationState};
use crate::store::OutboxStore;
use crate::tls::WatchedCertificate;
use task_supervisor::SupervisionMetrics;

/// `[self_alerts]` checked: where the alerts go and when each condition counts. Bounds and
/// defaults are `config::SelfAlertsConfig`'s.
#[derive(Debug, Clone)]
pub struct SelfAlertSettings {
    pub routes: Routes,
    pub check_interval: Duration,
    /// How long a raised condition must be observed clear before its recovery is sent.
    pub recover_after: Duration,
    /// A channel is failing after this many transient failures in a row ...
    pub channel_failures: u32,
    /// ... or once one of its notifications has waited this long.
    pub channel_max_wait: Duration,
    /// Parked rising: by this many within `parked_window`.
    pub parked_rise: u32,
    pub parked_window: Duration,
    /// A Held row still Held this long after its window's end.
    pub held_grace: Duration,
    /// A task restarting this many times within `task_restart_window`.
    pub task_restarts: u32,
    pub task_restart_window: Duration,
    /// No node holding the dispatcher lease for this long.
    pub no_leader_after: Duration,
    /// A certificate expiring within this.
    pub certificate_expiry: Duration,
    pub heartbeat: Option<heartbeat::HeartbeatSettings>,
}

/// Rows of the reserved source read back when a node starts dispatching: the latest row per
/// condition among the newest this many. Self-alerts are rare (a handful per incident), so
/// this reaches back over months; a condition raised further back and never recovered is
/// looked up by its key when it is observed again.
const ADOPT_ROWS: usize = 2000;

/// Rows per page of that read.
const ADOPT_PAGE: usize = 500;

/// The watch's parts; cheap to clone (a restart by the supervisor starts from a clone).
pub(crate) struct SelfWatch<S> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    kpis: Arc<KpiGauges>,
    settings: Arc<SelfAlertSettings>,
    site_offline_after: Duration,
    node_id: Arc<str>,
    /// The dispatcher lease epoch this node holds, `None` while it does not.
    lease: watch::Receiver<Option<LeaseEpoch>>,
    supervision: SupervisionMetrics,
    certificates: Arc<[WatchedCertificate]>,
    /// Ingest's wake-up of this node's dispatcher: a stored alert goes out at once.
    wake: Arc<Notify>,
    /// False while every channel with a self-alert list is failing: alerts cannot reach anyone,
    /// so the heartbeat stops (the outside watchdog is then the alarm).
    routable: Arc<AtomicBool>,
    state: Arc<Mutex<WatchState>>,
    /// When this process started watching: a channel with no attempt since is judged idle only
    /// after `channel_max_wait`.
    started_at: DateTime<Utc>,
}

impl<S> Clone for SelfWatch<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            metrics: Arc::clone(&self.metrics),
            kpis: Arc::clone(&self.kpis),
            settings: Arc::clone(&self.settings),
            site_offline_after: self.site_offline_after,
            node_id: Arc::clone(&self.node_id),
            lease: self.lease.clone(),
            supervision: self.supervision.clone(),
            certificates: Arc::clone(&self.certificates),
            wake: Arc::clone(&self.wake),
            routable: Arc::clone(&self.routable),
            state: Arc::clone(&self.state),
            started_at: self.started_at,
        }
    }
}

/// What the watch remembers between checks, and across restarts of its task.
struct WatchState {
    tracker: Tracker,
    /// The epoch under which the dispatching node's conditions were read back from the store;
    /// `None` until they were (or while this node does not dispatch).
    adopted_for: Option<LeaseEpoch>,
    parked: RiseWindow,
    restarts: BTreeMap<&'static str, RiseWindow>,
    /// When a lease that was never taken was first seen missing.
    unleased_since: Option<DateTime<Utc>>,
    /// Whether the lists were checked against the store once.
    lists_checked: bool,
}

/// What [`SelfWatch::new`] is built from.
pub(crate) struct WatchParts<S> {
    pub store: Arc<S>,
    pub metrics: Arc<Metrics>,
    pub kpis: Arc<KpiGauges>,
    pub settings: SelfAlertSettings,
    pub site_offline_after: Duration,
    pub node_id: String,
    pub lease: watch::Receiver<Option<LeaseEpoch>>,
    pub certificates: Vec<WatchedCertificate>,
    pub wake: Arc<Notify>,
}

impl<S: OutboxStore> SelfWatch<S> {
    pub(crate) fn new(parts: WatchParts<S>) -> Self {
        let settings = parts.settings;
        let state = WatchState {
            tracker: Tracker::new(settings.recover_after),
            adopted_for: None,
            parked: RiseWindow::new(settings.parked_window),
            restarts: BTreeMap::new(),
            unleased_since: None,
            lists_checked: false,
        };
        parts
            .metrics
            .enable_self_alerts(settings.heartbeat.is_some());
        Self {
            supervision: parts.metrics.supervision(),
            store: parts.store,
            metrics: parts.metrics,
            kpis: parts.kpis,
            settings: Arc::new(settings),
            site_offline_after: parts.site_offline_after,
            node_id: parts.node_id.into(),
            lease: parts.lease,
            certificates: parts.certificates.into(),
            wake: parts.wake,
            routable: Arc::new(AtomicBool::new(true)),
            state: Arc::new(Mutex::new(state)),
            started_at: Utc::now(),
        }
    }

    /// Whether self-alerts have a list to go to (otherwise only the heartbeat runs).
    pub(crate) fn has_routes(&self) -> bool {
        !self.settings.routes.is_empty()
    }

    /// What the heartbeat needs to know of the watch: whether its alerts can reach anyone.
    pub(crate) fn routable(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.routable)
    }

    /// Checks every `check_interval` until `stop`.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.settings.check_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = self.check_once(Utc::now()) => {}
            }
        }
    }

    /// One check: observe, decide, store what was decided.
    pub(crate) async fn check_once(&self, now: DateTime<Utc>) {
        let mut state = self.state.lock().await;
        if !state.lists_checked {
            state.lists_checked = self.check_lists().await;
        }
        let mut observations = vec![self.no_leader(&mut state).await];
        let mut complete = Vec::new();
        let dispatching = *self.lease.borrow();
        if state.adopted_for.is_some() && state.adopted_for != dispatching {
            // Not (or no longer under the same epoch) the dispatcher: what only the dispatcher
            // watches is forgotten, and read back from the store when this node dispatches.
            self.forget_dispatcher_state(&mut state);
        }
        if let Some(epoch) = dispatching {
            if state.adopted_for.is_none() {
                match self.adopt(&mut state.tracker).await {
                    Ok(()) => state.adopted_for = Some(epoch),
                    Err(e) => {
                        self.metrics.self_alert_check_failed("history");
                        tracing::warn!(error = %e, "self-alerts: cannot read back the alerts raised before; trying again at the next check");
                    }
                }
            }
            if state.adopted_for.is_some() {
                self.observe_dispatcher(now, &mut state, &mut observations, &mut complete)
                    .await;
            }
        }
        // A condition observed active that this node knows nothing of may have been raised
        // by another replica or an earlier run: its latest row decides. Without it, the
        // condition waits for the next check (raising it blind could repeat an alert).
        for observation in &mut observations {
            if matches!(observation.reading, Reading::Active { .. })
                && !state.tracker.knows(&observation.condition.key)
                && let Err(e) = self
                    .adopt_one(&mut state.tracker, &observation.condition)
                    .await
            {
                self.metrics.self_alert_check_failed("history");
                tracing::warn!(error = %e, key = %observation.condition.key, "self-alerts: cannot look up a condition's latest alert");
                observation.reading = Reading::Unknown;
            }
        }
        let transitions = state.tracker.plan(now, observations, &complete);
        for transition in transitions {
            if self.store_transition(&transition).await {
                state.tracker.applied(&transition);
            }
        }
        let counts = state.tracker.raised_counts();
        self.metrics.set_self_alerts_active(&counts);
        self.routable
            .store(self.can_route(&state.tracker), Ordering::Relaxed);
    }

    fn forget_dispatcher_state(&self, state: &mut WatchState) {
        state
            .tracker
            .forget(|kind| !kind.watched_by_every_replica());
        state.adopted_for = None;
        state.parked = RiseWindow::new(self.settings.parked_window);
        state.restarts.clear();
    }

    /// Whether some configured list's channel is not failing.
    fn can_route(&self, tracker: &Tracker) -> bool {
        let routes = &self.settings.routes;
        let raised = tracker.raised_keys();
        [
            (NotificationType::Email, routes.email.is_some()),
            (NotificationType::Webhook, routes.webhook.is_some()),
        ]
        .into_iter()
        .filter(|(_, configured)| *configured)
        .any(|(kind, _)| !raised.contains(Condition::channel_failing(kind).key.as_str()))
    }

    /// Warns about a configured list that is missing or of the other channel (its alerts would
    /// park, with that reason on them). Returns whether the lists could be read.
    async fn check_lists(&self) -> bool {
        let routes = &self.settings.routes;
        for (key, kind, list) in [
            ("email_list", NotificationType::Email, &routes.email),
            ("webhook_list", NotificationType::Webhook, &routes.webhook),
        ] {
            let Some(name) = list else { continue };
            match self.store.list(name).await {
                Ok(Some(stored)) if stored.value.kind() == kind => {}
                Ok(Some(stored)) => tracing::warn!(
                    "self_alerts.{key}: list {name:?} is a {} list, not {kind}: its self-alerts \
                     will park",
                    stored.value.kind()
                ),
                Ok(None) => tracing::warn!(
                    "self_alerts.{key}: no list {name:?} is stored: its self-alerts will park \
                     until one is created"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "self-alerts: cannot read the lists");
                    return false;
                }
            }
        }
        true
    }

    /// Reads back the latest self-alert row of every condition among the newest rows.
    async fn adopt(&self, tracker: &mut Tracker) -> crate::store::Result<()> {
        let mut latest: BTreeMap<String, StoredAlert> = BTreeMap::new();
        let mut after = None;
        let mut read = 0;
        while read < ADOPT_ROWS {
            let page = self
                .store
                .query(PageRequest {
                    filter: central_rows(None),
                    after,
                    size: ADOPT_PAGE,
                })
                .await?;
            read += page.rows.len();
            for found in page.rows.iter().filter_map(StoredAlert::read) {
                // Newest first: the first row of a key is its latest.
                latest
                    .entry(found.condition.key.as_str().to_owned())
                    .or_insert(found);
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        for found in latest.into_values() {
            found.adopt(tracker);
        }
        Ok(())
    }

    /// Reads back the latest row of one condition, if any.
    async fn adopt_one(
        &self,
        tracker: &mut Tracker,
        condition: &Condition,
    ) -> crate::store::Result<()> {
        let page = self
            .store
            .query(PageRequest {
                filter: central_rows(Some(condition.key.as_str())),
                after: None,
                size: 1,
            })
            .await?;
        if let Some(found) = page.rows.first().and_then(StoredAlert::read) {
            found.adopt(tracker);
        }
        Ok(())
    }

    /// Whether some node holds the dispatcher lease: what every replica watches.
    async fn no_leader(&self, state: &mut WatchState) -> Observation {
        let condition = Condition::no_leader();
        let reading = match self.store.read_lease(DISPATCHER_LEASE).await {
            Err(e) => {
                self.metrics.self_alert_check_failed("lease");
                tracing::warn!(error = %e, "self-alerts: cannot read the dispatcher lease");
                Reading::Unknown
            }
            Ok(lease) if lease.is_held() => {
                state.unleased_since = None;
                Reading::Clear
            }
            Ok(lease) => {
                // Unheld since it expired; a lease never taken, since it was first seen so.
                let since = match &lease.record {
                    Some(record) => record.expires_at,
                    None => *state.unleased_since.get_or_insert(lease.read_at),
                };
                let gap = (lease.read_at - since).to_std().unwrap_or(Duration::ZERO);
                if gap >= self.settings.no_leader_after {
                    Reading::Active {
                        since,
                        detail: format!(
                            "No central-outbox node has held the dispatcher lease for more than \
                             {}: nothing is being delivered, on any channel, until one does. \
                             Every node tries to take it every few seconds, so none is running, \
                             or none can reach the database's lease table (see their logs). \
                             This alert itself goes out once a node dispatches again.",
                            text_duration(self.settings.no_leader_after)
                        ),
                    }
                } else {
                    Reading::Unknown
                }
            }
        };
        Observation { condition, reading }
    }

    /// What the dispatching node watches.
    async fn observe_dispatcher(
        &self,
        now: DateTime<Utc>,
        state: &mut WatchState,
        observations: &mut Vec<Observation>,
        complete: &mut Vec<ConditionKind>,
    ) {
        match self.kpis.fresh().await {
            Some((_, figures)) => {
                observations.extend(figures.sites.iter().map(|n| self.site(n)));
                complete.push(ConditionKind::SiteOffline);
                observations.push(self.parked(now, &mut state.parked, &figures.kpis));
            }
            None => {
                self.metrics.self_alert_check_failed("kpis");
                tracing::warn!("self-alerts: cannot read the KPIs and site health");
            }
        }
        for channel in [NotificationType::Email, NotificationType::Webhook] {
            observations.push(self.channel(now, channel).await);
        }
        observations.push(self.held(now).await);
        observations.extend(self.tasks(now, &mut state.restarts));
        complete.push(ConditionKind::TaskRestarting);
        observations.extend(self.certificates(now));
        complete.push(ConditionKind::CertificateExpiring);
    }

    fn site(&self, node: &NodeHealth) -> Observation {
        let report = &node.stored.report;
        let condition = Condition::site_offline(&report.site, &report.node);
        let reading = match node.offline_since {
            Some(since) if !node.online => Reading::Active {
                since,
                detail: format!(
                    "Central has had no health report from site {}, node {} ({}), since {} \
                     (site_offline_after is {}): the node is down, or cannot reach central. \
                     Notifications sent there wait in its buffer ({} when it last reported) \
                     until it is back.",
                    report.site,
                    report.node,
                    report.role.as_str().to_lowercase(),
                    node.stored.received_at.format("%Y-%m-%d %H:%M:%S UTC"),
                    text_duration(self.site_offline_after),
                    report.buffer_depth
                ),
            },
            _ => Reading::Clear,
        };
        Observation { condition, reading }
    }

    fn parked(&self, now: DateTime<Utc>, window: &mut RiseWindow, kpis: &Kpis) -> Observation {
        let parked = kpis.global.parked_count;
        let rise = window.record(now, parked);
        let reading = if rise.by >= u64::from(self.settings.parked_rise) {
            Reading::Active {
                since: now,
                detail: format!(
                    "{} notifications were parked within {} ({parked} are Parked now): they \
                     will not be delivered unless an operator retries them. Their LastError \
                     says why (outboxctl list --status parked).",
                    rise.by,
                    text_duration(self.settings.parked_window)
                ),
            }
        } else if rise.covered {
            Reading::Clear
        } else {
            Reading::Unknown
        };
        Observation {
            condition: Condition::parked_rising(),
            reading,
        }
    }

    /// A channel is failing by its streak of transient failures, or by a notification that has
    /// waited too long.
    async fn channel(&self, now: DateTime<Utc>, channel: NotificationType) -> Observation {
        let settings = &self.settings;
        let streak = self.metrics.channel_streak(channel).reading(
            channel,
            now,
            settings.channel_failures,
            settings.channel_max_wait,
            self.started_at,
        );
        let waiting = self
            .waiting_since(
                NotificationFilter {
                    statuses: vec![Status::Pending, Status::Retrying],
                    kind: Some(channel),
                    stuck_before: Some(before(now, settings.channel_max_wait)),
                    ..NotificationFilter::default()
                },
                "queue",
            )
            .await;
        let waited = match waiting {
            None => Reading::Unknown,
            Some(None) => Reading::Clear,
            Some(Some(row)) => Reading::Active {
                // Waiting since its arrival, or its scheduled time when later.
                since: after(row.waiting_since(), settings.channel_max_wait),
                detail: format!(
                    "{channel} notifications have waited longer than {} for delivery (one of \
                     list {:?} since {}, {} after {} attempts; last error: {}).",
                    text_duration(settings.channel_max_wait),
                    row.list_name,
                    row.waiting_since().format("%Y-%m-%d %H:%M:%S UTC"),
                    row.status,
                    row.retry_count,
                    row.last_error
                        .as_deref()
                        .map_or("none".into(), |e| cut_urls(e).into_owned())
                ),
            },
        };
        Observation {
            condition: Condition::channel_failing(channel),
            reading: streak.either(waited),
        }
    }

    async fn held(&self, now: DateTime<Utc>) -> Observation {
        let grace = self.settings.held_grace;
        let overdue = self
            .waiting_since(
                NotificationFilter {
                    statuses: vec![Status::Held],
                    stuck_before: Some(before(now, grace)),
                    ..NotificationFilter::default()
                },
                "held",
            )
            .await;
        let reading = match overdue {
            None => Reading::Unknown,
            Some(None) => Reading::Clear,
            Some(Some(row)) => Reading::Active {
                since: row.next_attempt_at.map_or(now, |due| after(due, grace)),
                detail: format!(
                    "Notifications of list {:?} held by flood consolidation are still Held more \
                     than {} after their window ended (one due at {}): their digest is not \
                     going out. Its attempts' errors say why (outboxctl list --status held).",
                    row.list_name,
                    text_duration(grace),
                    row.next_attempt_at.map_or("an unknown time".into(), |at| at
                        .format("%Y-%m-%d %H:%M:%S UTC")
                        .to_string())
                ),
            },
        };
        Observation {
            condition: Condition::held_overdue(),
            reading,
        }
    }

    /// One row matching `filter`, if any (`Some(None)`: none); `None` when the store did not
    /// answer (counted under `figure`).
    async fn waiting_since(
        &self,
        filter: NotificationFilter,
        figure: &'static str,
    ) -> Option<Option<NotificationState>> {
        match self
            .store
            .query(PageRequest {
                filter,
                after: None,
                size: 1,
            })
            .await
        {
            Ok(page) => Some(page.rows.into_iter().next()),
            Err(e) => {
                self.metrics.self_alert_check_failed(figure);
                tracing::warn!(error = %e, figure, "self-alerts: cannot read a figure");
                None
            }
        }
    }

    fn tasks(
        &self,
        now: DateTime<Utc>,
        windows: &mut BTreeMap<&'static str, RiseWindow>,
    ) -> Vec<Observation> {
        let settings = &self.settings;
        self.supervision
            .restart_counts()
            .into_iter()
            .map(|(task, restarts)| {
                let rise = windows
                    .entry(task)
                    .or_insert_with(|| {
                        // Every count starts at zero with the process: restarts before this
                        // node watched (before it dispatched) count within the window too.
                        let mut window = RiseWindow::new(settings.task_restart_window);
                        window.record(self.started_at, 0);
                        window
                    })
                    .record(now, restarts);
                let reading = if rise.by >= u64::from(settings.task_restarts) {
                    Reading::Active {
                        since: now,
                        detail: format!(
                            "The supervised task {task} of the dispatching node ({}) restarted \
                             {} times within {}: it keeps ending or panicking (its log says \
                             why). The node gives up and leaves its lease to another replica \
                             only past {} restarts a minute, so this can go on for long.",
                            self.node_id,
                            rise.by,
                            text_duration(settings.task_restart_window),
                            task_supervisor::MAX_RESTARTS
                        ),
                    }
                } else if rise.covered && rise.by == 0 {
                    Reading::Clear
                } else {
                    Reading::Unknown
                };
                Observation {
                    condition: Condition::task_restarting(task),
                    reading,
                }
            })
            .collect()
    }

    fn certificates(&self, now: DateTime<Utc>) -> Vec<Observation> {
        self.certificates
            .iter()
            .map(|cert| {
                let condition =
                    Condition::certificate_expiring(cert.key, &cert.subject, &cert.fingerprint);
                let warn_from = before(cert.not_after, self.settings.certificate_expiry);
                let reading = if now >= warn_from {
                    let when = cert.not_after.format("%Y-%m-%d %H:%M:%S UTC");
                    Reading::Active {
                        since: warn_from,
                        detail: if now >= cert.not_after {
                            format!(
                                "The certificate {} configured as tls.{} EXPIRED at {when}: \
                                 TLS handshakes with it fail. Replace the file and restart \
                                 central.",
                                cert.subject, cert.key
                            )
                        } else {
                            format!(
                                "The certificate {} configured as tls.{} expires at {when}. \
                                 Replace the file and restart central before then, or TLS \
                                 handshakes with it fail.",
                                cert.subject, cert.key
                            )
                        },
                    }
                } else {
                    Reading::Clear
                };
                Observation { condition, reading }
            })
            .collect()
    }

    /// Stores the notifications of `transition`, one per list it goes to. Returns whether they
    /// are stored (new, or already there: another replica's or an earlier run's).
    async fn store_transition(&self, transition: &Transition) -> bool {
        let condition = transition.condition();
        let (routes, routed) = self.settings.routes.lists_for(condition);
        if !routed {
            self.metrics.self_alert_unroutable(condition.kind);
            tracing::warn!(
                key = %condition.key,
                "self-alerts: no list on another channel for an alert about a failing channel; \
                 it is stored on the failing channel's own list"
            );
        }
        let mut batch = Vec::new();
        for route in routes {
            match self.submission(transition, route.kind, &route.list) {
                Ok(submission) => batch.push(NewNotification::new(submission)),
                Err(e) => {
                    // The texts are built within the limits; a failure here is a bug.
                    tracing::error!(error = %e, key = %condition.key, "self-alerts: cannot build a notification");
                }
            }
        }
        if batch.is_empty() {
            return false;
        }
        match self.store.submit(batch).await {
            Ok(outcomes) => {
                for outcome in outcomes {
                    match outcome {
                        InsertOutcome::Accepted => self
                            .metrics
                            .self_alert_stored(condition.kind, transition.is_raise()),
                        // Stored before, under the same id: by another replica noticing the
                        // same episode, or by this node before a restart (its text may differ
                        // in a figure). Either way the episode's notification exists.
                        InsertOutcome::Duplicate | InsertOutcome::Conflict => {}
                    }
                }
                if transition.is_raise() {
                    tracing::warn!(key = %condition.key, title = %condition.title, "self-alert raised");
                } else {
                    tracing::info!(key = %condition.key, title = %condition.title, "self-alert recovered");
                }
                self.wake.notify_one();
                true
            }
            Err(e) => {
                self.metrics.self_alert_check_failed("store");
                tracing::warn!(error = %e, key = %condition.key, "self-alerts: cannot store a notification; trying again at the next check");
                false
            }
        }
    }

    fn submission(
        &self,
        transition: &Transition,
        kind: NotificationType,
        list: &crate::domain::ListName,
    ) -> Result<Submission, crate::domain::ContentError> {
        let content = NotificationContent::parse(
            kind,
            list.as_str().to_owned(),
            transition.subject(),
            transition.body(),
            transition.type_data(),
        )?;
        // The node that stored it, within the field's rules.
        let instance: String = self
            .node_id
            .chars()
            .filter(|c| !c.is_control())
            .take(outbox_domain::limits::MAX_SOURCE_FIELD_CHARS)
            .collect();
        let origin = ScriptOrigin::parse(instance, SCRIPT.to_owned(), None, None)?;
        Ok(Submission {
            id: transition.notification_id(list),
            content,
            provenance: origin.at_site(SiteId::central(), transition.site_time()),
            // Ahead of everything queued, and never held back by flood consolidation.
            priority: Priority::Critical,
            condition_key: Some(transition.condition().key.clone()),
            cleared_at_site: None,
            deliver_after: None,
        })
    }
}

/// The filter of central's own rows (of one condition key).
fn central_rows(key: Option<&str>) -> NotificationFilter {
    NotificationFilter {
        source_site_id: Some(SiteId::CENTRAL.to_owned()),
        condition_key: key.map(str::to_owned),
        ..NotificationFilter::default()
    }
}

/// A stored row of the reserved source, read as a self-alert.
struct StoredAlert {
    condition: Condition,
    /// Whether it raised the condition (else it said it recovered).
    raised: bool,
    site_time: DateTime<Utc>,
}

impl StoredAlert {
    fn read(row: &NotificationState) -> Option<Self> {
        let key = row.condition_key.as_deref()?;
        let (condition, raised) = Condition::from_stored(key, &row.subject)?;
        Some(Self {
            condition,
            raised,
            site_time: row.site_enqueued_at,
        })
    }

    fn adopt(self, tracker: &mut Tracker) {
        tracker.adopt(self.condition, self.raised, self.site_time);
    }
}

fn before(at: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    at.checked_sub_signed(chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

fn after(at: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    at.checked_add_signed(chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A setting's duration as the config file writes it (`3m`, `10s`).
fn text_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}
