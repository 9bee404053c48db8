//! `SiteNotify`: the local API site scripts call. `Send` answers with an id only after the
//! notification is committed to the buffer, so an id in a script's hand is never lost.
//! `ClearCondition` likewise answers after its commit: the buffered rows of the key are marked
//! and the central half is queued durably (`crate::clears` sends it). `GetStatus` answers from
//! the buffer while the notification is there and otherwise asks central, with a bounded wait;
//! `GetBufferStats` reports the buffer and the forwarder, and whether (and why) the buffer
//! refuses Sends to keep room to drain.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use outbox_proto::time::to_timestamp;
use outbox_proto::v1::site_notify_server::SiteNotify;
use outbox_proto::v1::{
    AcknowledgeRequest, AcknowledgeResponse, BufferStats, ClearConditionRequest,
    ClearConditionResponse, GetBufferStatsRequest, GetNotificationStatusRequest, NodeRoleView,
    NotificationStatusView, PromoteRequest, SendRequest, SendResponse, WatchStatusRequest,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::{buffer_status, convert, invalid_argument, watch_status};
use crate::buffer::{Intake, StatusReader, Statuses};
use crate::central_status::CentralStatus;
use crate::domain::Role;
use crate::domain::{AckActor, ConditionKey, LocalStatus, NotificationId, SiteId};
use crate::forwarder::ForwardState;
use crate::metrics::SiteMetrics;
use crate::pair::Pair;
use crate::wire;

pub(crate) struct SiteNotifyService {
    site: SiteId,
    /// Sends and clears go in here.
    intake: Intake,
    /// GetStatus and GetBufferStats read here.
    buffer: StatusReader,
    forwarding: Arc<ForwardState>,
    central: CentralStatus,
    metrics: Arc<SiteMetrics>,
    pair: Arc<Pair>,
    /// The final statuses central sent back, for WatchStatus.
    statuses: Statuses,
    /// Cancelled when the node stops: open WatchStatus streams end.
    stop: CancellationToken,
}

/// The buffer's capabilities the local API uses.
pub(crate) struct ServiceBuffer {
    /// Sends, clears and acknowledgements go in here.
    pub intake: Intake,
    /// GetStatus and GetBufferStats read here.
    pub status: StatusReader,
    /// The final statuses central sent back, for WatchStatus.
    pub statuses: Statuses,
}

impl SiteNotifyService {
    pub(crate) fn new(
        site: SiteId,
        buffer: ServiceBuffer,
        forwarding: Arc<ForwardState>,
        central: CentralStatus,
        metrics: Arc<SiteMetrics>,
        pair: Arc<Pair>,
        stop: CancellationToken,
    ) -> Self {
        Self {
            site,
            intake: buffer.intake,
            buffer: buffer.status,
            statuses: buffer.statuses,
            forwarding,
            central,
            metrics,
            pair,
            stop,
        }
    }
}

/// How long `Promote` waits for the node to become active before answering with its role.
const PROMOTE_WAIT: Duration = Duration::from_secs(10);

#[tonic::async_trait]
impl SiteNotify for SiteNotifyService {
    async fn send(&self, request: Request<SendRequest>) -> Result<Response<SendResponse>, Status> {
        let notification = convert::send_request(request.into_inner(), &self.site, Utc::now())
            .map_err(invalid_argument)?;
        let id = notification.id;
        // Held until the row is committed: a standby refuses, and a step-down waits for it.
        let _active = self.pair.while_active().await?;
        self.intake
            .enqueue(notification)
            .await
            .map_err(buffer_status)?;
        self.metrics.send_accepted();
        tracing::debug!(notification_id = %id, "notification buffered");
        Ok(Response::new(SendResponse {
            notification_id: id.to_string(),
        }))
    }

    async fn get_status(
        &self,
        request: Request<GetNotificationStatusRequest>,
    ) -> Result<Response<NotificationStatusView>, Status> {
        let id = NotificationId::parse(&request.get_ref().notification_id, "notification_id")
            .map_err(invalid_argument)?;
        match self.buffer.local_status(id).await.map_err(buffer_status)? {
            LocalStatus::Buffered(view) => {
                Ok(Response::new(convert::buffered_view(id, view, &self.site)))
            }
            LocalStatus::Rejected { reason } => Err(Status::failed_precondition(format!(
                "rejected by central: {reason}"
            ))),
            // The final status central sent back, when this node has it: answered locally,
            // also while central is away.
            LocalStatus::NotHere => match self
                .buffer
                .central_status(id)
                .await
                .map_err(buffer_status)?
            {
                Some(stored) => watch_status::view(&stored).map(Response::new),
                None => self.central.status(id).await.map(Response::new),
            },
        }
    }

    type WatchStatusStream = ReceiverStream<Result<NotificationStatusView, Status>>;

    async fn watch_status(
        &self,
        request: Request<WatchStatusRequest>,
    ) -> Result<Response<Self::WatchStatusStream>, Status> {
        let interest = watch_status::interest(request.into_inner())?;
        let (out, views) = mpsc::channel(64);
        let watch = watch_status::Watch {
            interest,
            statuses: self.statuses.clone(),
            reader: self.buffer.clone(),
            site: self.site.clone(),
            out,
        };
        tokio::spawn(watch.run(self.stop.clone()));
        Ok(Response::new(ReceiverStream::new(views)))
    }

    async fn get_buffer_stats(
        &self,
        _request: Request<GetBufferStatsRequest>,
    ) -> Result<Response<BufferStats>, Status> {
        let stats = self.buffer.stats().await.map_err(buffer_status)?;
        let room = self.buffer.room_status();
        let forwarding = self.forwarding.snapshot();
        let oldest_age_seconds = stats.oldest_age_seconds(Utc::now());
        let pair = self.pair.status();
        Ok(Response::new(BufferStats {
            depth: stats.depth,
            oldest_enqueued_at: stats.oldest_enqueued_at.map(to_timestamp),
            oldest_age_seconds,
            last_forward_at: forwarding.last_forward_at.map(to_timestamp),
            central_reachable: forwarding.central_reachable,
            rejected: stats.rejected,
            in_flight: forwarding.in_flight,
            role: wire::role_to_proto(pair.role).into(),
            term: pair.term,
            node_name: pair.node_name,
            peer_connected: pair.peer_connected,
            standby_lag_rows: pair.standby_lag_rows,
            standby_lag_seconds: pair.standby_lag_seconds,
            active_node: pair.active_node,
            active_silent_seconds: pair.active_silent_seconds,
            sends_refused: room.refusing.is_some(),
            sends_refused_reason: room
                .refusing
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            buffer_bytes: room.buffer_bytes,
            disk_available_bytes: room.disk_available_bytes.unwrap_or(0),
            forward_refused_reason: forwarding.refused.unwrap_or_default(),
        }))
    }

    async fn clear_condition(
        &self,
        request: Request<ClearConditionRequest>,
    ) -> Result<Response<ClearConditionResponse>, Status> {
        // `source_site_id` is central's business: a site clears its own keys only.
        let key = ConditionKey::parse(request.into_inner().condition_key, "condition_key")
            .map_err(invalid_argument)?;
        // Held until the clear is committed, as for a Send: only the active's clears reach
        // central, and a step-down waits for this one before handing the buffer over.
        let _active = self.pair.while_active().await?;
        let cleared = self
            .intake
            .clear_condition(&self.site, key, Utc::now())
            .await
            .map_err(buffer_status)?;
        tracing::info!(
            condition_key = %cleared.pending.condition_key, marked = cleared.marked,
            up_to_seq = cleared.pending.up_to.0,
            "condition cleared: buffered notifications marked, central's half queued"
        );
        Ok(Response::new(ClearConditionResponse {
            cleared: u32::try_from(cleared.marked).unwrap_or(u32::MAX),
        }))
    }

    async fn acknowledge(
        &self,
        request: Request<AcknowledgeRequest>,
    ) -> Result<Response<AcknowledgeResponse>, Status> {
        let request = request.into_inner();
        let key = ConditionKey::parse(request.condition_key, "condition_key")
            .map_err(invalid_argument)?;
        let actor = AckActor::parse(&request.actor, "actor").map_err(invalid_argument)?;
        // Held until it is committed, as for a clear: only the active's reach central.
        let _active = self.pair.while_active().await?;
        let (pending, all) = self
            .intake
            .acknowledge(key, actor, Utc::now())
            .await
            .map_err(buffer_status)?;
        tracing::info!(
            condition_key = %pending.condition_key, actor = pending.actor.as_str(),
            up_to_seq = pending.up_to.0,
            "condition acknowledged at the site: central's half queued"
        );
        Ok(Response::new(AcknowledgeResponse {
            pending: u32::try_from(all.len()).unwrap_or(u32::MAX),
        }))
    }

    async fn promote(
        &self,
        _request: Request<PromoteRequest>,
    ) -> Result<Response<NodeRoleView>, Status> {
        let mut role = self.pair.watch_role();
        if role.borrow().role == Role::Standby {
            tracing::warn!("promotion requested through the local API");
            self.pair.request_promotion();
            let promoted = role.wait_for(|now| now.role == Role::Active);
            match tokio::time::timeout(PROMOTE_WAIT, promoted).await {
                Ok(Ok(_)) => {}
                Ok(Err(_)) => return Err(Status::unavailable("the node is shutting down")),
                Err(_) => {
                    return Err(Status::deadline_exceeded(format!(
                        "not active within {PROMOTE_WAIT:?}; the promotion goes on, see the logs"
                    )));
                }
            }
        }
        Ok(Response::new(wire::node_view_to_proto(&self.pair.view())))
    }
}
