//! `NotificationIngest`: how notifications enter central. Every ack is sent only after the row
//! it acknowledges is committed, so a site may delete its copy the moment it sees the ack.
//!
//! The stream path batches: whatever submits have already arrived (up to [`MAX_STREAM_BATCH`]
//! submits or [`MAX_STREAM_BATCH_BYTES`]) are validated as they are read and form one batch, and
//! one committer per stream inserts the batches one store job each, in the order they arrived
//! (up to [`MAX_BATCHES_QUEUED`] wait meanwhile). A batch is not folded into the next: its acks
//! would wait for the larger job, and on MS SQL, whose statements take a chunk of rows each, that
//! multiplies the time to a stream's first ack under load. A stream's rows are therefore
//! committed in stream order: their Ids and serve turns follow the site's order, and of two
//! submits with one condition key the later always supersedes the earlier, never the other way
//! round. Reading and validating the next batches goes on while one commits. A submit refused by
//! validation is answered (REJECTED) as soon as it is read, so its ack may come before the acks
//! of earlier batches; the acks of valid submits come back in submit order. The contract
//! promises no order.
//!
//! Memory. Whatever a client sends, and however slowly it reads its acks, one stream holds at
//! most [`STREAM_MEMORY_BOUND`] (under 16 MiB, four times `MAX_GRPC_MESSAGE_BYTES`): the
//! transport's share (the message being received and the one just decoded, each up to
//! `MAX_GRPC_MESSAGE_BYTES`, and the stream's HTTP/2 window), the batches (only valid submits
//! are kept, so each holds at most [`MAX_STREAM_BATCH_BYTES`] plus one maximal valid submit; at
//! most [`MAX_BATCHES_QUEUED`] queued, one committing and one being read), and the acks waiting
//! for the client (each with a bounded id and reason, see [`MAX_ECHOED_ID_BYTES`]). At most
//! `server.max_ingest_streams` streams are open at once on a node (a further one is refused with
//! RESOURCE_EXHAUSTED naming the key, and counted in `outbox_ingest_streams_refused_total`), so
//! submit streams can make a node hold at most that many times the bound: 8 GiB with the
//! default 512. A stream of typical submits holds a few hundred KiB.
//!
//! With client certificates required (`tls.client_ca`), a caller may submit only as the site its
//! certificate names ([`SiteIdentity`]): any other `source_site_id` is refused before validation
//! and nothing of it is stored. The unary call answers PERMISSION_DENIED; the stream ends with
//! PERMISSION_DENIED at the first such submit, after the acks of the submits read before it,
//! and that submit and everything after it get no ack. Not a REJECTED ack: REJECTED is final,
//! and the site would set the row aside for good, so a site whose certificate names another site
//! (a configuration to fix, not content to refuse) would throw its whole backlog away; with the
//! stream refused it keeps its rows and resends them once its certificate is fixed. The same
//! rule holds for `ReportSiteHealth` (a site node's health, see `super::site_health`) and
//! `ClearCondition`.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use outbox_proto::limits::MAX_GRPC_MESSAGE_BYTES;
use outbox_proto::v1::notification_ingest_server::NotificationIngest;
use outbox_proto::v1::{
    AcknowledgeConditionRequest, AcknowledgeConditionResponse, ClearConditionRequest,
    ClearConditionResponse, NotificationSubmit, NotificationSubmitAck, ReportSiteHealthResponse,
    SiteHealthReport, SiteStatusBatch, SiteStatusWatchMessage,
};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::{
    HTTP2_STREAM_WINDOW_BYTES, convert, invalid_argument, site_health, site_status, store_status,
};
use crate::domain::escalation::{AckMeans, AckResult, Acknowledgement};
use crate::domain::history::{Actor, site_actor};
use crate::domain::site_health::{MAX_NODES_PER_SITE, SiteHealthWrite};
use crate::domain::{ConditionKey, SiteId};
use crate::metrics::Metrics;
use crate::records::NewNotification;
use crate::status_feed::StatusFeed;
use crate::store::{EscalationStore, IngestStore, SiteStatusStore, StoreError};
use crate::tls::{TlsSettings, client_common_name};

