//! Delivery-health KPIs: what operators watch on a dashboard and what `/metrics` exports. Computed
//! by the store from the Notifications table; the definitions live here so every backend and both
//! surfaces (the GetKpis RPC and Prometheus) mean the same thing by each figure.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// The figures, for all sites or for one source site.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KpiValues {
    /// Pending + Retrying.
    pub queue_depth: u64,
    /// Pending/Retrying rows whose CreatedAt is older than the stuck threshold.
    pub stuck_count: u64,
    pub parked_count: u64,
    /// Delivered within the KPI window (by DeliveredAt).
    pub delivered_recently: u64,
    /// Age since CreatedAt of the oldest row waiting for the dispatcher now: Pending, or Retrying
    /// whose NextAttemptAt has passed.
    pub oldest_pending_age: Option<Duration>,
    /// Age since CreatedAt of the oldest Retrying row still waiting out its retry delay.
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
