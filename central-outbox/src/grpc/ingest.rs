//! `NotificationIngest`: how notifications enter central. Every ack is sent only after the row
//! it acknowledges is committed, so a site may delete its copy the moment it sees the ack.
//!
//! The stream path batches: whatever submits have already arrived (up to [`MAX_STREAM_BATCH`])
//! form one batch, and one committer per stream inserts the batches one store job each, in the
//! order they arrived (up to [`MAX_BATCHES_QUEUED`] wait meanwhile). A batch is not folded into
//! the next: its acks would wait for the larger job, and on MS SQL, whose statements take a
//! chunk of rows each, that multiplies the time to a stream's first ack under load. A stream's
//! rows are therefore committed in stream order: their Ids and serve turns follow the
//! site's order, and of two submits with one condition key the later always supersedes the
//! earlier, never the other way round. Reading and validating the next batches goes on while one
//! commits. Acks of one batch come back in submit order; the contract does not promise it.
//!
//! With client certificates required (`tls.client_ca`), a caller may submit only as the site its
//! certificate names ([`SiteIdentity`]): any other `source_site_id` is refused before validation
//! and nothing of it is stored (PERMISSION_DENIED on the unary call, a REJECTED ack on the
//! stream, which goes on with the caller's other submits). The same rule holds for
//! `ReportSiteHealth` (a site node's health, see `super::site_health`) and `ClearCondition`.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::FutureExt;
use outbox_proto::v1::notification_ingest_server::NotificationIngest;
use outbox_proto::v1::{
    ClearConditionRequest, ClearConditionResponse, NotificationSubmit, NotificationSubmitAck,
    ReportSiteHealthResponse, SiteHealthReport,
};
use tokio::sync::{Notify, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::{convert, invalid_argument, site_health, store_status};
use crate::domain::history::site_actor;
use crate::domain::{ConditionKey, SiteId};
use crate::metrics::Metrics;
use crate::records::NewNotification;
use crate::store::{IngestStore, StoreError};
use crate::tls::{TlsSettings, client_common_name};

/// Most submits inserted by one store job. Large enough to amortise the job overhead, small
/// enough that one batch's acks are not held back for long.
pub const MAX_STREAM_BATCH: usize = 256;
/// Most text one batch may hold, in bytes: [`MAX_STREAM_BATCH`] maximal valid submits (about
/// 280 KiB each). The transport admits submits far larger than any valid one (so that they are
/// refused naming the field, see `limits::MAX_GRPC_MESSAGE_BYTES`); counting bytes keeps a stream
/// of those within the same memory bound as a stream of valid ones.
const MAX_STREAM_BATCH_BYTES: usize = MAX_STREAM_BATCH * 280 * 1024;
/// Batches one stream may have read ahead of its committer. With the batch bounds this bounds the
/// memory one stream can pin (4 batches queued or committing and one being read, about 370 MiB
/// worst case, a few MiB typical) and keeps one busy site from monopolising the writer.
pub const MAX_BATCHES_QUEUED: usize = 4;
/// Acks buffered towards a slow reader before the stream stops reading new submits.
const ACK_BUFFER: usize = MAX_STREAM_BATCH * MAX_BATCHES_QUEUED;

pub struct IngestService<S> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    /// Woken after each commit so the dispatcher on this node starts delivering at once.
    dispatcher_wake: Arc<Notify>,
    /// Cancelled at shutdown: open streams end so the server can stop.
    shutdown: CancellationToken,
    site_identity: SiteIdentity,
}

/// Which `source_site_id` a caller may submit as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SiteIdentity {
    /// Any: without client certificates central cannot tell sites apart (the behaviour before
    /// TLS, and with server-only TLS).
    #[default]
    Unchecked,
    /// Only the one named by the Common Name of the caller's verified client certificate.
    ClientCertificate,
}

impl SiteIdentity {
    /// Checked exactly when `tls` requires client certificates.
    pub fn for_tls(tls: &TlsSettings) -> Self {
        if tls.requires_client_certificates() {
            Self::ClientCertificate
        } else {
            Self::Unchecked
        }
    }

    /// Whether each caller is held to the site its client certificate names.
    pub fn tells_sites_apart(self) -> bool {
        self == Self::ClientCertificate
    }

    /// Says where an operator sees it when sites are not told apart: a warning in the log at
    /// start (over TLS, where an operator may well believe sites are verified; without TLS
    /// the plaintext warning, or loopback, says as much) and the `/metrics` gauge
    /// `outbox_site_identity_unverified`. Changes nothing else: every client served before
    /// is served still.
    pub fn announce(self, serves_tls: bool, metrics: &Metrics) {
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
            "{field}: {site:?} is not the caller's site: its client certificate is for {caller:?}"
        )),
        _ => Ok(()),
    }
}

impl<S> IngestService<S> {
    pub fn new(
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
        }
    }

    /// Which sites each caller may submit as (unchecked unless set).
    pub fn with_site_identity(mut self, site_identity: SiteIdentity) -> Self {
        self.site_identity = site_identity;
        self
    }
}

