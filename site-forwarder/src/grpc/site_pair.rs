//! `SitePair`: what a node serves its peer on `pair.listen` ([`PairEndpoint`] serves it).
//! Handlers stay thin: check the caller and this node's role, then hand over to
//! [`crate::pair::source`] or the buffer.
//!
//! The endpoint pings its clients like they ping it (after a heartbeat interval without a
//! byte, answered within [`PairConfig::link_timeout`]), so the active drops the stream of a
//! standby that vanished, frozen or cut off without a word, and reports it disconnected.
//!
//! On a TLS pair link the peer has already presented a certificate chaining to `tls.ca`; it must
//! also name this site (Common Name = `site_id`), so a certificate issued to another site cannot
//! read or inject this site's notifications.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use outbox_proto::limits::MAX_GRPC_MESSAGE_BYTES;
use outbox_proto::v1::site_pair_server::SitePair;
use outbox_proto::v1::site_pair_server::SitePairServer;
use outbox_proto::v1::{
    AdoptRequest, AdoptResponse, GetRoleRequest, NodeRoleView, ReplicaMessage, ReplicationBatch,
    replica_message,
};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};

use super::buffer_status;
use crate::buffer::{Adoption, Replication};
use crate::config::{Config, PairConfig};
use crate::domain::{Role, Seq, SiteId, StatusSeq};
use crate::link::{LinkError, peer_endpoint};
use crate::pair::source::{self, Hello, SourceError, StreamTiming, WINDOW};
use crate::pair::{MAX_PENDING_ACKS, MAX_PENDING_CLEARS, Pair};
use crate::wire::{ack_from_proto, clear_from_proto, node_view_to_proto};

/// Why the pair endpoint cannot be set up: a setting, named at the start of the message, is
/// wrong (start-up reports it as a configuration error).
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("{0}")]
    Tls(String),
}

/// The buffer's capabilities the pair endpoint serves from.
#[derive(Debug)]
pub(crate) struct PairBuffer {
    /// What a standby's stream copies.
    pub feed: Replication,
    /// Where a former active's rows are stored.
    pub adoption: Adoption,
}

/// The pair endpoint of a node: its listener is bound at start-up (so a busy port stops
/// start-up), served by [`PairEndpoint::serve`] until the stop token.
pub(crate) struct PairEndpoint {
    listener: TcpListener,
    /// With the TLS configuration applied, when the link is TLS.
    server: Server,
    service: SitePairService,
    peer: (PairConfig, Endpoint),
}

impl PairEndpoint {
    /// Serves on `listener` (bound to `pair.listen`) and reads the TLS files; checks the peer's
    /// URL.
    pub(crate) fn new(
        listener: TcpListener,
        config: &Config,
        pair_config: &PairConfig,
        site: SiteId,
        buffer: PairBuffer,
        pair: Arc<Pair>,
        stop: CancellationToken,
    ) -> Result<Self, EndpointError> {
        let tls = config
            .tls
            .pair_server_config()
            .map_err(|e| EndpointError::Tls(e.to_string()))?;
        let peer = peer_endpoint(config, pair_config)?;
        let mut server = Server::builder()
            .http2_keepalive_interval(Some(pair_config.heartbeat_interval()))
            .http2_keepalive_timeout(Some(pair_config.link_timeout()));
        if let Some(tls) = tls.clone() {
            server = server.tls_config(tls).map_err(|e| {
                EndpointError::Tls(format!("tls.cert: cannot serve the pair link with it: {e}"))
            })?;
        }
        tracing::info!(
            node = %pair_config.node_name, role = pair.role_now().role.as_str(),
            term = pair.role_now().term, listen = %pair_config.listen, peer = %pair_config.peer_url,
            "site pair: serving the peer"
        );
        let service = SitePairService {
            site,
            feed: buffer.feed,
            adoption: buffer.adoption,
            pair,
            tls: tls.is_some(),
            hello_timeout: config.request_timeout,
            timing: StreamTiming {
                heartbeat: pair_config.heartbeat_interval(),
                confirm_timeout: pair_config.failover_timeout,
            },
            stop,
        };
        Ok(Self {
            listener,
            server,
            service,
            peer: (pair_config.clone(), peer),
        })
    }

    /// The peer's settings and endpoint, for the node task.
    pub(crate) fn peer(&self) -> (PairConfig, Endpoint) {
        self.peer.clone()
    }

    /// Serves `SitePair` until the stop token given to [`Self::new`].
    pub(crate) fn serve(self) -> JoinHandle<()> {
        let stop = self.service.stop.clone();
        let incoming = TcpIncoming::from(self.listener).with_nodelay(Some(true));
        let mut server = self.server;
        tokio::spawn(async move {
            let serving = server
                .add_service(
                    SitePairServer::new(self.service)
                        .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_GRPC_MESSAGE_BYTES),
                )
                .serve_with_incoming_shutdown(incoming, stop.cancelled_owned());
            if let Err(error) = serving.await {
                tracing::error!(%error, "the pair endpoint failed; the peer cannot reach this node");
            }
        })
    }
}

pub(crate) struct SitePairService {
    site: SiteId,
    /// What a standby's stream copies.
    feed: Replication,
    /// Where a former active's rows are stored.
    adoption: Adoption,
    pair: Arc<Pair>,
    /// Whether the link is TLS, so callers must present this site's certificate.
    tls: bool,
    hello_timeout: Duration,
    timing: StreamTiming,
    /// Cancelled at shutdown; ends the replication streams.
    stop: CancellationToken,
}

