//! In-process tests of [`crate::run`] against a fake central: a small `NotificationIngest` +
//! `NotificationOutbox` server that records submits and clears and answers as told. They check
//! the forwarder's side of the contract (delete only on ack, reject aside, resend after a broken
//! stream, UNAVAILABLE when central is away, a clear ordered among the notifications); the real
//! central is exercised by the workspace's end-to-end tests.
//!
//! This module holds what every topic shares: the fake central, starting a site (or one node of
//! a pair, or with `/metrics`), the client calls, and reading a running site's buffer file. The
//! tests are in one file per topic: [`forwarding`], [`serving`], [`metrics`], [`pair`],
//! [`clears`], [`pair_clears`], [`room`]; [`pair_rig`] runs the two nodes of a pair.
//!
//! Every port a test uses stays its own from start to end: listeners are bound up front and
//! handed to the code under test ([`crate::run_with`]), and an address with nothing behind it
//! yet (central away, a node not started) is held by a [`Reserved`] socket. A port found free,
//! released and bound later can be taken in between by any test running beside it (seen: a
//! node's own SiteNotify listener landing on its pair port, a site forwarding to another test's
//! central).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_proto::v1::notification_ingest_server::{NotificationIngest, NotificationIngestServer};
use outbox_proto::v1::notification_outbox_server::{NotificationOutbox, NotificationOutboxServer};
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use outbox_proto::v1::{
    self, BufferStats, ClearConditionRequest, ClearConditionResponse, GetBufferStatsRequest,
    GetNotificationStatusRequest, NotificationPriority, NotificationStatus, NotificationStatusView,
    NotificationSubmit, NotificationSubmitAck, SendRequest, SubmitOutcome,
};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::config::Config;
use pair_rig::{Node, PairRig};

mod acknowledgements;
mod clears;
mod forwarding;
mod metrics;
mod pair;
mod pair_clears;
mod pair_rig;
mod room;
mod serving;

/// What central received, in the order it received it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Received {
    /// A submit it answered, and whether it came marked cleared at the site.
    Submit { id: String, cleared_at_site: bool },
    /// The ack of a submit on the stream, as it went out.
    Acked { id: String },
    /// A ClearCondition it applied.
    Clear { key: String, site: String },
    /// An AcknowledgeCondition it applied.
    Ack {
        key: String,
        site: String,
        actor: String,
    },
}

/// Central as far as the forwarder can tell: stores submits by id, rejects subjects containing
/// "reject", can break its first stream after one submit or hold its acks on the stream
/// (`acks_held`), and records the clears it applies (refusing the first `fail_clears` with
/// UNAVAILABLE).
#[derive(Clone, Default)]
struct FakeCentral {
    stored: Arc<Mutex<HashMap<String, NotificationSubmit>>>,
    submits_seen: Arc<Mutex<Vec<String>>>,
    received: Arc<Mutex<Vec<Received>>>,
    break_first_stream: Arc<AtomicBool>,
    /// While true, the stream receives and stores submits but sends no ack.
    acks_held: Arc<tokio::sync::watch::Sender<bool>>,
    fail_clears: Arc<AtomicUsize>,
    clear_attempts: Arc<AtomicUsize>,
    /// Acknowledgements to refuse with UNAVAILABLE before applying one, and those asked.
    fail_acks: Arc<AtomicUsize>,
    ack_attempts: Arc<AtomicUsize>,
    /// Every health report received, oldest first.
    health_reports: Arc<Mutex<Vec<v1::SiteHealthReport>>>,
}

impl FakeCentral {
    fn ack(&self, msg: NotificationSubmit) -> NotificationSubmitAck {
        self.submits_seen
            .lock()
            .unwrap()
            .push(msg.notification_id.clone());
        self.received.lock().unwrap().push(Received::Submit {
            id: msg.notification_id.clone(),
            cleared_at_site: msg.cleared_at_site.is_some(),
        });
        let id = msg.notification_id.clone();
        if msg.subject.contains("reject") {
            return NotificationSubmitAck {
                notification_id: id,
                outcome: SubmitOutcome::Rejected.into(),
                reason: "list_name: no such list".into(),
            };
        }
        let mut stored = self.stored.lock().unwrap();
        let outcome = if stored.insert(id.clone(), msg).is_some() {
            SubmitOutcome::Duplicate
        } else {
            SubmitOutcome::Accepted
        };
        NotificationSubmitAck {
            notification_id: id,
            outcome: outcome.into(),
            reason: String::new(),
        }
    }

