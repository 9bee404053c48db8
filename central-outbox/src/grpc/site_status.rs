//! `NotificationIngest.WatchSiteStatus`: a site's final statuses, back down the link the site
//! holds. One session per stream: it starts (or renews) the site's watch, then sends the site's
//! unconfirmed changes (`SiteStatusStore`), oldest first, one batch at a time, and forgets a
//! batch's changes once the site confirms it stored them. Then it reads again; with nothing to
//! send it waits for a wake-up (`crate::status_feed`) or [`RECHECK_INTERVAL`].
//!
//! Invariants:
//! - A change leaves the feed only after the site confirmed the batch that carried it, so
//!   every change reaches the site at least once, across breaks and restarts of either end.
//! - Each read takes the oldest unconfirmed changes, never "those after the last one sent": a
//!   change that committed after a later one was read (MS SQL hands out seqs before commit) is
//!   still read next time. Within a batch, and across batches, a notification's changes keep
//!   their order, since a later change of it always has a higher seq.
//! - One batch is unconfirmed at a time, at most [`BATCH_CHANGES`] changes or about
//!   [`BATCH_BYTES`]: what a stream holds is bounded whatever the site does. A batch not
//!   confirmed within [`CONFIRM_TIMEOUT`] ends the stream (the site reconnects and gets it
//!   again).
//! - Reads of a stream that is not behind are at least [`READ_GAP`] apart, so that while the
//!   dispatcher records outcomes a few at a time their changes still go out in batches: each
//!   batch costs the single writer a delete (and its commit), and one round trip per outcome
//!   write cost dispatch about a fifth of its rate (`make bench`, site-status). A stream that is
//!   behind (its last batch was full) reads again at once.
//! - The watch is renewed when the stream opens and every [`RENEW_INTERVAL`] while it is open
//!   (far within the shortest `site_status_keep`, an hour), so the purge never drops the watch
//!   of a site that is watching.

use std::sync::Arc;
use std::time::Duration;

use outbox_proto::v1::{
    SiteStatusBatch, SiteStatusWatchMessage, site_status_watch_message::Message as WatchMessage,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use super::{convert, store_status};
use crate::domain::SiteId;
use crate::metrics::Metrics;
use crate::status_feed::{RECHECK_INTERVAL, StatusFeed};
use crate::store::SiteStatusStore;

/// Most changes per batch.
pub(crate) const BATCH_CHANGES: u32 = 500;
/// A batch closes once its encoded changes pass this size (well under the 4 MiB message limit).
pub(crate) const BATCH_BYTES: usize = 1 << 20;
/// Shortest time between two reads of a stream that is not behind: the most it adds to how soon
/// a site learns a status, bought for batches that do not cost the dispatcher (measured in
/// `BENCHMARKS.md`, "Final statuses back to the site").
pub(crate) const READ_GAP: Duration = Duration::from_millis(20);
/// How long the site has to confirm a batch.
pub(crate) const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);
/// How often an open stream renews its site's watch (far below any `site_status_keep`).
const RENEW_INTERVAL: Duration = Duration::from_secs(600);

/// Why a session ended; sent to the site as the stream's status.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WatchError {
    #[error("{0}")]
    Store(Status),
    #[error("batch {0} was not confirmed within {CONFIRM_TIMEOUT:?}")]
    Unconfirmed(u64),
    #[error("expected stored_batch {expected}, got {got:?}")]
    UnexpectedMessage { expected: u64, got: Option<String> },
    #[error("central is shutting down")]
    ShuttingDown,
}

impl WatchError {
    fn status(&self) -> Status {
        match self {
            Self::Store(status) => status.clone(),
            Self::Unconfirmed(_) => Status::deadline_exceeded(self.to_string()),
            Self::UnexpectedMessage { .. } => Status::invalid_argument(self.to_string()),
            Self::ShuttingDown => Status::unavailable(self.to_string()),
        }
    }
}

/// The site a stream's first message names, checked: `watch_site_id` must come first and be a
/// valid site id.
pub(crate) fn watched_site(first: Option<SiteStatusWatchMessage>) -> Result<SiteId, Status> {
    match first.and_then(|m| m.message) {
        Some(WatchMessage::WatchSiteId(site)) => SiteId::parse(site)
            .map_err(|e| Status::invalid_argument(format!("watch_site_id: {}", e.problem))),
        _ => Err(Status::invalid_argument(
            "watch_site_id: the first message must name the site to watch",
        )),
    }
}

/// One site's stream.
pub(crate) struct Session<S> {
    pub store: Arc<S>,
    pub feed: Arc<StatusFeed>,
    pub metrics: Arc<Metrics>,
    pub site: SiteId,
    pub out: mpsc::Sender<Result<SiteStatusBatch, Status>>,
}