impl SitePairService {
    fn check_peer<T>(&self, request: &Request<T>) -> Result<(), Status> {
        if !self.tls {
            return Ok(());
        }
        match tls_files::client_common_name(request) {
            Some(name) if name == self.site.as_str() => Ok(()),
            Some(name) => Err(Status::permission_denied(format!(
                "the client certificate names {name:?}, not this site ({})",
                self.site
            ))),
            None => Err(Status::unauthenticated(
                "a client certificate naming this site is required",
            )),
        }
    }
}

/// One standby's batches as `Replicate` answers them: the stream's end, when it ends early,
/// becomes the status the standby gets (see `From<SourceError> for Status`).
pub(crate) struct BatchStream(ReceiverStream<Result<ReplicationBatch, SourceError>>);

impl Stream for BatchStream {
    type Item = Result<ReplicationBatch, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.0)
            .poll_next(cx)
            .map(|batch| batch.map(|batch| batch.map_err(Status::from)))
    }
}

#[tonic::async_trait]
impl SitePair for SitePairService {
    type ReplicateStream = BatchStream;

    async fn replicate(
        &self,
        request: Request<Streaming<ReplicaMessage>>,
    ) -> Result<Response<BatchStream>, Status> {
        self.check_peer(&request)?;
        if self.pair.role_now().role != Role::Active {
            return Err(Status::failed_precondition(format!(
                "{} is not the active node of its pair",
                self.pair.name()
            )));
        }
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(self.hello_timeout, inbound.next())
            .await
            .map_err(|_| Status::deadline_exceeded("no hello from the standby"))?;
        let hello = match first {
            Some(Ok(ReplicaMessage {
                message: Some(replica_message::Message::Hello(hello)),
            })) => hello,
            Some(Ok(_)) => {
                return Err(Status::invalid_argument(
                    "message: the first message must be the hello",
                ));
            }
            Some(Err(status)) => return Err(status),
            None => return Err(Status::cancelled("the standby closed the stream")),
        };
        if hello.replicated_through < 0 {
            return Err(Status::invalid_argument(
                "hello.replicated_through: must not be negative",
            ));
        }
        if hello.statuses_through < 0 {
            return Err(Status::invalid_argument(
                "hello.statuses_through: must not be negative",
            ));
        }
        let hello = Hello {
            node_name: hello.node_name,
            term: hello.term,
            replicated_through: Seq(hello.replicated_through),
            statuses_through: StatusSeq(hello.statuses_through),
        };
        let (out, batches) = mpsc::channel(WINDOW);
        tokio::spawn(source::stream_to_standby(
            self.feed.clone(),
            Arc::clone(&self.pair),
            hello,
            inbound,
            out,
            self.timing,
            self.stop.clone(),
        ));
        Ok(Response::new(BatchStream(ReceiverStream::new(batches))))
    }

    async fn adopt(
        &self,
        request: Request<AdoptRequest>,
    ) -> Result<Response<AdoptResponse>, Status> {
        self.check_peer(&request)?;
        let request = request.into_inner();
        let mut rows = Vec::with_capacity(request.notifications.len());
        for (i, submit) in request.notifications.into_iter().enumerate() {
            let n = outbox_proto::submission::parse(submit)
                .map_err(|e| Status::invalid_argument(format!("notifications[{i}].{e}")))?;
            // Priority, condition key and the clear mark included: the adopted row is forwarded
            // as the old active would have.
            rows.push(n);
        }
        // Bounded like the list a standby takes (see MAX_PENDING_CLEARS); the peer splits a
        // longer one.
        if request.pending_clears.len() > MAX_PENDING_CLEARS {
            return Err(Status::invalid_argument(format!(
                "pending_clears: {} entries, at most {MAX_PENDING_CLEARS} per request",
                request.pending_clears.len()
            )));
        }
        let mut clears = Vec::with_capacity(request.pending_clears.len());
        for (i, clear) in request.pending_clears.into_iter().enumerate() {
            let clear = clear_from_proto(clear)
                .map_err(|e| Status::invalid_argument(format!("pending_clears[{i}].{e}")))?;
            clears.push(clear);
        }
        if request.pending_acks.len() > MAX_PENDING_ACKS {
            return Err(Status::invalid_argument(format!(
                "pending_acks: {} entries, at most {MAX_PENDING_ACKS} per request",
                request.pending_acks.len()
            )));
        }
        let mut acks = Vec::with_capacity(request.pending_acks.len());
        for (i, ack) in request.pending_acks.into_iter().enumerate() {
            let ack = ack_from_proto(ack)
                .map_err(|e| Status::invalid_argument(format!("pending_acks[{i}].{e}")))?;
            acks.push(ack);
        }
        // Held while the rows commit: a step-down waits for it, so nothing is adopted by a node
        // that is already handing its own buffer over.
        let _active = self.pair.while_active().await?;
        let adopted = self
            .adoption
            .adopt(rows, clears, acks)
            .await
            .map_err(buffer_status)?;
        tracing::info!(
            from = %request.node_name, adopted = adopted.adopted, already_held = adopted.already_held,
            pending_clears = adopted.clears.recorded,
            pending_clears_already_applied = adopted.clears.already_applied,
            pending_acks = adopted.acks,
            "adopted rows, pending clears and acknowledgements handed over by the peer"
        );
        Ok(Response::new(AdoptResponse {
            adopted: u32::try_from(adopted.adopted).unwrap_or(u32::MAX),
            already_held: u32::try_from(adopted.already_held).unwrap_or(u32::MAX),
        }))
    }

    async fn get_role(
        &self,
        request: Request<GetRoleRequest>,
    ) -> Result<Response<NodeRoleView>, Status> {
        self.check_peer(&request)?;
        Ok(Response::new(node_view_to_proto(&self.pair.view())))
    }
}