/// Most submits inserted by one store job. Large enough to amortise the job overhead, small
/// enough that one batch's acks are not held back for long.
pub(crate) const MAX_STREAM_BATCH: usize = 256;
/// Most bytes of submits one batch may hold (each weighed by [`submit_weight`]): a batch is
/// closed once it holds this much, so it holds at most this plus one [`MAX_SUBMIT_WEIGHT`].
/// 256 typical submits (a few hundred bytes of text each) weigh about 200 KiB, so they still
/// fill a batch by count, as before; a stream of large submits makes batches of a few rows,
/// whose store jobs are dominated by the bytes written anyway.
const MAX_STREAM_BATCH_BYTES: usize = 512 * 1024;
/// What a submit weighs in a batch besides its text: the message's and the row's structs and
/// the allocator's share of their strings (the structs are a few hundred bytes).
const SUBMIT_OVERHEAD_BYTES: usize = 512;
/// The most a valid submit weighs: its text at every field's limit (a 256 KiB body, 16 KiB of
/// type_data, 500 four-byte characters of subject, and the small fields: about 277 KiB in all,
/// see the test) plus [`SUBMIT_OVERHEAD_BYTES`]. Invalid submits are answered and dropped as they
/// are read, so only valid ones are ever queued.
const MAX_SUBMIT_WEIGHT: usize = 280 * 1024;
/// Batches one stream may have read ahead of its committer: enough to keep the store busy while
/// acks travel, few enough that one busy site does not monopolise the writer.
pub(crate) const MAX_BATCHES_QUEUED: usize = 4;
/// Acks buffered towards a slow reader before the stream stops reading new submits.
const ACK_BUFFER: usize = MAX_STREAM_BATCH * MAX_BATCHES_QUEUED;
/// Most bytes of a submit's notification_id a REJECTED ack echoes. A valid id is a UUID, at most
/// 45 bytes in any form `Uuid` parses (36 as sites send it), so a valid id always comes back
/// whole; a longer one names nothing a site could match, and its beginning is enough to find it
/// in a log. Without the bound, 4 MiB ids would make each buffered ack 4 MiB.
const MAX_ECHOED_ID_BYTES: usize = 64;
/// Most bytes of a REJECTED ack's reason. Validation's reasons are a line naming the field and
/// quoting at most 64 characters of the value (about 200 bytes); this is the backstop.
const MAX_REASON_BYTES: usize = 512;
/// The most one buffered ack weighs: its bounded id and reason, and the struct around them.
const MAX_ACK_WEIGHT: usize = MAX_ECHOED_ID_BYTES + MAX_REASON_BYTES + 128;
/// HTTP/2's frame size, which central does not raise: tonic's buffer of a message being received
/// may hold one frame beyond the message.
const HTTP2_FRAME_BYTES: usize = 16 * 1024;
/// What HTTP/2 may buffer towards a client that does not read (hyper's `max_send_buf_size`,
/// which tonic leaves at its default).
const HTTP2_SEND_BUFFER_BYTES: usize = 400 * 1024;

/// The most memory one submit stream can make central hold, whatever its client does:
/// - the transport: the message being received (tonic buffers a whole message, up to
///   `MAX_GRPC_MESSAGE_BYTES`, plus a frame), the message just decoded and being validated, and
///   the stream's HTTP/2 receive window;
/// - the batches: [`MAX_BATCHES_QUEUED`] queued, one committing and the store's copy of it, and
///   one being read, each at most [`MAX_STREAM_BATCH_BYTES`] plus one [`MAX_SUBMIT_WEIGHT`];
/// - the acks: [`ACK_BUFFER`] buffered, the REJECTED acks of the batch being read, and what
///   HTTP/2 buffers towards the client.
///
/// Under 16 MiB; `server.max_ingest_streams` streams hold at most that many times this.
pub(crate) const STREAM_MEMORY_BOUND: usize = 2 * MAX_GRPC_MESSAGE_BYTES
    + HTTP2_FRAME_BYTES
    + HTTP2_STREAM_WINDOW_BYTES as usize
    + (MAX_BATCHES_QUEUED + 3) * (MAX_STREAM_BATCH_BYTES + MAX_SUBMIT_WEIGHT)
    + (ACK_BUFFER + MAX_STREAM_BATCH) * MAX_ACK_WEIGHT
    + HTTP2_SEND_BUFFER_BYTES;

// The bound docs/limits.md and deploy/central-outbox.toml state (16 MiB a stream, four times
// MAX_GRPC_MESSAGE_BYTES) holds for the constants above: raising one past it fails the build.
const _: () = assert!(STREAM_MEMORY_BOUND <= 4 * MAX_GRPC_MESSAGE_BYTES);

/// `server.max_ingest_streams` when not configured. Each site node keeps one submit stream open
/// to central; during a reconnect its old stream may linger until central's keepalive ends it
/// (up to 30 s) while the new one opens. 512 serves some 500 site nodes in steady state, and 250
/// reconnecting all at once (streams refused meanwhile are retried by the sites within their
/// `forward_retry_interval`), for at most 512 × [`STREAM_MEMORY_BOUND`] = 8 GiB.
pub(crate) const DEFAULT_MAX_INGEST_STREAMS: usize = 512;

/// A refused stream is counted every time; a WARN line says so at most once per this interval,
/// with how many since the last, since each refused site retries every
/// `forward_retry_interval`.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

pub(crate) struct IngestService<S> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    /// Woken after each commit so the dispatcher on this node starts delivering at once.
    dispatcher_wake: Arc<Notify>,
    /// Cancelled at shutdown: open streams end so the server can stop.
    shutdown: CancellationToken,
    site_identity: SiteIdentity,
    /// One permit per submit stream that may be open (`server.max_ingest_streams`); a stream
    /// holds its permit until both its session and its ack stream are gone.
    stream_slots: Arc<Semaphore>,
    max_streams: usize,
    /// Rate-limits the WARN lines about refused streams (see [`REFUSAL_LOG_INTERVAL`]).
    refusals: Mutex<RefusalLog>,
    /// Wakes the site status streams (`super::site_status`).
    status_feed: Arc<StatusFeed>,
}