    fn stored_ids(&self) -> Vec<String> {
        let mut ids: Vec<_> = self.stored.lock().unwrap().keys().cloned().collect();
        ids.sort();
        ids
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Where in [`Self::received`] the first submit of `id` is.
    fn submitted_at(&self, id: &str) -> Option<usize> {
        self.received()
            .iter()
            .position(|r| matches!(r, Received::Submit { id: seen, .. } if seen == id))
    }

    /// Where in [`Self::received`] the ack of `id` went out first.
    fn acked_at(&self, id: &str) -> Option<usize> {
        self.received()
            .iter()
            .position(|r| matches!(r, Received::Acked { id: seen } if seen == id))
    }

    /// Where in [`Self::received`] the first applied clear of `key` is.
    fn cleared_at(&self, key: &str) -> Option<usize> {
        self.received()
            .iter()
            .position(|r| matches!(r, Received::Clear { key: seen, .. } if seen == key))
    }

    /// Where in [`Self::received`] the first applied acknowledgement of `key` is.
    fn acknowledged_at(&self, key: &str) -> Option<usize> {
        self.received()
            .iter()
            .position(|r| matches!(r, Received::Ack { key: seen, .. } if seen == key))
    }

    /// Waits until `done` holds of what central received, failing after a generous deadline.
    fn latest_report(&self) -> Option<v1::SiteHealthReport> {
        self.health_reports.lock().unwrap().last().cloned()
    }

    async fn wait_for(&self, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !done(self) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: {:?}",
                self.received()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

type AckStream = Pin<Box<dyn Stream<Item = Result<NotificationSubmitAck, Status>> + Send>>;

#[tonic::async_trait]
impl NotificationIngest for FakeCentral {
    async fn submit_notification(
        &self,
        request: Request<NotificationSubmit>,
    ) -> Result<Response<NotificationSubmitAck>, Status> {
        Ok(Response::new(self.ack(request.into_inner())))
    }

    type WatchSiteStatusStream =
        Pin<Box<dyn Stream<Item = Result<outbox_proto::v1::SiteStatusBatch, Status>> + Send>>;

    /// A central that decides nothing here: the stream stays open and sends no status (the
    /// end-to-end tests run the real central for those).
    async fn watch_site_status(
        &self,
        _request: Request<Streaming<outbox_proto::v1::SiteStatusWatchMessage>>,
    ) -> Result<Response<Self::WatchSiteStatusStream>, Status> {
        Ok(Response::new(Box::pin(futures_util::stream::pending())))
    }

    type SubmitNotificationsStream = AckStream;

    async fn submit_notifications(
        &self,
        request: Request<Streaming<NotificationSubmit>>,
    ) -> Result<Response<AckStream>, Status> {
        let (tx, rx) = mpsc::channel(1024);
        let central = self.clone();
        let mut inbound = request.into_inner();
        let break_after_one = central.break_first_stream.swap(false, Ordering::SeqCst);
        tokio::spawn(async move {
            while let Some(Ok(msg)) = inbound.next().await {
                if break_after_one {
                    // Received but never acked: the forwarder must resend it.
                    central
                        .submits_seen
                        .lock()
                        .unwrap()
                        .push(msg.notification_id);
                    let _ = tx
                        .send(Err(Status::unavailable("central restarting")))
                        .await;
                    return;
                }
                let ack = central.ack(msg);
                let mut held = central.acks_held.subscribe();
                if held.wait_for(|held| !*held).await.is_err() {
                    return;
                }
                central.received.lock().unwrap().push(Received::Acked {
                    id: ack.notification_id.clone(),
                });
                if tx.send(Ok(ack)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn report_site_health(
        &self,
        request: Request<v1::SiteHealthReport>,
    ) -> Result<Response<v1::ReportSiteHealthResponse>, Status> {
        self.health_reports
            .lock()
            .unwrap()
            .push(request.into_inner());
        Ok(Response::new(v1::ReportSiteHealthResponse {}))
    }

    async fn clear_condition(
        &self,
        request: Request<ClearConditionRequest>,
    ) -> Result<Response<ClearConditionResponse>, Status> {
        self.clear_attempts.fetch_add(1, Ordering::SeqCst);
        let failing = self
            .fail_clears
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(Status::unavailable("central restarting"));
        }
        let request = request.into_inner();
        let cleared = self
            .stored
            .lock()
            .unwrap()
            .values()
            .filter(|n| {
                n.condition_key == request.condition_key
                    && n.source_site_id == request.source_site_id
                    && n.cleared_at_site.is_none()
            })
            .count();
        self.received.lock().unwrap().push(Received::Clear {
            key: request.condition_key,
            site: request.source_site_id,
        });
        Ok(Response::new(ClearConditionResponse {
            cleared: u32::try_from(cleared).unwrap(),
        }))
    }

    async fn acknowledge_condition(
        &self,
        request: Request<v1::AcknowledgeConditionRequest>,
    ) -> Result<Response<v1::AcknowledgeConditionResponse>, Status> {
        self.ack_attempts.fetch_add(1, Ordering::SeqCst);
        let failing = self
            .fail_acks
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(Status::unavailable("central restarting"));
        }
        let request = request.into_inner();
        self.received.lock().unwrap().push(Received::Ack {
            key: request.condition_key,
            site: request.source_site_id,
            actor: request.actor,
        });
        Ok(Response::new(v1::AcknowledgeConditionResponse {
            acknowledged: 1,
            already: 0,
        }))
    }
}

#[tonic::async_trait]
impl NotificationOutbox for FakeCentral {
    async fn list_site_health(
        &self,
        _: Request<v1::ListSiteHealthRequest>,
    ) -> Result<Response<v1::ListSiteHealthResponse>, Status> {
        not_called()
    }

    async fn list_incidents(
        &self,
        _: Request<v1::ListIncidentsRequest>,
    ) -> Result<Response<v1::ListIncidentsResponse>, Status> {
        not_called()
    }

    async fn get_incident(
        &self,
        _: Request<v1::GetIncidentRequest>,
    ) -> Result<Response<v1::IncidentDetail>, Status> {
        not_called()
    }

    async fn acknowledge_incident(
        &self,
        _: Request<v1::AcknowledgeIncidentRequest>,
    ) -> Result<Response<v1::AcknowledgeIncidentResponse>, Status> {
        not_called()
    }

    async fn get_notification_status(
        &self,
        request: Request<GetNotificationStatusRequest>,
    ) -> Result<Response<NotificationStatusView>, Status> {
        let id = request.into_inner().notification_id;
        match self.stored.lock().unwrap().get(&id) {
            Some(msg) => Ok(Response::new(NotificationStatusView {
                notification_id: id,
                status: NotificationStatus::Pending.into(),
                list_name: msg.list_name.clone(),
                ..Default::default()
            })),
            None => Err(Status::not_found(format!("notification {id} not found"))),
        }
    }

    // The admin RPCs: the forwarder never calls them.

    async fn query_notifications(
        &self,
        _: Request<v1::QueryNotificationsRequest>,
    ) -> Result<Response<v1::QueryNotificationsResponse>, Status> {
        not_called()
    }

    async fn get_notification_detail(
        &self,
        _: Request<v1::GetNotificationDetailRequest>,
    ) -> Result<Response<v1::NotificationDetail>, Status> {
        not_called()
    }

    async fn retry_notification(
        &self,
        _: Request<v1::RetryNotificationRequest>,
    ) -> Result<Response<v1::NotificationStatusView>, Status> {
        not_called()
    }

    async fn discard_notification(
        &self,
        _: Request<v1::DiscardNotificationRequest>,
    ) -> Result<Response<v1::NotificationStatusView>, Status> {
        not_called()
    }

    async fn retry_notifications(
        &self,
        _: Request<v1::BulkActionRequest>,
    ) -> Result<Response<v1::BulkActionResponse>, Status> {
        not_called()
    }

    async fn discard_notifications(
        &self,
        _: Request<v1::BulkActionRequest>,
    ) -> Result<Response<v1::BulkActionResponse>, Status> {
        not_called()
    }

    async fn get_kpis(
        &self,
        _: Request<v1::GetKpisRequest>,
    ) -> Result<Response<v1::GetKpisResponse>, Status> {
        not_called()
    }

    async fn list_notification_lists(
        &self,
        _: Request<v1::ListNotificationListsRequest>,
    ) -> Result<Response<v1::ListNotificationListsResponse>, Status> {
        not_called()
    }

    async fn get_webhook_config(
        &self,
        _: Request<v1::GetWebhookConfigRequest>,
    ) -> Result<Response<v1::WebhookConfig>, Status> {
        not_called()
    }

    async fn upsert_webhook_config(
        &self,
        _: Request<v1::UpsertWebhookConfigRequest>,
    ) -> Result<Response<v1::WebhookConfig>, Status> {
        not_called()
    }

    async fn get_notification_list(
        &self,
        _: Request<v1::GetNotificationListRequest>,
    ) -> Result<Response<v1::NotificationList>, Status> {
        not_called()
    }

    async fn upsert_notification_list(
        &self,
        _: Request<v1::UpsertNotificationListRequest>,
    ) -> Result<Response<v1::NotificationList>, Status> {
        not_called()
    }

    async fn delete_notification_list(
        &self,
        _: Request<v1::DeleteNotificationListRequest>,
    ) -> Result<Response<v1::DeleteNotificationListResponse>, Status> {
        not_called()
    }

    async fn get_smtp_config(
        &self,
        _: Request<v1::GetSmtpConfigRequest>,
    ) -> Result<Response<v1::SmtpConfig>, Status> {
        not_called()
    }

    async fn upsert_smtp_config(
        &self,
        _: Request<v1::UpsertSmtpConfigRequest>,
    ) -> Result<Response<v1::SmtpConfig>, Status> {
        not_called()
    }

    async fn delete_smtp_config(
        &self,
        _: Request<v1::DeleteSmtpConfigRequest>,
    ) -> Result<Response<v1::DeleteSmtpConfigResponse>, Status> {
        not_called()
    }
}

fn not_called<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("not part of the fake central"))
}

/// Serves `central` on a port of its own; returns its address and what stops it.
async fn serve_central(central: FakeCentral) -> (SocketAddr, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    start_central(central, listener, stop.clone()).await;
    (addr, stop)
}

/// Serves `central` on the port `port` held while central was away; returns what stops it.
async fn serve_central_at(port: Reserved, central: FakeCentral) -> CancellationToken {
    let stop = CancellationToken::new();
    start_central(central, port.listen(), stop.clone()).await;
    stop
}

async fn start_central(central: FakeCentral, listener: TcpListener, stop: CancellationToken) {
    let server = tonic::transport::Server::builder()
        .add_service(NotificationIngestServer::new(central.clone()))
        .add_service(NotificationOutboxServer::new(central))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), stop.cancelled_owned());
    tokio::spawn(server);
}

struct Site {
    addr: SocketAddr,
    client: SiteNotifyClient<Channel>,
    /// The buffer file, for reading it beside the running site.
    buffer: std::path::PathBuf,
    stop: CancellationToken,
    done: tokio::task::JoinHandle<Result<(), crate::RunError>>,
    _dir: tempfile::TempDir,
}

async fn start_site(central: SocketAddr) -> Site {
    start_site_with(central, |_| {}).await
}

/// Like [`start_site`], with `configure` applied to the test config first.
async fn start_site_with(central: SocketAddr, configure: impl FnOnce(&mut Config)) -> Site {
    start_node(central, crate::Listeners::default(), configure).await
}

/// Like [`start_site_with`], serving the pair link on the port `pair` holds (the `pair.listen`
/// that `configure` sets, see [`pair_node`]).
async fn start_pair_node(
    central: SocketAddr,
    pair: Reserved,
    configure: impl FnOnce(&mut Config),
) -> Site {
    let listeners = crate::Listeners {
        pair: Some(pair.listen()),
        metrics: None,
    };
    start_node(central, listeners, configure).await
}

/// Starts a site with `listeners` bound for it and returns once it answers, i.e. once `run`
/// has opened the buffer (tests read its file) and serves.
async fn start_node(
    central: SocketAddr,
    listeners: crate::Listeners,
    configure: impl FnOnce(&mut Config),
) -> Site {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new("site-a");
    config.buffer_path = dir.path().join("buffer.db");
    config.central_url = format!("http://{central}");
    config.forward_retry_interval = Duration::from_millis(50);
    config.connect_timeout = Duration::from_secs(2);
    config.request_timeout = Duration::from_secs(2);
    configure(&mut config);
    let buffer = config.buffer_path.clone();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let mut done = tokio::spawn(crate::run_with(config, listener, listeners, stop.clone()));
    let client = match SiteNotifyClient::connect(format!("http://{addr}")).await {
        Ok(client) => client,
        Err(error) => {
            let run = tokio::time::timeout(Duration::from_secs(1), &mut done).await;
            panic!("cannot connect to the site: {error:?}; its run: {run:?}");
        }
    };
    let mut site = Site {
        addr,
        client,
        buffer,
        stop,
        done,
        _dir: dir,
    };
    site.stats().await;
    site
}

/// A port held for a test: a socket bound to it but not listening. Connecting to it is refused,
/// as to a central or a node that is down, and no other socket can take the port meanwhile;
/// [`Self::listen`] turns it into the listener that serves it.
struct Reserved {
    socket: tokio::net::TcpSocket,
    addr: SocketAddr,
}

impl Reserved {
    /// A free port on the loopback.
    fn new() -> Self {
        Self::at("127.0.0.1:0".parse().unwrap())
    }

    /// The port of a node or endpoint that just stopped, held again (for its restart).
    fn again(addr: SocketAddr) -> Self {
        Self::at(addr)
    }

    /// With SO_REUSEADDR, as the service binds its own listeners: the connections a stopped
    /// listener leaves on the port (closing, or in TIME_WAIT) inherit it, and would otherwise
    /// keep [`Self::again`] from binding there. A port bound this way is still never picked for
    /// another socket's port 0 or outgoing connection.
    fn at(addr: SocketAddr) -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket.bind(addr).unwrap();
        let addr = socket.local_addr().unwrap();
        Self { socket, addr }
    }

    fn listen(self) -> TcpListener {
        self.socket.listen(1024).unwrap()
    }
}

fn send_request(subject: &str) -> SendRequest {
    SendRequest {
        list_name: "ops".into(),
        subject: subject.into(),
        body: "Level 97%".into(),
        source_script: "tank.py".into(),
        ..Default::default()
    }
}

impl Site {
    async fn send(&mut self, subject: &str) -> String {
        self.client
            .send(send_request(subject))
            .await
            .unwrap()
            .into_inner()
            .notification_id
    }

