//! The central half of a site's `Acknowledge`. The local half is done when the RPC returns: the
//! key's pending acknowledgement is committed at the current watermark. This task asks central
//! (`NotificationIngest.AcknowledgeCondition`) to acknowledge the key's open incidents once the
//! watermark rule allows (`PendingAcks::due`: every row buffered before it has left the buffer,
//! so the alarm it answers reached central first), and forgets it once central applied it.
//!
//! Invariants:
//! - A pending acknowledgement leaves the buffer only after central answered it (OK, or
//!   UNIMPLEMENTED: a central that predates AcknowledgeCondition can never apply it; that is
//!   logged at ERROR and the escalation goes on, which the people it pages will notice). Any
//!   other failure is retried after `forward_retry_interval`, so it outlives any central outage
//!   and any restart; `outbox_site_pending_acknowledgements` shows what waits.
//! - It runs beside the forwarder (inside [`crate::forwarder::Forwarder::run`]), so only on the
//!   active node, on the events of `crate::central_half`.

use std::time::Duration;

use outbox_proto::v1::AcknowledgeConditionRequest;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request};

use crate::buffer::{Acks, BufferError};
use crate::central_half::{self, CentralHalf, Wakeups};
use crate::config::Config;
use crate::domain::{PendingAck, PendingAcks, Seq};
use crate::link::error_chain;

/// Why a round of acknowledgements stopped (the sender retries after the retry interval).
#[derive(Debug, thiserror::Error)]
pub(crate) enum AckError {
    #[error("central did not answer the acknowledgement of {key} within {timeout:?}")]
    Timeout { key: String, timeout: Duration },
    #[error(
        "central did not apply the acknowledgement of {key}: {} ({:?})",
        error_chain(.status),
        .status.code()
    )]
    Central { key: String, status: tonic::Status },
    #[error(transparent)]
    Buffer(#[from] BufferError),
}

/// Sends the pending acknowledgements to central.
#[derive(Debug)]
pub(crate) struct AckSender {
    buffer: Acks,
    /// Lazily connected on the endpoint the forwarder uses.
    central: NotificationIngestClient<Channel>,
    central_url: String,
    site_id: String,
    retry_interval: Duration,
    timeout: Duration,
}

impl AckSender {
    pub(crate) fn new(buffer: Acks, endpoint: &Endpoint, config: &Config) -> Self {
        Self {
            buffer,
            central: NotificationIngestClient::new(endpoint.connect_lazy()),
            central_url: config.central_url.clone(),
            site_id: config.site_id.clone(),
            retry_interval: config.forward_retry_interval,
            timeout: config.request_timeout,
        }
    }

    /// Sends every acknowledgement as it becomes due until `shutdown`.
    pub(crate) async fn run(&self, shutdown: &CancellationToken) {
        let wakeups = Wakeups {
            pending: self.buffer.pending_acks(),
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

    async fn apply_at_central(&self, ack: &PendingAck) -> Result<(), AckError> {
        let key = ack.condition_key.as_str();
        let mut request = Request::new(AcknowledgeConditionRequest {
            condition_key: key.to_owned(),
            source_site_id: self.site_id.clone(),
            actor: ack.actor.as_str().to_owned(),
            acknowledged_at: Some(outbox_proto::time::to_timestamp(ack.acknowledged_at)),
        });
        request.set_timeout(self.timeout);
        let mut central = self.central.clone();
        match tokio::time::timeout(self.timeout, central.acknowledge_condition(request)).await {
            Err(_) => Err(AckError::Timeout {
                key: key.to_owned(),
                timeout: self.timeout,
            }),
            Ok(Ok(response)) => {
                let answer = response.into_inner();
                tracing::info!(
                    condition_key = key,
                    acknowledged = answer.acknowledged,
                    already = answer.already,
                    "central applied an acknowledgement of this site"
                );
                Ok(())
            }
            Ok(Err(status)) if status.code() == Code::Unimplemented => {
                tracing::error!(
                    condition_key = key, central = %self.central_url,
                    "central does not implement AcknowledgeCondition (an older central); the \
                     acknowledgement is dropped and its incidents keep escalating. Upgrade \
                     central, or acknowledge them in its console"
                );
                Ok(())
            }
            Ok(Err(status)) => Err(AckError::Central {
                key: key.to_owned(),
                status,
            }),
        }
    }
}

impl CentralHalf for AckSender {
    type Pending = PendingAcks;
    type Item = PendingAck;
    type Error = AckError;
    const WHAT: &'static str = "acknowledgement";

    fn is_empty(pending: &PendingAcks) -> bool {
        pending.is_empty()
    }

    fn due(pending: &PendingAcks, oldest_buffered: Option<Seq>) -> Vec<PendingAck> {
        pending.due(oldest_buffered).cloned().collect()
    }

    async fn oldest_seq(&self) -> Result<Option<Seq>, BufferError> {
        self.buffer.oldest_seq().await
    }

    async fn apply(&self, ack: &PendingAck) -> Result<(), Self::Error> {
        self.apply_at_central(ack).await
    }

    async fn forget(&self, ack: PendingAck) -> Result<bool, BufferError> {
        self.buffer.forget_ack(ack).await
    }
}