/// When a refused stream was last logged, and how many were refused since.
#[derive(Debug, Default)]
struct RefusalLog {
    last_line: Option<Instant>,
    unlogged: u64,
}

/// Which `source_site_id` a caller may submit as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum SiteIdentity {
    /// Any: without client certificates central cannot tell sites apart (the behaviour before
    /// TLS, and with server-only TLS).
    #[default]
    Unchecked,
    /// Only the one named by the Common Name of the caller's verified client certificate.
    ClientCertificate,
}

impl SiteIdentity {
    /// Checked exactly when `tls` requires client certificates.
    pub(crate) fn for_tls(tls: &TlsSettings) -> Self {
        if tls.requires_client_certificates() {
            Self::ClientCertificate
        } else {
            Self::Unchecked
        }
    }

    /// Whether each caller is held to the site its client certificate names.
    pub(crate) fn tells_sites_apart(self) -> bool {
        self == Self::ClientCertificate
    }

    /// Says where an operator sees it when sites are not told apart: a warning in the log at
    /// start (over TLS, where an operator may well believe sites are verified; without TLS
    /// the plaintext warning, or loopback, says as much) and the `/metrics` gauge
    /// `outbox_site_identity_unverified`. Changes nothing else: every client served before
    /// is served still.
    pub(crate) fn announce(self, serves_tls: bool, metrics: &Metrics) {
        metrics.set_sites_verified(self.tells_sites_apart());
        match (self, serves_tls) {
            (Self::ClientCertificate, _) => {}
            (Self::Unchecked, true) => tracing::warn!(
                "SITES ARE NOT VERIFIED: gRPC is served over TLS without [tls] client_ca, so any \
                 client that reaches this port can submit notifications, clear conditions and \
                 report health as any site (and keep a dead site shown online); set \
                 tls.client_ca to the CA that signs the sites' certificates"
            ),
            (Self::Unchecked, false) => tracing::info!(
                "sites are not verified: without TLS and client certificates, any client that \
                 reaches the gRPC port can submit, clear conditions and report health as any site"
            ),
        }
    }

    /// The site `request`'s caller may submit as: `None` for any. A verified certificate
    /// without a Common Name names no site, so it may submit as none.
    fn caller_site<T>(self, request: &Request<T>) -> Result<Option<String>, Status> {
        match self {
            Self::Unchecked => Ok(None),
            Self::ClientCertificate => client_common_name(request).map(Some).ok_or_else(|| {
                Status::permission_denied(
                    "the client certificate has no Common Name, so it names no site to submit as",
                )
            }),
        }
    }
}

/// Refuses a submit for another site than `caller_site`; the reason names both.
fn check_site(caller_site: Option<&str>, msg: &NotificationSubmit) -> Result<(), String> {
    check_site_field(caller_site, "source_site_id", &msg.source_site_id)
}

/// Refuses `site` (the request's `field`) unless it is `caller_site`; the reason names both.
fn check_site_field(caller_site: Option<&str>, field: &str, site: &str) -> Result<(), String> {
    match caller_site {
        Some(caller) if caller != site => Err(format!(
            "{field}: {:?} is not the caller's site: its client certificate is for {caller:?}",
            prefix(site, MAX_ECHOED_ID_BYTES)
        )),
        _ => Ok(()),
    }
}

/// Who a site's acknowledgement is recorded as: `site <id>`, and the person at the site when it
/// names one (`site <id>: <actor>`). An actor over 128 characters or with control characters is
/// refused by name.
fn site_ack_actor(site: &str, actor: &str) -> Result<Actor, Status> {
    let actor = actor.trim();
    let chars = actor.chars().count();
    if chars > MAX_SITE_ACTOR_CHARS {
        return Err(Status::invalid_argument(format!(
            "actor: is {chars} characters, the limit is {MAX_SITE_ACTOR_CHARS}"
        )));
    }
    if actor.chars().any(char::is_control) {
        return Err(Status::invalid_argument(
            "actor: must not contain control characters",
        ));
    }
    Ok(if actor.is_empty() {
        site_actor(site)
    } else {
        Actor::new(&format!("site {site}: {actor}"))
    })
}

/// The longest actor a site may name with an acknowledgement, in characters.
const MAX_SITE_ACTOR_CHARS: usize = 128;