    /// Sends a notification about the condition `key`.
    async fn send_keyed(&mut self, subject: &str, key: &str) -> String {
        let request = SendRequest {
            condition_key: key.into(),
            ..send_request(subject)
        };
        self.client
            .send(request)
            .await
            .unwrap()
            .into_inner()
            .notification_id
    }

    async fn clear(&mut self, key: &str) -> Result<u32, Status> {
        self.client
            .clear_condition(ClearConditionRequest {
                condition_key: key.into(),
                // A site clears its own keys whatever this says.
                source_site_id: "another-site".into(),
            })
            .await
            .map(|response| response.into_inner().cleared)
    }

    async fn acknowledge(&mut self, key: &str, actor: &str) -> Result<u32, Status> {
        self.client
            .acknowledge(v1::AcknowledgeRequest {
                condition_key: key.into(),
                actor: actor.into(),
            })
            .await
            .map(|response| response.into_inner().pending)
    }

    async fn stats(&mut self) -> BufferStats {
        match self.client.get_buffer_stats(GetBufferStatsRequest {}).await {
            Ok(response) => response.into_inner(),
            Err(error) => {
                // A site that could not start (a port in use, say) answers nothing: say why.
                let run = tokio::time::timeout(Duration::from_secs(1), &mut self.done).await;
                panic!("GetBufferStats failed: {error:?}; the site's run: {run:?}");
            }
        }
    }

