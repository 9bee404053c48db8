//! The central half of a site's `ClearCondition`. The local half is done when the RPC returns:
//! the key's buffered rows are marked (they reach central as cleared) and a pending clear is
//! committed with them. This task asks central to clear the key's notifications it received
//! before the clear, as soon as the watermark rule allows (`PendingClears::due`: every row
//! buffered before the clear has left the buffer), and deletes the pending clear once central
//! applied it. The forwarder, for its part, holds back the key's rows buffered after the clear
//! until then (`PendingClears::holds`), so the clear ends exactly what came before it.
//!
//! Invariants:
//! - A pending clear leaves the buffer only after central answered it (OK, or UNIMPLEMENTED: a
//!   central that predates ClearCondition can never apply it, and keeping it would hold the
//!   key's later notifications forever). Any other failure is retried after the forwarder's
//!   `forward_retry_interval`, so a clear outlives any central outage and any restart.
//! - It runs beside the forwarder (inside [`crate::forwarder::Forwarder::run`]), so only on the
//!   active node, and waits on events (a change to the pending clears, rows leaving the buffer,
//!   the retry interval after a failure), never on a polling timer.

use std::time::Duration;

use outbox_proto::v1::ClearConditionRequest;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request};

use crate::buffer::{BufferError, Clears};
use crate::central_half::{self, CentralHalf, Wakeups};
use crate::config::Config;
use crate::domain::{PendingClear, PendingClears, Seq};
use crate::link::error_chain;

/// Why a round of clears stopped (the sender retries after the retry interval).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClearError {
    #[error("central did not answer the clear of {key} within {timeout:?}")]
    Timeout { key: String, timeout: Duration },
    #[error(
        "central did not apply the clear of {key}: {} ({:?})",
        error_chain(.status),
        .status.code()
    )]
    Central { key: String, status: tonic::Status },
    #[error(transparent)]
    Buffer(#[from] BufferError),
}

/// Sends the pending clears to central's `NotificationIngest.ClearCondition`.
#[derive(Debug)]
pub(crate) struct ClearSender {
    buffer: Clears,
    /// Lazily connected: tonic reconnects it as needed, on the endpoint the forwarder uses.
    central: NotificationIngestClient<Channel>,
    central_url: String,
    /// Whose keys they are: central clears only this site's notifications.
    site_id: String,
    retry_interval: Duration,
    timeout: Duration,
}

impl ClearSender {
    pub(crate) fn new(buffer: Clears, endpoint: &Endpoint, config: &Config) -> Self {
        Self {
            buffer,
            central: NotificationIngestClient::new(endpoint.connect_lazy()),
            central_url: config.central_url.clone(),
            site_id: config.site_id.clone(),
            retry_interval: config.forward_retry_interval,
            timeout: config.request_timeout,
        }
    }

    /// Sends every clear as it becomes due until `shutdown`.
    pub(crate) async fn run(&self, shutdown: &CancellationToken) {
        let wakeups = Wakeups {
            pending: self.buffer.pending_clears(),
            changes: self.buffer.row_changes(),
        };
        central_half::run(
            self,
            wakeups,
            &self.central_url,
            self.retry_interval,
            shutdown,
        )
        .await;
    }

    async fn apply_at_central(&self, clear: &PendingClear) -> Result<(), ClearError> {
        let key = clear.condition_key.as_str();
        let mut request = Request::new(ClearConditionRequest {
            condition_key: key.to_owned(),
            source_site_id: self.site_id.clone(),
        });
        // Tells central the deadline too, so it stops working on an answer nobody awaits.
        request.set_timeout(self.timeout);
        let mut central = self.central.clone();
        match tokio::time::timeout(self.timeout, central.clear_condition(request)).await {
            Err(_) => Err(ClearError::Timeout {
                key: key.to_owned(),
                timeout: self.timeout,
            }),
            Ok(Ok(response)) => {
                tracing::info!(
                    condition_key = key,
                    cleared = response.into_inner().cleared,
                    up_to_seq = clear.up_to.0,
                    "central applied a clear of this site"
                );
                Ok(())
            }
            Ok(Err(status)) if status.code() == Code::Unimplemented => {
                tracing::error!(
                    condition_key = key, central = %self.central_url,
                    "central does not implement ClearCondition (an older central); the clear \
                     is dropped: notifications of this key central already holds stay as they \
                     are. Upgrade central to clear them"
                );
                Ok(())
            }
            Ok(Err(status)) => Err(ClearError::Central {
                key: key.to_owned(),
                status,
            }),
        }
    }
}

impl CentralHalf for ClearSender {
    type Pending = PendingClears;
    type Item = PendingClear;
    type Error = ClearError;
    const WHAT: &'static str = "clear";

    fn is_empty(pending: &PendingClears) -> bool {
        pending.is_empty()
    }

    fn due(pending: &PendingClears, oldest_buffered: Option<Seq>) -> Vec<PendingClear> {
        pending.due(oldest_buffered).cloned().collect()
    }

    async fn oldest_seq(&self) -> Result<Option<Seq>, BufferError> {
        self.buffer.oldest_seq().await
    }

    async fn apply(&self, clear: &PendingClear) -> Result<(), Self::Error> {
        self.apply_at_central(clear).await
    }

    async fn forget(&self, clear: PendingClear) -> Result<bool, BufferError> {
        self.buffer.forget_clear(clear).await
    }
}