impl<S> IngestService<S> {
    pub(crate) fn new(
        store: Arc<S>,
        metrics: Arc<Metrics>,
        dispatcher_wake: Arc<Notify>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            store,
            metrics,
            dispatcher_wake,
            shutdown,
            site_identity: SiteIdentity::Unchecked,
            stream_slots: Arc::new(Semaphore::new(DEFAULT_MAX_INGEST_STREAMS)),
            max_streams: DEFAULT_MAX_INGEST_STREAMS,
            refusals: Mutex::new(RefusalLog::default()),
            status_feed: Arc::new(StatusFeed::default()),
        }
    }

    /// The site status streams wake on `feed` (the one `status_feed`'s task polls for).
    pub(crate) fn with_status_feed(mut self, feed: Arc<StatusFeed>) -> Self {
        self.status_feed = feed;
        self
    }

    /// Which sites each caller may submit as (unchecked unless set).
    pub(crate) fn with_site_identity(mut self, site_identity: SiteIdentity) -> Self {
        self.site_identity = site_identity;
        self
    }

    /// At most `max_streams` submit streams open at once (`server.max_ingest_streams`;
    /// [`DEFAULT_MAX_INGEST_STREAMS`] unless set).
    pub(crate) fn with_stream_limit(mut self, max_streams: usize) -> Self {
        self.stream_slots = Arc::new(Semaphore::new(max_streams));
        self.max_streams = max_streams;
        self
    }

    /// A place for one more submit stream, or RESOURCE_EXHAUSTED naming the limit (counted).
    fn open_stream_slot(&self) -> Result<StreamSlot, Status> {
        match Arc::clone(&self.stream_slots).try_acquire_owned() {
            Ok(permit) => {
                self.metrics.ingest_stream(true);
                Ok(StreamSlot {
                    _permit: permit,
                    metrics: Arc::clone(&self.metrics),
                })
            }
            Err(_) => {
                self.metrics.ingest_stream_refused();
                let mut log = self.refusals.lock().unwrap_or_else(PoisonError::into_inner);
                log.unlogged += 1;
                if log
                    .last_line
                    .is_none_or(|at| at.elapsed() >= REFUSAL_LOG_INTERVAL)
                {
                    tracing::warn!(
                        max_ingest_streams = self.max_streams,
                        refused = log.unlogged,
                        "submit streams refused: server.max_ingest_streams are open \
                         (counted in outbox_ingest_streams_refused_total)"
                    );
                    log.last_line = Some(Instant::now());
                    log.unlogged = 0;
                }
                Err(Status::resource_exhausted(format!(
                    "server.max_ingest_streams: this central has {} submit streams open, the \
                     most it allows; try again later",
                    self.max_streams
                )))
            }
        }
    }
}

/// A submit stream's place among `server.max_ingest_streams`, shared by the stream's session and
/// its ack stream: given back, and `outbox_ingest_streams_open` lowered, when both are gone.
struct StreamSlot {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.metrics.ingest_stream(false);
    }
}

/// The acks of one stream, holding the stream's slot until tonic drops them (the stream ended
/// or the client went away).
struct SlotAcks {
    acks: ReceiverStream<Result<NotificationSubmitAck, Status>>,
    _slot: Arc<StreamSlot>,
}

impl Stream for SlotAcks {
    type Item = Result<NotificationSubmitAck, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.acks).poll_next(cx)
    }
}

type AckStream = Pin<Box<dyn Stream<Item = Result<NotificationSubmitAck, Status>> + Send>>;
type StatusBatchStream = Pin<Box<dyn Stream<Item = Result<SiteStatusBatch, Status>> + Send>>;

#[tonic::async_trait]
impl<S: IngestStore + EscalationStore + SiteStatusStore> NotificationIngest for IngestService<S> {
    async fn submit_notification(
        &self,
        request: Request<NotificationSubmit>,
    ) -> Result<Response<NotificationSubmitAck>, Status> {
        let caller_site = self.site_identity.caller_site(&request)?;
        let msg = request.into_inner();
        if let Err(reason) = check_site(caller_site.as_deref(), &msg) {
            tracing::warn!(%reason, "refused a submit for another site");
            return Err(Status::permission_denied(reason));
        }
        let id = msg.notification_id.clone();
        let submission = convert::submission(msg).map_err(|e| {
            self.metrics.ingest_rejected_invalid();
            invalid_argument(e)
        })?;
        // A task of its own, so that what commits is counted even if the caller goes away
        // meanwhile (tonic drops this handler's future then).
        let store = Arc::clone(&self.store);
        let metrics = Arc::clone(&self.metrics);
        let committed = tokio::spawn(async move {
            let outcomes = store.submit(vec![NewNotification::new(submission)]).await?;
            for outcome in &outcomes {
                metrics.ingested(*outcome);
            }
            Ok(outcomes)
        })
        .await
        .unwrap_or_else(|e| Err(StoreError::Unavailable(format!("the submit was lost: {e}"))));
        let outcomes = committed.map_err(store_status)?;
        self.dispatcher_wake.notify_one();
        let outcome = outcomes
            .into_iter()
            .next()
            .ok_or_else(|| Status::internal("the store returned no outcome"))?;
        Ok(Response::new(convert::ack(id, outcome)))
    }