    async fn status(&mut self, id: &str) -> Result<NotificationStatusView, Status> {
        self.client
            .get_status(GetNotificationStatusRequest {
                notification_id: id.into(),
            })
            .await
            .map(Response::into_inner)
    }

    /// Polls the stats until `done` holds, failing after a generous deadline.
    async fn wait_for(&mut self, what: &str, done: impl Fn(&BufferStats) -> bool) -> BufferStats {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let stats = self.stats().await;
            if done(&stats) {
                return stats;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: {stats:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn shut_down(self) {
        self.stop.cancel();
        let stopped = tokio::time::timeout(Duration::from_secs(10), self.done).await;
        assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");
    }
}

/// Starts a site serving `/metrics` on a listener bound here; returns it and that address.
async fn start_site_with_metrics(central: SocketAddr) -> (Site, SocketAddr) {
    let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_addr = metrics.local_addr().unwrap();
    let listeners = crate::Listeners {
        pair: None,
        metrics: Some(metrics),
    };
    let site = start_node(central, listeners, |config| {
        config.metrics_listen = Some(metrics_addr);
    })
    .await;
    (site, metrics_addr)
}

/// Scrapes `/metrics` and checks the answer is OpenMetrics text.
async fn scrape(addr: SocketAddr) -> String {
    let reply = metrics_endpoint::get(addr, "/metrics").await.unwrap();
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        reply.content_type.as_deref(),
        Some(metrics_endpoint::CONTENT_TYPE)
    );
    assert!(reply.body.ends_with("# EOF\n"), "{}", reply.body);
    reply.body
}

/// `configure` for one node of an in-process pair whose buffer lives at `buffer`; start it with
/// [`start_pair_node`] on the port reserved for `listen`.
fn pair_node(
    name: &'static str,
    role: crate::domain::Role,
    listen: SocketAddr,
    peer: SocketAddr,
    buffer: std::path::PathBuf,
) -> impl FnOnce(&mut Config) {
    move |config| {
        config.buffer_path = buffer;
        config.pair = Some(crate::config::PairConfig {
            node_name: name.into(),
            initial_role: role,
            listen,
            peer_url: format!("http://{peer}"),
            peer_domain: None,
            send_addr: None,
            // Far above the test's length: nobody is promoted while it runs.
            failover_timeout: Duration::from_secs(60),
        });
    }
}

/// What `sql` selects from a buffer file, read beside its writer, each row through `row`.
fn read_buffer<T, C: FromIterator<T>>(
    buffer: &std::path::Path,
    sql: &str,
    row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> C {
    let conn =
        rusqlite::Connection::open_with_flags(buffer, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut stmt = conn.prepare(sql).unwrap();
    stmt.query_map([], row)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The notification ids in a buffer file's `buffered` table.
fn buffered_ids(buffer: &std::path::Path) -> std::collections::BTreeSet<String> {
    read_buffer(buffer, "SELECT notification_id FROM buffered", |r| r.get(0))
}

/// The notification ids of a buffer file's rows that a clear marked.
fn marked_ids(buffer: &std::path::Path) -> std::collections::BTreeSet<String> {
    let sql = "SELECT notification_id FROM buffered WHERE cleared_at IS NOT NULL";
    read_buffer(buffer, sql, |r| r.get(0))
}

/// The keys of a buffer file's pending clears.
fn pending_clear_keys(buffer: &std::path::Path) -> Vec<String> {
    let sql = "SELECT condition_key FROM pending_clears ORDER BY condition_key";
    read_buffer(buffer, sql, |r| r.get(0))
}

fn pending_ack_keys(buffer: &std::path::Path) -> Vec<String> {
    let sql = "SELECT condition_key FROM pending_acks ORDER BY condition_key";
    read_buffer(buffer, sql, |r| r.get(0))
}

/// A buffer file's pending clears: key, watermark and time, by key.
fn pending_clears(buffer: &std::path::Path) -> Vec<(String, i64, i64)> {
    let sql = "SELECT condition_key, up_to_seq, cleared_at FROM pending_clears ORDER BY 1";
    read_buffer(buffer, sql, |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
}

/// Waits until `done` holds, failing after a generous deadline.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
