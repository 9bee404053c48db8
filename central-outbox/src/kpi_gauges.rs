//! Keeps the KPI and site health gauges of `/metrics` current without letting scrapes load the
//! database, and serves the same figures to `GetKpis` (and so to the console's tiles, which
//! refresh every few seconds in every open browser tab).
//!
//! A scrape asks for fresh figures; [`KpiGauges::refresh`] starts one KPI query if none is
//! running and the last figures are older than [`REUSE`], and waits for it at most [`WAIT`].
//! A scrape that arrives while a query runs waits for that one instead of starting another, and a
//! query that outlasts the wait finishes in the background for the next scrape. On a busy MS SQL
//! server each scrape used to run its own KPI query (whole-table aggregates, seconds each there);
//! several watchers scraping piled them up and took the CPU the dispatcher and its lease needed,
//! and the scrapes themselves took seconds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::domain::kpi::Kpis;
use crate::domain::site_health::NodeHealth;
use crate::metrics::Metrics;
use crate::store::Result;

/// Figures younger than this are served again (to scrapes and to `GetKpis`).
pub(crate) const REUSE: Duration = Duration::from_secs(1);
/// Longest a scrape waits for a KPI query; after it, the gauges keep their last values. Well
/// inside Prometheus's default scrape timeout (10 s).
pub(crate) const WAIT: Duration = Duration::from_secs(2);

/// What one refresh reads: the KPIs, and each site node's health with the offline rule applied.
#[derive(Debug, Clone, Default)]
pub(crate) struct Figures {
    pub kpis: Kpis,
    pub sites: Vec<NodeHealth>,
}

/// Reads the figures now (the store's KPI and site health queries, in the service).
pub(crate) type ReadKpis = Box<dyn Fn() -> BoxFuture<'static, Result<Figures>> + Send + Sync>;

/// The KPI gauges' refresher; one per process, shared by every scrape.
pub(crate) struct KpiGauges {
    read: ReadKpis,
    metrics: Arc<Metrics>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// When the gauges were last set from a KPI query.
    read_at: Option<Instant>,
    /// What that query read, and when (wall clock, for `computed_at`).
    latest: Option<(chrono::DateTime<chrono::Utc>, Arc<Figures>)>,
    /// The query under way, if any: its receiver turns true when it has finished.
    running: Option<watch::Receiver<bool>>,
}