    async fn clear_condition(
        &self,
        request: Request<ClearConditionRequest>,
    ) -> Result<Response<ClearConditionResponse>, Status> {
        let caller_site = self.site_identity.caller_site(&request)?;
        let msg = request.into_inner();
        if let Some(caller) = caller_site.as_deref()
            && caller != msg.source_site_id
        {
            let reason = format!(
                "source_site_id: {:?} is not the caller's site: its client certificate is for \
                 {caller:?}; a site may clear only its own conditions",
                prefix(&msg.source_site_id, MAX_ECHOED_ID_BYTES)
            );
            tracing::warn!(%reason, "refused a clear for another site");
            return Err(Status::permission_denied(reason));
        }
        let site = SiteId::parse(msg.source_site_id).map_err(invalid_argument)?;
        let key =
            ConditionKey::parse(msg.condition_key, "condition_key").map_err(invalid_argument)?;
        let cleared = self
            .store
            .clear_condition(&site, &key, site_actor(site.as_str()))
            .await
            .map_err(store_status)?;
        tracing::info!(
            site = site.as_str(),
            key = key.as_str(),
            cleared = cleared.len(),
            "condition cleared"
        );
        Ok(Response::new(ClearConditionResponse {
            cleared: u32::try_from(cleared.len()).unwrap_or(u32::MAX),
        }))
    }

    async fn acknowledge_condition(
        &self,
        request: Request<AcknowledgeConditionRequest>,
    ) -> Result<Response<AcknowledgeConditionResponse>, Status> {
        let caller_site = self.site_identity.caller_site(&request)?;
        let from = request.remote_addr().map(|a| a.to_string());
        let msg = request.into_inner();
        if let Err(reason) = check_site_field(
            caller_site.as_deref(),
            "source_site_id",
            &msg.source_site_id,
        ) {
            tracing::warn!(%reason, "refused an acknowledgement for another site");
            return Err(Status::permission_denied(format!(
                "{reason}; a site may acknowledge only its own conditions"
            )));
        }
        let site = SiteId::parse(msg.source_site_id).map_err(invalid_argument)?;
        let key =
            ConditionKey::parse(msg.condition_key, "condition_key").map_err(invalid_argument)?;
        let actor = site_ack_actor(site.as_str(), &msg.actor)?;
        let at_site = msg
            .acknowledged_at
            .as_ref()
            .and_then(outbox_proto::time::from_timestamp);
        let ack = Acknowledgement::new(actor, AckMeans::Site, from.as_deref());
        let results = self
            .store
            .acknowledge_condition(&site, &key, ack)
            .await
            .map_err(store_status)?;
        let acknowledged = results
            .iter()
            .filter(|(_, r)| matches!(r, AckResult::Acknowledged { .. }))
            .count();
        let already = results.len() - acknowledged;
        tracing::info!(
            site = site.as_str(),
            key = key.as_str(),
            acknowledged,
            already,
            at_site = ?at_site,
            "condition acknowledged by its site"
        );
        Ok(Response::new(AcknowledgeConditionResponse {
            acknowledged: u32::try_from(acknowledged).unwrap_or(u32::MAX),
            already: u32::try_from(already).unwrap_or(u32::MAX),
        }))
    }

    async fn report_site_health(
        &self,
        request: Request<SiteHealthReport>,
    ) -> Result<Response<ReportSiteHealthResponse>, Status> {
        let caller_site = self.site_identity.caller_site(&request)?;
        let msg = request.into_inner();
        if let Err(reason) = check_site_field(caller_site.as_deref(), "site_id", &msg.site_id) {
            tracing::warn!(%reason, "refused a health report for another site");
            return Err(Status::permission_denied(reason));
        }
        let report = site_health::report(msg).map_err(invalid_argument)?;
        let (site, node) = (report.site.clone(), report.node.clone());
        match self
            .store
            .record_site_health(report)
            .await
            .map_err(store_status)?
        {
            SiteHealthWrite::Stored => Ok(Response::new(ReportSiteHealthResponse {})),
            SiteHealthWrite::SiteFull => {
                // Answered to the node, which logs it; counted here. Not logged per report: the
                // node sends one every few seconds.
                self.metrics.site_health_refused();
                tracing::debug!(
                    site = site.as_str(),
                    node = node.as_str(),
                    "refused a health report: its site has the most nodes central keeps"
                );
                Err(Status::resource_exhausted(format!(
                    "node_name: site {:?} already has {MAX_NODES_PER_SITE} nodes reported, the \
                     most central keeps per site, and {:?} is not one of them; a node that has \
                     not reported for retention.site_health_retention is forgotten and frees \
                     its place",
                    site.as_str(),
                    node.as_str()
                )))
            }
        }
    }

    type WatchSiteStatusStream = StatusBatchStream;