impl<S: SiteStatusStore> Session<S> {
    /// Runs until the site goes away, the stream fails, or `shutdown`.
    pub(crate) async fn run(
        self,
        mut inbound: Streaming<SiteStatusWatchMessage>,
        shutdown: CancellationToken,
    ) {
        self.metrics.site_status_stream(true);
        let outcome = tokio::select! {
            outcome = self.serve(&mut inbound) => outcome,
            () = shutdown.cancelled() => Err(WatchError::ShuttingDown),
        };
        self.metrics.site_status_stream(false);
        match outcome {
            Ok(()) => tracing::debug!(site = %self.site, "site status stream ended"),
            Err(error) => {
                tracing::info!(site = %self.site, %error, "site status stream ended");
                let _ = self.out.send(Err(error.status())).await;
            }
        }
    }

    async fn serve(
        &self,
        inbound: &mut Streaming<SiteStatusWatchMessage>,
    ) -> Result<(), WatchError> {
        self.renew().await?;
        let wake = self.feed.subscribe(&self.site);
        let mut renew = tokio::time::interval(RENEW_INTERVAL);
        renew.tick().await;
        let mut batch_no = 0;
        let mut next_read = tokio::time::Instant::now();
        loop {
            tokio::time::sleep_until(next_read).await;
            let read_at = tokio::time::Instant::now();
            let changes = self
                .store
                .site_status_changes(&self.site, BATCH_CHANGES)
                .await
                .map_err(|e| WatchError::Store(store_status(e)))?;
            if changes.is_empty() {
                tokio::select! {
                    () = wake.notified() => {}
                    () = tokio::time::sleep(RECHECK_INTERVAL) => {}
                    _ = renew.tick() => self.renew().await?,
                    message = inbound.message() => match message {
                        // The site closed its side, or went away.
                        Ok(None) | Err(_) => return Ok(()),
                        Ok(Some(m)) => return Err(unexpected(batch_no, m)),
                    },
                    () = self.out.closed() => return Ok(()),
                }
                continue;
            }
            next_read = if changes.len() >= BATCH_CHANGES as usize {
                read_at
            } else {
                read_at + READ_GAP
            };
            batch_no += 1;
            let (batch, seqs) = batch_of(batch_no, changes);
            let sent = seqs.len() as u64;
            if self.out.send(Ok(batch)).await.is_err() {
                return Ok(());
            }
            self.metrics.site_status_sent(sent);
            let confirmed = tokio::time::timeout(CONFIRM_TIMEOUT, inbound.message())
                .await
                .map_err(|_| WatchError::Unconfirmed(batch_no))?;
            match confirmed {
                Ok(Some(SiteStatusWatchMessage {
                    message: Some(WatchMessage::StoredBatch(n)),
                })) if n == batch_no => {}
                Ok(None) | Err(_) => return Ok(()),
                Ok(Some(m)) => return Err(unexpected(batch_no, m)),
            }
            self.store
                .forget_site_status_changes(&self.site, seqs)
                .await
                .map_err(|e| WatchError::Store(store_status(e)))?;
        }
    }

    async fn renew(&self) -> Result<(), WatchError> {
        self.store
            .watch_site_status(&self.site)
            .await
            .map_err(|e| WatchError::Store(store_status(e)))
    }
}

fn unexpected(expected: u64, m: SiteStatusWatchMessage) -> WatchError {
    WatchError::UnexpectedMessage {
        expected,
        got: m.message.map(|m| format!("{m:?}")),
    }
}

/// The changes as one batch, cut at [`BATCH_BYTES`] (at least one change), and the seqs it
/// carries.
fn batch_of(
    batch: u64,
    changes: Vec<crate::records::SiteStatusChange>,
) -> (SiteStatusBatch, Vec<i64>) {
    let mut out = SiteStatusBatch {
        batch,
        changes: Vec::with_capacity(changes.len()),
    };
    let mut seqs = Vec::with_capacity(changes.len());
    let mut bytes = 0;
    for change in changes {
        if bytes >= BATCH_BYTES {
            break;
        }
        let change = convert::site_status_change(change);
        bytes += approximate_size(&change);
        seqs.push(change.seq);
        out.changes.push(change);
    }
    (out, seqs)
}

/// About the encoded size of `change`: its text fields and a margin for the rest (ids, times,
/// enums, field tags), which never exceeds a few hundred bytes.
fn approximate_size(change: &outbox_proto::v1::SiteStatusChange) -> usize {
    change.view.as_ref().map_or(0, |v| {
        v.subject.len()
            + v.last_error.len()
            + v.delivered_to.len()
            + v.list_name.len()
            + v.condition_key.len()
            + v.source_site_id.len()
    }) + 256
}
