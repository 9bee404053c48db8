//! Delivery-health KPIs: what operators watch on a dashboard and what `/metrics` exports. Computed
//! by the store from the Notifications table; the definitions live here so every backend and both
//! surfaces (the GetKpis RPC and Prometheus) mean the same thing by each figure.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// The figures, for all sites or for one source site.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KpiValues {
    /// Pending + Retrying + Held.
    pub queue_depth: u64,
    /// Pending/Retrying rows waiting for longer than the stuck threshold: since their CreatedAt,
    /// or a scheduled one's time (`schedule::waiting_since`).
    pub stuck_count: u64,
    pub parked_count: u64,
    /// Delivered within the KPI window (by DeliveredAt).
    pub delivered_recently: u64,
    /// Age of the oldest row waiting for the dispatcher now: Pending (a scheduled one once its
    /// time has come), or Retrying whose NextAttemptAt has passed. Ages count from CreatedAt, or
    /// from a scheduled row's time when later (`schedule::waiting_since`).
    pub oldest_pending_age: Option<Duration>,
    /// Age of the oldest row waiting out a delay: a Retrying row's retry delay, or a Held row's
    /// consolidation window (or its digest's retry delay). A scheduled row waiting for its time
    /// counts in neither age, only in the queue depth.
    pub oldest_retry_wait_age: Option<Duration>,
}

impl KpiValues {
    /// Whether every figure is zero or absent (such sites are left out of the breakdown).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The parameters of a KPI computation.
#[derive(Debug, Clone, Copy)]
pub struct KpiParams {
    pub now: DateTime<Utc>,
    pub stuck_age_threshold: Duration,
    pub delivered_window: Duration,
}

/// KPIs for all sites and per source site (sites with only zero figures are omitted).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Kpis {
    pub global: KpiValues,
    /// Sorted by site id.
    pub sites: Vec<(String, KpiValues)>,
}

/// The configured KPI definitions (`[kpis]` in the config file).
#[derive(Debug, Clone, Copy)]
pub struct KpiSettings {
    pub stuck_age_threshold: Duration,
    pub delivered_window: Duration,
}

impl KpiSettings {
    pub fn at(self, now: DateTime<Utc>) -> KpiParams {
        KpiParams {
            now,
            stuck_age_threshold: self.stuck_age_threshold,
            delivered_window: self.delivered_window,
        }
    }

    /// Whether a row of this status, waiting to be delivered since `waiting_since` (its
    /// creation, or its scheduled time when later: `schedule::waiting_since`), counts as stuck
    /// at `now`.
    pub fn is_stuck(
        self,
        status: super::status::Status,
        waiting_since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> bool {
        status.waits_in_turn() && stuck_cutoff(now, self.stuck_age_threshold) > waiting_since
    }
}

/// Rows created before this instant are stuck (if still live).
pub fn stuck_cutoff(now: DateTime<Utc>, threshold: Duration) -> DateTime<Utc> {
    now - chrono::Duration::from_std(threshold).unwrap_or(chrono::Duration::MAX)
}