    async fn watch_site_status(
        &self,
        request: Request<Streaming<SiteStatusWatchMessage>>,
    ) -> Result<Response<Self::WatchSiteStatusStream>, Status> {
        let caller_site = self.site_identity.caller_site(&request)?;
        let mut inbound = request.into_inner();
        let first = inbound.message().await?;
        let site = site_status::watched_site(first)?;
        if let Err(reason) =
            check_site_field(caller_site.as_deref(), "watch_site_id", site.as_str())
        {
            tracing::warn!(%reason, "refused a status watch for another site");
            return Err(Status::permission_denied(reason));
        }
        // One batch in flight at a time: room for it and the stream's end.
        let (out, batches) = mpsc::channel(2);
        let session = site_status::Session {
            store: Arc::clone(&self.store),
            feed: Arc::clone(&self.status_feed),
            metrics: Arc::clone(&self.metrics),
            site,
            out,
        };
        tokio::spawn(session.run(inbound, self.shutdown.clone()));
        Ok(Response::new(Box::pin(ReceiverStream::new(batches))))
    }

    type SubmitNotificationsStream = AckStream;

    async fn submit_notifications(
        &self,
        request: Request<Streaming<NotificationSubmit>>,
    ) -> Result<Response<Self::SubmitNotificationsStream>, Status> {
        let caller_site = self.site_identity.caller_site(&request)?;
        let slot = Arc::new(self.open_stream_slot()?);
        let (acks, ack_stream) = mpsc::channel(ACK_BUFFER);
        let session = StreamSession {
            store: Arc::clone(&self.store),
            metrics: Arc::clone(&self.metrics),
            dispatcher_wake: Arc::clone(&self.dispatcher_wake),
            acks,
            caller_site,
            _slot: Arc::clone(&slot),
        };
        tokio::spawn(session.run(request.into_inner(), self.shutdown.clone()));
        Ok(Response::new(Box::pin(SlotAcks {
            acks: ReceiverStream::new(ack_stream),
            _slot: slot,
        })))
    }
}

/// One client's submit stream.
struct StreamSession<S> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    dispatcher_wake: Arc<Notify>,
    acks: mpsc::Sender<Result<NotificationSubmitAck, Status>>,
    /// The only `source_site_id` this stream may submit as; `None` for any.
    caller_site: Option<String>,
    /// The stream's place among `server.max_ingest_streams`.
    _slot: Arc<StreamSlot>,
}

/// Valid submits read together, committed by one store job.
#[derive(Default)]
struct Batch {
    /// The ids as the client sent them, for the acks, in the order of `rows`.
    ids: Vec<String>,
    rows: Vec<NewNotification>,
}

/// What [`StreamSession::take_ready`] read in one go.
struct Taken {
    batch: Batch,
    /// REJECTED acks for the submits that failed validation.
    rejected: Vec<NotificationSubmitAck>,
    end: StreamEnd,
}

impl<S: IngestStore> StreamSession<S> {
    async fn run(self, mut inbound: Streaming<NotificationSubmit>, shutdown: CancellationToken) {
        let this = Arc::new(self);
        let (queue, queued) = mpsc::channel(MAX_BATCHES_QUEUED);
        let committer = tokio::spawn(Arc::clone(&this).commit_in_order(queued));
        // Why the inbound stream failed, if it did; reported after the acks of what came before.
        let mut failure = None;
        loop {
            let first = tokio::select! {
                () = shutdown.cancelled() => {
                    let _ = this.acks.send(Err(Status::unavailable("central is shutting down"))).await;
                    break;
                }
                // The committer stopped (a store failure it reported, or a client not reading).
                () = queue.closed() => return,
                next = inbound.message() => next,
            };
            let first = match first {
                Ok(Some(msg)) => msg,
                Ok(None) => break,
                Err(status) => {
                    failure = Some(status);
                    break;
                }
            };
            let Taken {
                batch,
                rejected,
                end,
            } = this.take_ready(&mut inbound, first);
            for ack in rejected {
                if this.acks.send(Ok(ack)).await.is_err() {
                    // The client went away: nothing more of this stream will be read.
                    return;
                }
            }
            if !batch.rows.is_empty() && queue.send(batch).await.is_err() {
                // The committer stopped: a store failure it reported, or a client not reading.
                return;
            }
            match end {
                StreamEnd::Open => {}
                StreamEnd::Closed => break,
                StreamEnd::Failed(status) => {
                    failure = Some(status);
                    break;
                }
            }
        }
        // Answer everything already received before closing the ack stream.
        drop(queue);
        if !matches!(committer.await, Ok(true)) {
            return;
        }
        if let Some(status) = failure {
            // A reset by the client, or a submit the transport refused (over the message size
            // limit): the stream cannot go on either way. Ending it with the status, rather than
            // cleanly, tells a client still reading why its last submits got no ack.
            tracing::debug!(%status, "submit stream failed");
            let _ = this.acks.send(Err(status)).await;
        }
    }

    /// Inserts the stream's batches one store job at a time, in the order they were read.
    /// Returns false when the stream must end (store failure, or the client stopped reading
    /// acks).
    async fn commit_in_order(self: Arc<Self>, mut queued: mpsc::Receiver<Batch>) -> bool {
        while let Some(batch) = queued.recv().await {
            // A client that went away reads no acks: what it sent is resent on its next
            // stream, so committing the rest now would only compete with that stream.
            if self.acks.is_closed() {
                return false;
            }
            if !self.insert(batch).await {
                return false;
            }
        }
        true
    }

