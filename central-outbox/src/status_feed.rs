//! Wakes the site status streams (`grpc::site_status`) when their site has new changes.
//!
//! The changes themselves are rows (`SiteStatusStore`), written by the database in the
//! transaction that set each status, so nothing here can lose one: this only decides how soon a
//! stream reads them. One task per process asks the store which sites have changes after the
//! newest seq it saw, after each outcome write of this node's dispatcher (most final statuses;
//! at most once per [`READ_GAP`]) and every [`POLL_INTERVAL`] otherwise (those another
//! replica's dispatcher, an operator or an ingest decided), and wakes those sites' streams. A
//! stream also reads again every [`RECHECK_INTERVAL`] on its own, which covers a change
//! committed after a later seq was seen (MS SQL hands out identities before commit) and a failed
//! poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::domain::SiteId;
use crate::grpc::site_status::READ_GAP;
use crate::metrics::Metrics;
use crate::store::SiteStatusStore;

/// Longest a change decided elsewhere waits before its site's stream is woken.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Longest a stream waits before reading its site's changes again, woken or not.
pub(crate) const RECHECK_INTERVAL: Duration = Duration::from_secs(5);

/// The streams waiting for their sites' changes.
#[derive(Debug, Default)]
pub(crate) struct StatusFeed {
    waiting: Mutex<HashMap<SiteId, Vec<Weak<Notify>>>>,
}

impl StatusFeed {
    /// A wake-up for one stream of `site`, notified whenever the site has new changes; the
    /// stream holds it for as long as it lives.
    pub(crate) fn subscribe(&self, site: &SiteId) -> Arc<Notify> {
        let wake = Arc::new(Notify::new());
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let streams = waiting.entry(site.clone()).or_default();
        streams.retain(|w| w.strong_count() > 0);
        streams.push(Arc::downgrade(&wake));
        wake
    }

    fn watched(&self) -> bool {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        waiting.retain(|_, streams| {
            streams.retain(|w| w.strong_count() > 0);
            !streams.is_empty()
        });
        !waiting.is_empty()
    }

    fn wake(&self, sites: &[SiteId]) {
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        for site in sites {
            for wake in waiting
                .get(site)
                .into_iter()
                .flatten()
                .filter_map(Weak::upgrade)
            {
                // Stores a permit when the stream is busy, so it reads again when done.
                wake.notify_one();
            }
        }
    }

    /// Polls until `stop`, after each notification of `recorded` and every [`POLL_INTERVAL`],
    /// while any stream watches. A failed poll is counted (`outbox_site_status_polls_failed_total`)
    /// and the streams fall back to their own [`RECHECK_INTERVAL`].
    pub(crate) async fn run<S: SiteStatusStore>(
        self: Arc<Self>,
        store: Arc<S>,
        metrics: Arc<Metrics>,
        recorded: Arc<Notify>,
        stop: CancellationToken,
    ) {
        let mut head = 0;
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next_poll = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = recorded.notified() => {}
                _ = tick.tick() => {}
            }
            if !self.watched() {
                continue;
            }
            // At most one poll per READ_GAP: a stream does not read more often than that anyway,
            // and the outcome writes that notify `recorded` come hundreds a second.
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(next_poll) => {}
            }
            next_poll = tokio::time::Instant::now() + READ_GAP;
            match store.site_status_heads(head).await {
                Ok((sites, newest)) => {
                    head = newest;
                    self.wake(&sites);
                }
                Err(error) => {
                    metrics.site_status_poll_failed();
                    tracing::warn!(%error, "cannot read the site status feed's heads; streams read on their own every few seconds");
                }
            }
        }
    }
}
