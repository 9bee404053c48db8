//! The retention purge: deletes terminal notifications (Delivered, Parked, Discarded) resolved
//! longer ago than `terminal_retention`, with their history, in bounded batches so the write lock
//! is never held for long. Live rows are never touched: the store's statement only selects
//! terminal statuses.
//!
//! Parked rows are purged too (the retention bounds the table whatever happens), but never
//! silently: each pass that removes any logs a WARN with their count, and
//! `outbox_purged_parked_notifications_total` counts them, so failures nobody acted on are not
//! lost without a trace.
//!
//! It also forgets site nodes whose latest health report is `site_health_retention` old (by the
//! database's clock, which stamped it): a node renamed, rebuilt or retired would otherwise stay
//! in ListSiteHealth and `/metrics` for ever and keep its place among its site's
//! `MAX_NODES_PER_SITE`. The retention is longer than `site_offline_after` (checked at start), so
//! a silent node is shown offline first; each pass that forgets any logs them at WARN and counts
//! them in `outbox_site_nodes_forgotten_total`.
//!
//! It runs on the dispatcher lease holder only (one replica does the work, the others skip it),
//! once on becoming leader and then every `purge_interval`. A failure of either part is logged
//! and does not stop the other.
//!
//! A batch takes the database's write lock (SQLite's single writer; on MS SQL, the locks and log
//! of a thousand deletes), which the dispatcher's claims and outcomes wait for. Back to back,
//! the batches of a large purge (a million rows after the retention was shortened, or on the
//! first day a year of history expires) took half of it and halved the dispatch. So after each
//! full batch the purge waits [`PAUSE_PER_BATCH`] times as long as the batch took, which bounds
//! its share of the write lock whatever the database's speed, and grows the pause by itself when
//! the batch had to queue behind a busy dispatcher.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use chrono::Utc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::domain::SiteId;
use crate::metrics::Metrics;
use crate::records::{LeaseEpoch, PurgeReport, SiteStatusPurge};
use crate::store::{DispatchStore, SiteStatusStore, StoreError};

/// `[retention]` in the config file.
#[derive(Debug, Clone, Copy)]
pub struct PurgeSettings {
    pub terminal_retention: Duration,
    /// A site node silent this long is forgotten.
    pub site_health_retention: Duration,
    /// A final status no site confirmed within this, and a site status watch not renewed
    /// within it, are dropped.
    pub site_status_keep: Duration,
    pub interval: Duration,
    pub batch_size: u32,
}

/// Runs until `shutdown`: waits for leadership, purges, sleeps `interval`, again.
pub(crate) async fn run<S: DispatchStore + SiteStatusStore>(
    store: Arc<S>,
    metrics: Arc<Metrics>,
    settings: PurgeSettings,
    mut lease: watch::Receiver<Option<LeaseEpoch>>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            held = lease.wait_for(Option::is_some) => {
                if held.is_err() {
                    // The dispatcher is gone, so this node will never lead again.
                    return;
                }
            }
        }
        match purge_once(store.as_ref(), settings, &shutdown).await {
            Ok(report) => {
                metrics.purged(&report);
                log(&report, settings.terminal_retention);
            }
            Err(e) => {
                metrics.purge_failed("notifications");
                tracing::error!(error = %e, "purge failed; retrying next interval");
            }
        }
        match store
            .forget_silent_nodes(settings.site_health_retention)
            .await
        {
            Ok(forgotten) => {
                metrics.site_nodes_forgotten(forgotten.len());
                log_forgotten(&forgotten, settings.site_health_retention);
            }
            Err(e) => {
                metrics.purge_failed("site_health");
                tracing::error!(
                    error = %e,
                    "forgetting silent site nodes failed; retrying next interval"
                );
            }
        }
        match purge_site_status(store.as_ref(), settings, &shutdown).await {
            Ok(dropped) => {
                metrics.site_status_dropped(dropped.changes);
                if dropped.changes > 0 || dropped.watchers > 0 {
                    tracing::warn!(
                        changes = dropped.changes,
                        watches = dropped.watchers,
                        keep = %humantime::format_duration(settings.site_status_keep),
                        "dropped final statuses no site took within retention.site_status_keep \
                         (and the watches of sites not heard from for as long); those sites \
                         answer GetStatus for them from central"
                    );
                }
            }
            Err(e) => {
                metrics.purge_failed("site_status");
                tracing::error!(error = %e, "purging the site status feed failed; retrying next interval");
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(settings.interval) => {}
        }
    }
}