type AckStream = Pin<Box<dyn Stream<Item = Result<NotificationSubmitAck, Status>> + Send>>;

#[tonic::async_trait]
impl<S: IngestStore> NotificationIngest for IngestService<S> {
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
                msg.source_site_id
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
        self.store
            .record_site_health(report)
            .await
            .map_err(store_status)?;
        Ok(Response::new(ReportSiteHealthResponse {}))
    }

    type SubmitNotificationsStream = AckStream;

    async fn submit_notifications(
        &self,
        request: Request<Streaming<NotificationSubmit>>,
    ) -> Result<Response<Self::SubmitNotificationsStream>, Status> {
        let caller_site = self.site_identity.caller_site(&request)?;
        let (acks, ack_stream) = mpsc::channel(ACK_BUFFER);
        let session = StreamSession {
            store: Arc::clone(&self.store),
            metrics: Arc::clone(&self.metrics),
            dispatcher_wake: Arc::clone(&self.dispatcher_wake),
            acks,
            caller_site,
            warned_other_site: AtomicBool::new(false),
        };
        tokio::spawn(session.run(request.into_inner(), self.shutdown.clone()));
        Ok(Response::new(Box::pin(ReceiverStream::new(ack_stream))))
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
    /// Whether a submit for another site was logged at WARN yet: once per stream, since a
    /// misconfigured site would otherwise log once for every row of its backlog.
    warned_other_site: AtomicBool,
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
            let (batch, end) = take_ready(&mut inbound, first);
            if queue.send(batch).await.is_err() {
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
    async fn commit_in_order(
        self: Arc<Self>,
        mut queued: mpsc::Receiver<Vec<NotificationSubmit>>,
    ) -> bool {
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

    /// Validates and inserts one batch, sending one ack per submit. Returns false when the stream
    /// must end (store failure, or the client stopped reading acks).
    async fn insert(&self, batch: Vec<NotificationSubmit>) -> bool {
        let mut valid_ids = Vec::with_capacity(batch.len());
        let mut valid = Vec::with_capacity(batch.len());
        for msg in batch {
            let id = msg.notification_id.clone();
            if let Err(reason) = check_site(self.caller_site.as_deref(), &msg) {
                if self.warned_other_site.swap(true, Ordering::Relaxed) {
                    tracing::debug!(%reason, "refused a submit for another site");
                } else {
                    tracing::warn!(%reason, "refused a submit for another site (once per stream)");
                }
                if self
                    .acks
                    .send(Ok(convert::rejected(id, reason)))
                    .await
                    .is_err()
                {
                    return false;
                }
                continue;
            }
            match convert::submission(msg) {
                Ok(submission) => {
                    valid_ids.push(id);
                    valid.push(NewNotification::new(submission));
                }
                Err(e) => {
                    self.metrics.ingest_rejected_invalid();
                    if self
                        .acks
                        .send(Ok(convert::rejected(id, e.to_string())))
                        .await
                        .is_err()
                    {
                        return false;
                    }
                }
            }
        }
        if valid.is_empty() {
            return true;
        }
        match self.store.submit(valid).await {
            Ok(outcomes) => {
                self.dispatcher_wake.notify_one();
                // Counted as committed, before any ack is sent: a client that stops reading
                // acks does not make committed rows go uncounted.
                for outcome in &outcomes {
                    self.metrics.ingested(*outcome);
                }
                for (id, outcome) in valid_ids.into_iter().zip(outcomes) {
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
}

/// How [`take_ready`] left the inbound stream.
enum StreamEnd {
    Open,
    Closed,
    Failed(Status),
}

/// Takes `first` plus every submit that has already arrived, up to [`MAX_STREAM_BATCH`] submits
/// or [`MAX_STREAM_BATCH_BYTES`], without waiting. Returns the batch and whether the stream ended
/// (cleanly or not) meanwhile.
fn take_ready(
    inbound: &mut Streaming<NotificationSubmit>,
    first: NotificationSubmit,
) -> (Vec<NotificationSubmit>, StreamEnd) {
    let mut bytes = text_bytes(&first);
    let mut batch = vec![first];
    while batch.len() < MAX_STREAM_BATCH && bytes < MAX_STREAM_BATCH_BYTES {
        match inbound.message().now_or_never() {
            Some(Ok(Some(msg))) => {
                bytes += text_bytes(&msg);
                batch.push(msg);
            }
            Some(Ok(None)) => return (batch, StreamEnd::Closed),
            Some(Err(status)) => return (batch, StreamEnd::Failed(status)),
            None => break,
        }
    }
    (batch, StreamEnd::Open)
}

/// The bytes of a submit's text fields: all that can make one large (the rest is a few dozen).
fn text_bytes(m: &NotificationSubmit) -> usize {
    [
        &m.notification_id,
        &m.list_name,
        &m.subject,
        &m.body,
        &m.type_data,
        &m.source_site_id,
        &m.source_instance_id,
        &m.source_script,
    ]
    .iter()
    .map(|text| text.len())
    .sum()
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
}
