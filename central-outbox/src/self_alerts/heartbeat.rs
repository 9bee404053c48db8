//! The heartbeat: while this node dispatches and is healthy, it POSTs (an empty body) to an
//! outside watchdog's URL every `heartbeat_interval` (a dead man's switch such as
//! healthchecks.io, Grafana OnCall's or Better Stack's heartbeats), which alarms when the calls
//! stop. So central dying, its database gone, or no node dispatching is noticed by something
//! that does not depend on central, where the in-band alerts cannot help.
//!
//! Healthy, for a call: this node holds the dispatcher lease, the store takes a write now (the
//! health probe's empty transaction), and the self-alerts can reach someone (some channel with
//! a self-alert list is not failing). Otherwise the call is skipped, and the watchdog's alarm is
//! the alert. One node calls at a time (the lease holder), so a healthy cluster calls once per
//! interval, whichever node dispatches.
//!
//! It uses the webhook channel's HTTP client (hyper over rustls, the same roots and limits); a
//! call is bounded by the smaller of the interval and [`CALL_TIMEOUT`]. Each call is counted
//! (`outbox_self_alert_heartbeats_total{result}`), and a failed one is logged.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::delivery::http::HttpClient;
use crate::metrics::Metrics;
use crate::records::LeaseEpoch;
use crate::store::IngestStore;

/// Longest one call may take: a watchdog answers at once; one that does not is down, and the
/// next call comes soon.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// `self_alerts.heartbeat_url` and `heartbeat_interval`, checked (https, or http to loopback).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatSettings {
    pub url: String,
    pub interval: Duration,
}

/// The heartbeat's parts; a restart by the supervisor starts from a clone.
pub(crate) struct Heartbeat<S> {
    pub store: Arc<S>,
    pub metrics: Arc<Metrics>,
    pub http: HttpClient,
    pub settings: HeartbeatSettings,
    /// The dispatcher lease epoch this node holds, `None` while it does not.
    pub lease: watch::Receiver<Option<LeaseEpoch>>,
    /// False while no self-alert can reach anyone (`SelfWatch::routable`).
    pub routable: Arc<AtomicBool>,
}

impl<S> Clone for Heartbeat<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            metrics: Arc::clone(&self.metrics),
            http: self.http.clone(),
            settings: self.settings.clone(),
            lease: self.lease.clone(),
            routable: Arc::clone(&self.routable),
        }
    }
}

impl<S: IngestStore> Heartbeat<S> {
    /// Calls every interval while healthy, until `stop`.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut skipping: Option<&'static str> = None;
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            let why_not = tokio::select! {
                biased;
                () = stop.cancelled() => break,
                why_not = self.unhealthy() => why_not,
            };
            if let Some(why) = why_not {
                if skipping != Some(why) && why != NOT_DISPATCHING {
                    tracing::warn!(reason = why, "heartbeat: not calling the watchdog");
                }
                skipping = Some(why);
                continue;
            }
            if skipping.take().is_some_and(|why| why != NOT_DISPATCHING) {
                tracing::info!("heartbeat: healthy again, calling the watchdog");
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = self.call() => {}
            }
        }
    }

    /// Why this node should not call now, if it should not.
    async fn unhealthy(&self) -> Option<&'static str> {
        if self.lease.borrow().is_none() {
            return Some(NOT_DISPATCHING);
        }
        if self.store.ping().await.is_err() {
            return Some("the store does not take a write");
        }
        if !self.routable.load(Ordering::Relaxed) {
            return Some("every channel with a self-alert list is failing");
        }
        None
    }

    async fn call(&self) {
        let timeout = self.settings.interval.min(CALL_TIMEOUT);
        let agent = format!("central-outbox/{}", env!("CARGO_PKG_VERSION"));
        match self
            .http
            .post(
                &self.settings.url,
                &[("user-agent", agent)],
                Vec::new(),
                timeout,
            )
            .await
        {
            Ok(reply) if (200..300).contains(&reply.status) => self.metrics.heartbeat_called(true),
            Ok(reply) => {
                self.metrics.heartbeat_called(false);
                tracing::warn!(
                    status = reply.status,
                    "heartbeat: the watchdog answered with an error"
                );
            }
            Err(e) => {
                self.metrics.heartbeat_called(false);
                // The error never carries the URL (its path is often the watchdog's secret).
                tracing::warn!(error = %e, "heartbeat: cannot call the watchdog");
            }
        }
    }
}

/// The usual reason on every node but the dispatching one: not worth a log line.
const NOT_DISPATCHING: &str = "this node does not hold the dispatcher lease";