/// Drops the site status feed's old changes and watches in batches until a batch comes back
/// short (or shutdown); returns the totals.
async fn purge_site_status<S: SiteStatusStore>(
    store: &S,
    settings: PurgeSettings,
    shutdown: &CancellationToken,
) -> Result<SiteStatusPurge, StoreError> {
    let mut total = SiteStatusPurge::default();
    loop {
        let started = Instant::now();
        let batch = store
            .purge_site_status(settings.site_status_keep, settings.batch_size)
            .await?;
        total.changes += batch.changes;
        total.watchers += batch.watchers;
        let full = u64::from(settings.batch_size);
        if (batch.changes < full && batch.watchers < full) || !pause_after(started, shutdown).await
        {
            return Ok(total);
        }
    }
}

fn log(report: &PurgeReport, retention: Duration) {
    let retention = humantime::format_duration(retention);
    if report.parked > 0 {
        tracing::warn!(
            parked = report.parked,
            %retention,
            "purged Parked notifications that no operator retried or discarded within the \
             retention; their content and history are gone"
        );
    }
    if report.notifications > 0 || report.incidents > 0 {
        tracing::info!(
            notifications = report.notifications,
            parked = report.parked,
            history_entries = report.history_entries,
            incidents = report.incidents,
            %retention,
            "purged terminal notifications past retention"
        );
    } else {
        tracing::debug!("purge: nothing past retention");
    }
}

/// Most forgotten nodes named in one log line; the rest are counted.
const MAX_NODES_LOGGED: usize = 20;

/// After each full batch the purge waits this many times the batch's duration: it holds the
/// write lock at most a sixth of the time (`make bench`, `--only history`: the dispatch during
/// a purge of a million rows).
pub(crate) const PAUSE_PER_BATCH: u32 = 5;

/// Waits [`PAUSE_PER_BATCH`] times as long as the batch begun at `started` took; false when
/// `shutdown` came first.
async fn pause_after(started: Instant, shutdown: &CancellationToken) -> bool {
    let pause = started.elapsed().saturating_mul(PAUSE_PER_BATCH);
    tokio::select! {
        () = shutdown.cancelled() => false,
        () = tokio::time::sleep(pause) => true,
    }
}

fn log_forgotten(forgotten: &[(SiteId, SiteId)], retention: Duration) {
    if forgotten.is_empty() {
        return;
    }
    let named: Vec<String> = forgotten
        .iter()
        .take(MAX_NODES_LOGGED)
        .map(|(site, node)| format!("{}/{}", site.as_str(), node.as_str()))
        .collect();
    tracing::warn!(
        count = forgotten.len(),
        nodes = %named.join(", "),
        retention = %humantime::format_duration(retention),
        "forgot site nodes that have not reported for the site health retention; they no \
         longer show in site health (a node that reports again is shown again)"
    );
}

/// Deletes batches until one comes back short (or shutdown). Returns the totals.
pub(crate) async fn purge_once<S: DispatchStore>(
    store: &S,
    settings: PurgeSettings,
    shutdown: &CancellationToken,
) -> Result<PurgeReport, StoreError> {
    let retention =
        chrono::Duration::from_std(settings.terminal_retention).unwrap_or(chrono::Duration::MAX);
    // One cutoff for the whole pass, so it ends even while rows keep resolving.
    let cutoff = Utc::now()
        .checked_sub_signed(retention)
        .unwrap_or(chrono::DateTime::<Utc>::MIN_UTC);
    let mut total = PurgeReport::default();
    while !shutdown.is_cancelled() {
        let started = Instant::now();
        let batch = store.purge_terminal(cutoff, settings.batch_size).await?;
        total.notifications += batch.notifications;
        total.parked += batch.parked;
        total.history_entries += batch.history_entries;
        total.incidents += batch.incidents;
        if batch.notifications < u64::from(settings.batch_size)
            && batch.incidents < u64::from(settings.batch_size)
        {
            break;
        }
        if !pause_after(started, shutdown).await {
            break;
        }
    }
    Ok(total)
}
