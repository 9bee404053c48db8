//! The status follower: takes the final statuses central sends back over
//! `NotificationIngest.WatchSiteStatus` (Delivered with when and to whom, Parked with its
//! reason, ...), stores each batch in the buffer file, and confirms it to central only then.
//! `GetStatus` and `WatchStatus` answer from what it stored, also while central is away.
//!
//! Invariants:
//! - A batch is confirmed only after it is durably stored, so central forgets a status only
//!   once this node has it (and a standby gets it by replication).
//! - After any break (connect failure, stream error or end, a damaged change) it opens the
//!   stream again `forward_retry_interval` after the last attempt began; central sends again
//!   everything not confirmed. A central that does not implement the call (older) is asked
//!   again after [`MAX_REFUSED_BACKOFF`].
//! - `outbox_site_status_stream_up` says whether the stream is open, so an alert rule sees a
//!   node that gets no statuses back while it forwards.
//! - Every [`PRUNE_INTERVAL`] (and at start) the statuses past `[statuses]`'s bounds go.
//! - It runs beside the forwarder (inside [`crate::forwarder::Forwarder::run`]), so only on the
//!   active node.

use std::sync::Arc;
use std::time::Duration;

use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use outbox_proto::v1::{
    SiteStatusWatchMessage, site_status_watch_message::Message as WatchMessage,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

use crate::buffer::{BufferError, Statuses};
use crate::config::{Config, StatusesConfig};
use crate::forwarder::MAX_REFUSED_BACKOFF;
use crate::link::error_chain;
use crate::metrics::SiteMetrics;
use crate::wire;

/// How often the statuses past `[statuses]`'s bounds are pruned.
const PRUNE_INTERVAL: Duration = Duration::from_secs(600);

/// Why a status stream ended (the follower opens it again).
#[derive(Debug, thiserror::Error)]
pub(crate) enum FollowError {
    #[error("central did not open the status stream: {} ({:?})", error_chain(.0), .0.code())]
    Open(tonic::Status),
    #[error("central did not answer the status stream request within {0:?}")]
    OpenTimeout(Duration),
    #[error("the status stream broke: {} ({:?})", error_chain(.0), .0.code())]
    Stream(tonic::Status),
    #[error("central closed the status stream")]
    Closed,
    #[error("central sent a status this node cannot store: {0}")]
    Damaged(String),
    #[error(transparent)]
    Buffer(#[from] BufferError),
}

/// Follows central's statuses for this site and keeps them pruned.
#[derive(Debug)]
pub(crate) struct StatusFollower {
    buffer: Statuses,
    /// Lazily connected on the endpoint the forwarder uses.
    central: NotificationIngestClient<Channel>,
    site_id: String,
    retry_interval: Duration,
    open_timeout: Duration,
    bounds: StatusesConfig,
    metrics: Arc<SiteMetrics>,
}

impl StatusFollower {
    pub(crate) fn new(
        buffer: Statuses,
        endpoint: &Endpoint,
        config: &Config,
        metrics: Arc<SiteMetrics>,
    ) -> Self {
        Self {
            buffer,
            central: NotificationIngestClient::new(endpoint.connect_lazy()),
            site_id: config.site_id.clone(),
            retry_interval: config.forward_retry_interval,
            open_timeout: config.request_timeout,
            bounds: config.statuses,
            metrics,
        }
    }

    /// Follows until `shutdown`, reopening the stream after every break, and prunes.
    pub(crate) async fn run(&self, shutdown: &CancellationToken) {
        tokio::join!(self.follow(shutdown), self.prune(shutdown));
    }

    async fn follow(&self, shutdown: &CancellationToken) {
        let mut reported = false;
        loop {
            let started = Instant::now();
            let ended = tokio::select! {
                () = shutdown.cancelled() => return,
                ended = self.session() => ended,
            };
            self.metrics.status_stream_up(false);
            let unimplemented =
                matches!(&ended, FollowError::Open(s) if s.code() == Code::Unimplemented);
            let next = if unimplemented {
                Instant::now() + MAX_REFUSED_BACKOFF
            } else {
                started + self.retry_interval
            };
            if unimplemented {
                tracing::error!(
                    "central does not implement WatchSiteStatus (an older central): no final \
                     statuses come back, and GetStatus asks central for every forwarded \
                     notification; upgrade central"
                );
            } else if reported {
                tracing::debug!(error = %ended, "the status stream is still down");
            } else {
                tracing::warn!(error = %ended, "the status stream from central ended; reopening");
                reported = true;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep_until(next) => {}
            }
        }
    }

    /// One stream: the watch, then store and confirm each batch until it ends.
    async fn session(&self) -> FollowError {
        let (confirm, outbound) = mpsc::channel(4);
        let hello = SiteStatusWatchMessage {
            message: Some(WatchMessage::WatchSiteId(self.site_id.clone())),
        };
        if confirm.send(hello).await.is_err() {
            return FollowError::Closed;
        }
        let mut central = self.central.clone();
        let opened = tokio::time::timeout(
            self.open_timeout,
            central.watch_site_status(ReceiverStream::new(outbound)),
        )
        .await;
        let mut inbound = match opened {
            Err(_) => return FollowError::OpenTimeout(self.open_timeout),
            Ok(Err(status)) => return FollowError::Open(status),
            Ok(Ok(response)) => response.into_inner(),
        };
        self.metrics.status_stream_up(true);
        loop {
            let batch = match inbound.message().await {
                Ok(Some(batch)) => batch,
                Ok(None) => return FollowError::Closed,
                Err(status) => return FollowError::Stream(status),
            };
            let received = batch.changes.len();
            let statuses = match batch
                .changes
                .into_iter()
                .map(wire::central_status_from_proto)
                .collect::<Result<Vec<_>, String>>()
            {
                Ok(statuses) => statuses,
                Err(problem) => return FollowError::Damaged(problem),
            };
            if let Err(e) = self.buffer.store(statuses).await {
                return FollowError::Buffer(e);
            }
            self.metrics.statuses_received(received);
            let stored = SiteStatusWatchMessage {
                message: Some(WatchMessage::StoredBatch(batch.batch)),
            };
            if confirm.send(stored).await.is_err() {
                return FollowError::Closed;
            }
        }
    }

    async fn prune(&self, shutdown: &CancellationToken) {
        let mut tick = tokio::time::interval(PRUNE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            match self
                .buffer
                .prune(self.bounds.retention, self.bounds.max_rows)
                .await
            {
                Ok(0) => {}
                Ok(pruned) => tracing::debug!(pruned, "pruned final statuses past [statuses]"),
                Err(error) => {
                    tracing::warn!(%error, "cannot prune the final statuses; trying again later");
                }
            }
            match self.buffer.count().await {
                Ok(held) => self.metrics.statuses_held(held),
                Err(error) => tracing::debug!(%error, "cannot count the final statuses"),
            }
        }
    }
}