    /// Inserts one batch, sending one ack per submit. Returns false when the stream must end
    /// (store failure, or the client stopped reading acks).
    async fn insert(&self, batch: Batch) -> bool {
        match self.store.submit(batch.rows).await {
            Ok(outcomes) => {
                self.dispatcher_wake.notify_one();
                // Counted as committed, before any ack is sent: a client that stops reading
                // acks does not make committed rows go uncounted.
                for outcome in &outcomes {
                    self.metrics.ingested(*outcome);
                }
                for (id, outcome) in batch.ids.into_iter().zip(outcomes) {
                    if self.acks.send(Ok(convert::ack(id, outcome))).await.is_err() {
                        return false;
                    }
                }
                true
            }
            Err(e) => {
                // Unacked submits are resent by the client when it reconnects.
                let _ = self.acks.send(Err(store_status(e))).await;
                false
            }
        }
    }

    /// Takes `first` plus every submit that has already arrived, up to [`MAX_STREAM_BATCH`]
    /// submits or [`MAX_STREAM_BATCH_BYTES`] of valid ones, without waiting, validating each as
    /// it is taken: the valid ones form the batch, the others are dropped at once, leaving only
    /// their (bounded) REJECTED acks. Also says whether the stream ended (cleanly or not)
    /// meanwhile. A submit for another site than the caller's stops the taking and ends the
    /// stream with PERMISSION_DENIED (after the batch so far is committed and acked); nothing
    /// more is read.
    fn take_ready(
        &self,
        inbound: &mut Streaming<NotificationSubmit>,
        first: NotificationSubmit,
    ) -> Taken {
        let mut taken = Taken {
            batch: Batch::default(),
            rejected: Vec::new(),
            end: StreamEnd::Open,
        };
        let (mut count, mut bytes) = (0, 0);
        let mut next = first;
        loop {
            count += 1;
            let weight = submit_weight(&next);
            match self.validate(next) {
                Ok((id, row)) => {
                    bytes += weight;
                    taken.batch.ids.push(id);
                    taken.batch.rows.push(row);
                }
                Err(Refusal::Rejected(ack)) => taken.rejected.push(ack),
                Err(Refusal::OtherSite(status)) => {
                    taken.end = StreamEnd::Failed(status);
                    return taken;
                }
            }
            if count >= MAX_STREAM_BATCH || bytes >= MAX_STREAM_BATCH_BYTES {
                return taken;
            }
            next = match inbound.message().now_or_never() {
                Some(Ok(Some(msg))) => msg,
                Some(Ok(None)) => {
                    taken.end = StreamEnd::Closed;
                    return taken;
                }
                Some(Err(status)) => {
                    taken.end = StreamEnd::Failed(status);
                    return taken;
                }
                None => return taken,
            };
        }
    }

    /// The row for `msg` and the id its ack names, or why it is refused.
    fn validate(&self, msg: NotificationSubmit) -> Result<(String, NewNotification), Refusal> {
        // Never longer than a valid id, so a valid one is echoed whole.
        let id = prefix(&msg.notification_id, MAX_ECHOED_ID_BYTES).to_owned();
        if let Err(reason) = check_site(self.caller_site.as_deref(), &msg) {
            // Once per stream: the stream ends here, and the site retries with a backoff.
            tracing::warn!(
                %reason,
                "refused a submit stream: a submit for another site than the caller's \
                 certificate names (the site keeps its rows until its certificate is fixed)"
            );
            return Err(Refusal::OtherSite(Status::permission_denied(reason)));
        }
        match convert::submission(msg) {
            Ok(submission) => Ok((id, NewNotification::new(submission))),
            Err(e) => {
                self.metrics.ingest_rejected_invalid();
                Err(Refusal::Rejected(rejected(id, &e.to_string())))
            }
        }
    }
}

/// Why [`StreamSession::validate`] refused a submit.
enum Refusal {
    /// Invalid content: answered with this REJECTED ack (final), and the stream goes on.
    Rejected(NotificationSubmitAck),
    /// For another site than the caller's certificate names: the stream ends with this
    /// PERMISSION_DENIED and the submit gets no ack, so the site keeps it (see the module docs).
    OtherSite(Status),
}

/// A REJECTED ack for `id` with at most [`MAX_REASON_BYTES`] of `reason`.
fn rejected(id: String, reason: &str) -> NotificationSubmitAck {
    convert::rejected(id, prefix(reason, MAX_REASON_BYTES).to_owned())
}