impl KpiGauges {
    pub(crate) fn new(read: ReadKpis, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            read,
            metrics,
            state: Mutex::new(State::default()),
        })
    }

    /// Brings the gauges up to date, as far as [`REUSE`] and [`WAIT`] allow.
    pub(crate) async fn refresh(self: &Arc<Self>) {
        let Some(mut done) = self.start_unless_fresh() else {
            return;
        };
        // Err: the query's task ended without a word (it panicked); the gauges stay as they were.
        let _ = tokio::time::timeout(WAIT, done.wait_for(|finished| *finished)).await;
    }

    /// Figures no older than [`REUSE`] and when they were computed, waiting for a query as long
    /// as it takes (an API call, unlike a scrape, wants the figures rather than an answer within
    /// [`WAIT`]); a query already under way is joined, not repeated. `None` when the query
    /// failed: the caller asks the store itself, to answer with its error.
    pub(crate) async fn fresh(
        self: &Arc<Self>,
    ) -> Option<(chrono::DateTime<chrono::Utc>, Arc<Figures>)> {
        if let Some(mut done) = self.start_unless_fresh() {
            // Err: the query's task panicked; what is below then reads stale figures as none.
            let _ = done.wait_for(|finished| *finished).await;
        }
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match (&state.latest, state.read_at) {
            (Some(latest), Some(at)) if at.elapsed() < REUSE => Some(latest.clone()),
            _ => None,
        }
    }

    /// Starts a query unless the figures are fresh; returns what turns true when the query
    /// under way (started now or before) has finished, or `None` if the figures are fresh.
    fn start_unless_fresh(self: &Arc<Self>) -> Option<watch::Receiver<bool>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.read_at.is_some_and(|at| at.elapsed() < REUSE) {
            return None;
        }
        Some(match &state.running {
            Some(running) => running.clone(),
            None => {
                let (finished, running) = watch::channel(false);
                state.running = Some(running.clone());
                tokio::spawn(Arc::clone(self).query(finished));
                running
            }
        })
    }

    async fn query(self: Arc<Self>, finished: watch::Sender<bool>) {
        let computed_at = chrono::Utc::now();
        let figures = (self.read)().await;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match figures {
            Ok(figures) => {
                self.metrics.set_kpis(&figures.kpis);
                self.metrics.set_site_health(&figures.sites);
                state.read_at = Some(Instant::now());
                state.latest = Some((computed_at, Arc::new(figures)));
            }
            // The scrape still answers (counters are valid); the KPI gauges keep their last
            // values, so the rules that watch them would see nothing new: the failure is
            // counted for its own rule (OutboxKpisUnreadable).
            Err(e) => {
                self.metrics.kpi_read_failed();
                tracing::warn!(error = %e, "metrics: cannot compute KPIs");
            }
        }
        state.running = None;
        finished.send_replace(true);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A KPI source that counts its queries, each taking `takes` on tokio's clock.
    fn counted(takes: Duration) -> (Arc<KpiGauges>, Arc<AtomicUsize>) {
        let queries = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&queries);
        let read: ReadKpis = Box::new(move || {
            let counter = Arc::clone(&counter);
            Box::pin(async move {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(takes).await;
                Ok(Figures::default())
            })
        });
        (KpiGauges::new(read, Arc::new(Metrics::new())), queries)
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_scrapes_share_one_query_and_reuse_its_figures() {
        let (gauges, queries) = counted(Duration::from_millis(100));
        let scrapes: Vec<_> = (0..5)
            .map(|_| {
                let gauges = Arc::clone(&gauges);
                tokio::spawn(async move { gauges.refresh().await })
            })
            .collect();
        for scrape in scrapes {
            scrape.await.unwrap();
        }
        assert_eq!(queries.load(Ordering::SeqCst), 1);
        // Within REUSE of the last figures: no query.
        gauges.refresh().await;
        assert_eq!(queries.load(Ordering::SeqCst), 1);
        tokio::time::sleep(REUSE).await;
        gauges.refresh().await;
        assert_eq!(queries.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn api_reads_wait_for_the_query_and_share_it_with_scrapes() {
        let (gauges, queries) = counted(WAIT * 3);
        let scrape = {
            let gauges = Arc::clone(&gauges);
            tokio::spawn(async move { gauges.refresh().await })
        };
        // Longer than a scrape would wait, and the same query.
        let started = tokio::time::Instant::now();
        assert!(gauges.fresh().await.is_some());
        assert_eq!(started.elapsed(), WAIT * 3);
        scrape.await.unwrap();
        assert!(gauges.fresh().await.is_some());
        assert_eq!(queries.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_query_gives_the_api_no_figures() {
        let read: ReadKpis = Box::new(|| {
            Box::pin(async { Err(crate::store::StoreError::Unavailable("down".into())) })
        });
        let metrics = Arc::new(Metrics::new());
        let gauges = KpiGauges::new(read, Arc::clone(&metrics));
        assert!(gauges.fresh().await.is_none());
        let counted = "outbox_kpi_read_failures_total 1\n";
        assert!(metrics.render().contains(counted), "{}", metrics.render());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_query_holds_a_scrape_no_longer_than_the_wait_and_is_not_repeated() {
        let (gauges, queries) = counted(WAIT * 10);
        let started = tokio::time::Instant::now();
        gauges.refresh().await;
        assert_eq!(started.elapsed(), WAIT);
        // The next scrape joins the query still under way instead of starting another.
        gauges.refresh().await;
        assert_eq!(queries.load(Ordering::SeqCst), 1);
        // Two waits have passed; the query finishes at 10 waits. Just after that, its figures
        // are served (for REUSE) without another query.
        tokio::time::sleep(WAIT * 8 + Duration::from_millis(100)).await;
        gauges.refresh().await;
        assert_eq!(queries.load(Ordering::SeqCst), 1);
    }
}