/// The longest beginning of `text` of at most `max_bytes` bytes that ends on a character
/// boundary.
fn prefix(text: &str, max_bytes: usize) -> &str {
    let mut end = max_bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// How [`StreamSession::take_ready`] left the inbound stream.
enum StreamEnd {
    Open,
    Closed,
    Failed(Status),
}

/// What `m` weighs in a batch: its text (every string field: all that can make one large; the
/// rest is a few dozen bytes) and [`SUBMIT_OVERHEAD_BYTES`].
fn submit_weight(m: &NotificationSubmit) -> usize {
    let optional = [&m.origin_execution_id, &m.origin_parent_execution_id]
        .into_iter()
        .flatten()
        .map(String::len);
    [
        &m.notification_id,
        &m.list_name,
        &m.subject,
        &m.body,
        &m.type_data,
        &m.source_site_id,
        &m.source_instance_id,
        &m.source_script,
        &m.condition_key,
    ]
    .iter()
    .map(|text| text.len())
    .chain(optional)
    .sum::<usize>()
        + SUBMIT_OVERHEAD_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submit_as(site: &str) -> NotificationSubmit {
        NotificationSubmit {
            source_site_id: site.into(),
            ..NotificationSubmit::default()
        }
    }

    #[test]
    fn only_a_submit_for_another_site_than_the_certificate_names_is_refused() {
        assert_eq!(check_site(None, &submit_as("site-b")), Ok(()));
        assert_eq!(check_site(Some("site-a"), &submit_as("site-a")), Ok(()));
        let reason = check_site(Some("site-a"), &submit_as("site-b")).unwrap_err();
        assert!(reason.starts_with("source_site_id: \"site-b\""), "{reason}");
        assert!(reason.contains("\"site-a\""), "{reason}");
        // No case folding: site ids are compared as the certificate spells them.
        assert!(check_site(Some("site-a"), &submit_as("Site-A")).is_err());
    }

    #[test]
    fn identity_is_checked_only_when_client_certificates_are_required() {
        assert_eq!(
            SiteIdentity::for_tls(&TlsSettings::default()),
            SiteIdentity::Unchecked
        );
        let request = Request::new(());
        assert_eq!(SiteIdentity::Unchecked.caller_site(&request).unwrap(), None);
        let refused = SiteIdentity::ClientCertificate
            .caller_site(&request)
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    }

    #[test]
    fn the_largest_valid_submit_weighs_at_most_max_submit_weight() {
        use outbox_domain::limits::{
            MAX_BODY_BYTES, MAX_CONDITION_KEY_CHARS, MAX_LIST_NAME_CHARS, MAX_SOURCE_FIELD_CHARS,
            MAX_SUBJECT_CHARS, MAX_TYPE_DATA_BYTES,
        };
        // Every field at its limit, in four-byte characters where any character is allowed.
        let wide = |chars: usize| "\u{1F600}".repeat(chars);
        let type_data_filler = MAX_TYPE_DATA_BYTES - r#"{"k":""}"#.len();
        let submit = NotificationSubmit {
            notification_id: uuid::Uuid::now_v7().to_string(),
            r#type: outbox_proto::v1::NotificationType::Email.into(),
            list_name: wide(MAX_LIST_NAME_CHARS),
            subject: wide(MAX_SUBJECT_CHARS),
            body: "b".repeat(MAX_BODY_BYTES),
            type_data: format!(r#"{{"k":"{}"}}"#, "t".repeat(type_data_filler)),
            source_site_id: "s".repeat(outbox_domain::limits::MAX_SITE_ID_CHARS),
            source_instance_id: wide(MAX_SOURCE_FIELD_CHARS),
            source_script: wide(MAX_SOURCE_FIELD_CHARS),
            site_enqueued_at: Some(outbox_proto::time::to_timestamp(chrono::Utc::now())),
            origin_execution_id: Some(uuid::Uuid::new_v4().to_string()),
            origin_parent_execution_id: Some(uuid::Uuid::new_v4().to_string()),
            priority: 0,
            condition_key: "k".repeat(MAX_CONDITION_KEY_CHARS),
            cleared_at_site: None,
            deliver_after: None,
        };
        let weight = submit_weight(&submit);
        convert::submission(submit).expect("every field at its limit is still valid");
        assert!(
            weight <= MAX_SUBMIT_WEIGHT,
            "{weight} bytes > MAX_SUBMIT_WEIGHT {MAX_SUBMIT_WEIGHT}"
        );
    }

    #[test]
    fn echoed_text_is_cut_on_a_character_boundary() {
        assert_eq!(prefix("short", 64), "short");
        assert_eq!(prefix(&"x".repeat(100), 64).len(), 64);
        // 16 four-byte characters are 64 bytes; 17 are cut back to 16, never mid-character.
        let wide = "\u{1F600}".repeat(17);
        assert_eq!(prefix(&wide, 64), "\u{1F600}".repeat(16));
        assert_eq!(prefix(&wide, 66), "\u{1F600}".repeat(16));
        // A valid id in any form Uuid parses comes back whole.
        let urn = format!("urn:uuid:{}", uuid::Uuid::now_v7());
        assert_eq!(prefix(&urn, MAX_ECHOED_ID_BYTES), urn);
    }
}
