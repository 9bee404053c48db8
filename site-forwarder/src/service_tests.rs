//! In-process tests of [`crate::run`] against a fake central: a small `NotificationIngest` +
//! `NotificationOutbox` server that records submits and clears and answers as told. They check
//! the forwarder's side of the contract (delete only on ack, reject aside, resend after a broken
//! stream, UNAVAILABLE when central is away, a clear ordered among the notifications); the real
//! central is exercised by the workspace's end-to-end tests.
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

/// What central received, in the order it received it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Received {
    /// A submit it answered, and whether it came marked cleared at the site.
    Submit { id: String, cleared_at_site: bool },
    /// The ack of a submit on the stream, as it went out.
    Acked { id: String },
    /// A ClearCondition it applied.
    Clear { key: String, site: String },
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
}

#[tonic::async_trait]
impl NotificationOutbox for FakeCentral {
    async fn list_site_health(
        &self,
        _: Request<v1::ListSiteHealthRequest>,
    ) -> Result<Response<v1::ListSiteHealthResponse>, Status> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_deletes_on_ack_and_sets_rejections_aside() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let central_addr = listener.local_addr().unwrap();
    let central = FakeCentral::default();
    let central_stop = CancellationToken::new();
    start_central(central.clone(), listener, central_stop.clone()).await;
    let mut site = start_site(central_addr).await;

    let a = site.send("first").await;
    let b = site.send("second").await;
    let bad = site.send("please reject").await;
    // last_forward_at is stamped just after the buffer commit the depth shows: wait for both.
    let stats = site
        .wait_for("the buffer to drain", |s| {
            s.depth == 0 && s.rejected == 1 && s.last_forward_at.is_some()
        })
        .await;
    assert!(stats.central_reachable);
    let mut expected = vec![a.clone(), b];
    expected.sort();
    assert_eq!(central.stored_ids(), expected);
    let stored = central.stored.lock().unwrap().get(&a).cloned().unwrap();
    assert_eq!(stored.source_site_id, "site-a");
    assert_eq!(stored.source_script, "tank.py");
    assert!(stored.site_enqueued_at.is_some());

    // Forwarded: central answers. Rejected: the local reason. Unknown: central's NOT_FOUND.
    let view = site.status(&a).await.unwrap();
    assert_eq!(view.status, i32::from(NotificationStatus::Pending));
    let err = site.status(&bad).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(
        err.message(),
        "rejected by central: list_name: no such list"
    );
    let unknown = crate::domain::NotificationId::generate().to_string();
    assert_eq!(
        site.status(&unknown).await.unwrap_err().code(),
        Code::NotFound
    );
    let err = site.status("not-a-uuid").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().starts_with("notification_id:"));

    site.shut_down().await;
    central_stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffers_while_central_is_away_and_resends_after_a_broken_stream() {
    // Central's port, held and refusing until central comes.
    let central_port = Reserved::new();
    let central_addr = central_port.addr;
    let mut site = start_site(central_addr).await;

    let first = site.send("first").await;
    let forwarding = site.status(&first).await.unwrap();
    assert_eq!(forwarding.status, i32::from(NotificationStatus::Forwarding));
    assert_eq!(forwarding.list_name, "ops");
    assert_eq!(forwarding.source_site_id, "site-a");
    let unknown = crate::domain::NotificationId::generate().to_string();
    let err = site.status(&unknown).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(
        err.message().starts_with(&format!(
            "central outbox at http://{central_addr} is unreachable"
        )),
        "{}",
        err.message()
    );
    let second = site.send("second").await;
    let stats = site.stats().await;
    assert_eq!(stats.depth, 2);
    assert!(!stats.central_reachable);
    assert!(stats.oldest_enqueued_at.is_some());

    // Central comes back, but its first stream breaks after one unacked submit.
    let listener = central_port.listen();
    let central = FakeCentral::default();
    central.break_first_stream.store(true, Ordering::SeqCst);
    let central_stop = CancellationToken::new();
    start_central(central.clone(), listener, central_stop.clone()).await;

    site.wait_for("the buffer to drain", |s| s.depth == 0).await;
    let mut expected = vec![first.clone(), second];
    expected.sort();
    assert_eq!(central.stored_ids(), expected);
    let seen = central.submits_seen.lock().unwrap().clone();
    assert!(
        seen.iter().filter(|id| **id == first).count() >= 2,
        "the unacked submit was resent: {seen:?}"
    );

    site.shut_down().await;
    central_stop.cancel();
}

/// The priority a script gives reaches central unchanged (none given: normal), and the site
/// shows it while the notification waits in the buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_priority_is_shown_while_buffered_and_forwarded_to_central() {
    let central_port = Reserved::new();
    let central_addr = central_port.addr;
    let mut site = start_site(central_addr).await;

    let mut urgent = send_request("urgent");
    urgent.priority = NotificationPriority::Critical.into();
    let critical = site.client.send(urgent).await.unwrap().into_inner();
    let normal = site.send("unspecified").await;
    let view = site.status(&critical.notification_id).await.unwrap();
    assert_eq!(view.status(), NotificationStatus::Forwarding);
    assert_eq!(view.priority(), NotificationPriority::Critical);
    let view = site.status(&normal).await.unwrap();
    assert_eq!(view.priority(), NotificationPriority::Normal);

    let listener = central_port.listen();
    let central = FakeCentral::default();
    let central_stop = CancellationToken::new();
    start_central(central.clone(), listener, central_stop.clone()).await;
    site.wait_for("the buffer to drain", |s| s.depth == 0).await;
    let stored = central.stored.lock().unwrap().clone();
    assert_eq!(
        stored[&critical.notification_id].priority(),
        NotificationPriority::Critical
    );
    assert_eq!(stored[&normal].priority(), NotificationPriority::Normal);

    site.shut_down().await;
    central_stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_rejects_bad_input_and_buffers_nothing() {
    let central = Reserved::new();
    let mut site = start_site(central.addr).await;

    let mut bad_subject = send_request("x");
    bad_subject.subject = "hi\r\nBcc: victim@example.com".into();
    let mut bad_type = send_request("x");
    bad_type.r#type = 42;
    let mut bad_priority = send_request("x");
    bad_priority.priority = 42;
    for (request, field) in [
        (bad_subject, "subject"),
        (bad_type, "type"),
        (bad_priority, "priority"),
    ] {
        let err = site.client.send(request).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().starts_with(&format!("{field}: ")), "{err:?}");
    }
    assert_eq!(site.stats().await.depth, 0);
    site.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_are_served() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let central = Reserved::new();
    let site = start_site(central.addr).await;
    let channel = Channel::from_shared(format!("http://{}", site.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();

    let mut health = HealthClient::new(channel.clone());
    for service in ["", "outbox.v1.SiteNotify"] {
        let answer = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            answer.status,
            i32::from(ServingStatus::Serving),
            "{service:?}"
        );
    }

    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::once(request))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        answers.next().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list");
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    for expected in ["outbox.v1.SiteNotify", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == expected), "{names:?}");
    }
    site.shut_down().await;
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

fn forwarded(text: &str, outcome: &str) -> Option<f64> {
    let series = format!("outbox_site_forwarded_total{{outcome=\"{outcome}\"}}");
    metrics_endpoint::sample(text, &series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_mirror_the_buffer_while_central_is_away() {
    let central = Reserved::new();
    let (mut site, metrics_addr) = start_site_with_metrics(central.addr).await;

    for subject in ["one", "two", "three"] {
        site.send(subject).await;
    }
    let stats = site.stats().await;
    assert_eq!(stats.depth, 3);
    let text = scrape(metrics_addr).await;
    let sample = |series: &str| metrics_endpoint::sample(&text, series);
    assert_eq!(sample("outbox_site_buffer_depth"), Some(stats.depth as f64));
    assert_eq!(sample("outbox_site_central_reachable"), Some(0.0));
    assert_eq!(sample("outbox_site_in_flight"), Some(0.0));
    assert_eq!(sample("outbox_site_sends_accepted_total"), Some(3.0));
    assert_eq!(sample("outbox_site_buffer_rejected"), Some(0.0));
    assert_eq!(
        sample("outbox_site_last_forward_timestamp_seconds"),
        Some(0.0)
    );
    assert!(sample("outbox_site_buffer_oldest_age_seconds").is_some());
    assert_eq!(forwarded(&text, "accepted"), Some(0.0));
    // The endpoint's own connections: the scrape itself is open, nothing was refused.
    assert_eq!(
        sample("outbox_http_connections_refused_total{listener=\"metrics\"}"),
        Some(0.0)
    );
    assert_eq!(
        sample("outbox_http_connections_open{listener=\"metrics\"}"),
        Some(1.0)
    );

    let other = metrics_endpoint::get(metrics_addr, "/").await.unwrap();
    assert_eq!(other.status, 404);
    site.shut_down().await;
    // Held, so that nothing else answers there now.
    let _metrics_port = Reserved::again(metrics_addr);
    assert!(
        metrics_endpoint::get(metrics_addr, "/metrics")
            .await
            .is_err(),
        "the endpoint stops with the service"
    );
}

/// A listener handed to `run_with` stands for a configured address: one bound elsewhere, or
/// for an address that is not configured, stops start-up naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_given_must_be_bound_to_the_configured_address() {
    let central = Reserved::new();
    let other = Reserved::new();
    for (metrics_listen, expected) in [
        (Some(other.addr), "metrics_listen: 127.0.0.1:"),
        (None, "metrics_listen: not set"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::new("site-a");
        config.buffer_path = dir.path().join("buffer.db");
        config.central_url = format!("http://{}", central.addr);
        config.metrics_listen = metrics_listen;
        let listeners = crate::Listeners {
            pair: None,
            metrics: Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
        };
        let site = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stop = CancellationToken::new();
        let err = crate::run_with(config, site, listeners, stop)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, crate::RunError::Config(problem) if problem.starts_with(expected)),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_central_acked() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let central_addr = listener.local_addr().unwrap();
    let central_stop = CancellationToken::new();
    let central = FakeCentral::default();
    start_central(central.clone(), listener, central_stop.clone()).await;
    let (mut site, metrics_addr) = start_site_with_metrics(central_addr).await;

    for subject in ["first", "second", "please reject"] {
        site.send(subject).await;
    }
    // Each notification central took is counted once, when the buffer deletes it: as accepted,
    // or as duplicate when the stream broke before its ack and central answered the resubmit
    // DUPLICATE. Which of the two depends on timing, so they are counted together; a
    // duplicate is only counted for a submit central received more than once.
    let delivered =
        |text: &str| forwarded(text, "accepted").unwrap() + forwarded(text, "duplicate").unwrap();
    // Counters move last (after the buffer commit and the forward stamp), and a scrape reads the
    // buffer before it renders them, so the scrape that first shows an ack counted may still
    // show its row buffered: wait for the counters, then scrape again for the rest.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = scrape(metrics_addr).await;
        if delivered(&text) == 2.0 && forwarded(&text, "rejected") == Some(1.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for the acks to be counted:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = scrape(metrics_addr).await;
    let sample = |series: &str| metrics_endpoint::sample(&text, series);
    assert_eq!(delivered(&text), 2.0, "{text}");
    assert_eq!(forwarded(&text, "rejected"), Some(1.0));
    let resubmits = central.submits_seen.lock().unwrap().len() - 3;
    assert!(
        forwarded(&text, "duplicate").unwrap() <= resubmits as f64,
        "duplicates counted beyond the {resubmits} resubmits central received:\n{text}"
    );
    assert_eq!(sample("outbox_site_buffer_depth"), Some(0.0));
    assert_eq!(sample("outbox_site_buffer_rejected"), Some(1.0));
    assert_eq!(sample("outbox_site_buffer_oldest_age_seconds"), Some(0.0));
    assert_eq!(sample("outbox_site_central_reachable"), Some(1.0));
    assert_eq!(sample("outbox_site_sends_accepted_total"), Some(3.0));
    let last = sample("outbox_site_last_forward_timestamp_seconds").unwrap();
    let stats = site.stats().await;
    let last_forward_at = stats.last_forward_at.unwrap();
    assert_eq!(
        (last * 1000.0).round() as i64,
        last_forward_at.seconds * 1000 + i64::from(last_forward_at.nanos / 1_000_000),
        "the same instant GetBufferStats reports"
    );

    site.shut_down().await;
    central_stop.cancel();
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

/// The notification ids in a buffer file's `buffered` table, read beside its writer.
fn buffered_ids(buffer: &std::path::Path) -> std::collections::BTreeSet<String> {
    let conn =
        rusqlite::Connection::open_with_flags(buffer, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut stmt = conn
        .prepare("SELECT notification_id FROM buffered")
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The notification ids in a buffer file's `buffered` table with their priority ranks.
fn buffered_priorities(buffer: &std::path::Path) -> std::collections::BTreeMap<String, i64> {
    let conn =
        rusqlite::Connection::open_with_flags(buffer, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut stmt = conn
        .prepare("SELECT notification_id, priority FROM buffered")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Sends `n` notifications on 8 connections at once, cycling through every priority value
/// (unspecified included); returns their ids.
async fn send_concurrently(site: &Site, n: usize, tag: &str) -> Vec<String> {
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..8 {
        let mut client = site.client.clone();
        let tag = tag.to_owned();
        tasks.spawn(async move {
            let mut ids = Vec::new();
            for i in (caller..n).step_by(8) {
                let mut request = send_request(&format!("{tag} {i}"));
                request.priority = i32::try_from(i % 5).unwrap();
                let reply = client.send(request).await;
                ids.push(reply.unwrap().into_inner().notification_id);
            }
            ids
        });
    }
    let mut ids = Vec::new();
    while let Some(done) = tasks.join_next().await {
        ids.extend(done.unwrap());
    }
    ids
}

/// The standby ends up with exactly the active's rows whichever way they reached it: read
/// back from the table (sent before it attached, or while it was down) or handed over in
/// memory (sent while it follows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_copies_rows_from_the_table_and_from_memory_alike() {
    use crate::domain::Role;
    let central_port = Reserved::new();
    let central = central_port.addr;
    let (a_port, b_port) = (Reserved::new(), Reserved::new());
    let (a_pair, b_pair) = (a_port.addr, b_port.addr);
    let dir = tempfile::tempdir().unwrap();
    let (a_buffer, b_buffer) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let active = start_pair_node(
        central,
        a_port,
        pair_node("a", Role::Active, a_pair, b_pair, a_buffer.clone()),
    )
    .await;
    let standby_config = || pair_node("b", Role::Standby, b_pair, a_pair, b_buffer.clone());

    let mut sent = send_concurrently(&active, 300, "before").await;
    let mut standby = start_pair_node(central, b_port, standby_config()).await;
    standby
        .wait_for("the rows sent before it attached", |s| s.depth == 300)
        .await;
    sent.extend(send_concurrently(&active, 600, "while following").await);
    standby
        .wait_for("the rows sent while it follows", |s| s.depth == 900)
        .await;
    let expected: std::collections::BTreeSet<String> = sent.iter().cloned().collect();
    assert_eq!(buffered_ids(&b_buffer), expected);

    // Down and back: it resumes, reading what it missed from the table.
    standby.shut_down().await;
    let b_port = Reserved::again(b_pair);
    sent.extend(send_concurrently(&active, 200, "while away").await);
    let mut standby = start_pair_node(central, b_port, standby_config()).await;
    sent.extend(send_concurrently(&active, 200, "after").await);
    standby
        .wait_for("every row after the restart", |s| s.depth == 1300)
        .await;
    let expected: std::collections::BTreeSet<String> = sent.into_iter().collect();
    assert_eq!(buffered_ids(&b_buffer), expected);
    assert_eq!(buffered_ids(&a_buffer), expected);
    // Each row with the priority it was sent with (an unspecified one stored as normal).
    let priorities = buffered_priorities(&b_buffer);
    assert_eq!(priorities, buffered_priorities(&a_buffer));
    let ranks: std::collections::BTreeSet<i64> = priorities.values().copied().collect();
    assert_eq!(ranks, (0..4).collect());
    standby.shut_down().await;
    active.shut_down().await;
}

/// Rows central acks leave the standby too, including those acked while they were still
/// held in memory for the stream: it never keeps a row the active deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_drops_every_row_central_acked() {
    use crate::domain::Role;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let central_addr = listener.local_addr().unwrap();
    let central_stop = CancellationToken::new();
    let central = FakeCentral::default();
    start_central(central.clone(), listener, central_stop.clone()).await;
    let (a_port, b_port) = (Reserved::new(), Reserved::new());
    let (a_pair, b_pair) = (a_port.addr, b_port.addr);
    let dir = tempfile::tempdir().unwrap();
    let b_buffer = dir.path().join("b.db");
    let mut active = start_pair_node(
        central_addr,
        a_port,
        pair_node("a", Role::Active, a_pair, b_pair, dir.path().join("a.db")),
    )
    .await;
    let mut standby = start_pair_node(
        central_addr,
        b_port,
        pair_node("b", Role::Standby, b_pair, a_pair, b_buffer.clone()),
    )
    .await;
    standby
        .wait_for("the standby to follow", |s| s.active_node == "a")
        .await;

    let sent = send_concurrently(&active, 600, "acked").await;
    active
        .wait_for("the active to settle every ack", |s| s.depth == 0)
        .await;
    let stored = central.stored_ids();
    assert!(sent.iter().all(|id| stored.binary_search(id).is_ok()));
    // An empty standby proves nothing yet: it can be empty for a moment while rows the active
    // deleted are still on their way to it, their removal in a later batch. A row committed now
    // reaches it in a batch that carries, or follows one that carried, every removal committed
    // before (batches are applied in order): once the standby holds that row, it holds nothing
    // else. Held unacked at central, so that it stays.
    central.acks_held.send_replace(true);
    let last = active.send("last").await;
    eventually("the standby to copy the last row", || {
        buffered_ids(&b_buffer).contains(&last)
    })
    .await;
    assert_eq!(buffered_ids(&b_buffer), [last].into());
    central.acks_held.send_replace(false);
    standby
        .wait_for("the standby to drop the last row", |s| s.depth == 0)
        .await;
    assert!(buffered_ids(&b_buffer).is_empty());
    standby.shut_down().await;
    active.shut_down().await;
    central_stop.cancel();
}

/// The notification ids of a buffer file's rows that a clear marked.
fn marked_ids(buffer: &std::path::Path) -> std::collections::BTreeSet<String> {
    let conn =
        rusqlite::Connection::open_with_flags(buffer, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut stmt = conn
        .prepare("SELECT notification_id FROM buffered WHERE cleared_at IS NOT NULL")
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The keys of a buffer file's pending clears.
fn pending_clear_keys(buffer: &std::path::Path) -> Vec<String> {
    let conn =
        rusqlite::Connection::open_with_flags(buffer, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut stmt = conn
        .prepare("SELECT condition_key FROM pending_clears ORDER BY condition_key")
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A buffer file's pending clears: key, watermark and time, by key.
fn pending_clears(buffer: &std::path::Path) -> Vec<(String, i64, i64)> {
    let conn =
        rusqlite::Connection::open_with_flags(buffer, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut stmt = conn
        .prepare("SELECT condition_key, up_to_seq, cleared_at FROM pending_clears ORDER BY 1")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
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

/// A key reaches central with the notification; a clear after the notification was acked marks
/// nothing here (it is central's now) and reaches central, for this site whatever the request
/// said; a row of another key is never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_key_is_forwarded_and_a_later_clear_goes_to_central() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let central_addr = listener.local_addr().unwrap();
    let central = FakeCentral::default();
    let central_stop = CancellationToken::new();
    start_central(central.clone(), listener, central_stop.clone()).await;
    let mut site = start_site(central_addr).await;

    let keyed = site.send_keyed("Tank 4 high", "tank4.level.high").await;
    let other = site.send_keyed("Pump 7 stopped", "pump7.running").await;
    site.wait_for("the buffer to drain", |s| s.depth == 0).await;
    let stored = central.stored.lock().unwrap().clone();
    assert_eq!(stored[&keyed].condition_key, "tank4.level.high");
    assert_eq!(stored[&keyed].cleared_at_site, None);

    assert_eq!(site.clear("tank4.level.high").await.unwrap(), 0);
    central
        .wait_for("the clear", |c| c.cleared_at("tank4.level.high").is_some())
        .await;
    assert!(central.received().contains(&Received::Clear {
        key: "tank4.level.high".into(),
        site: "site-a".into(),
    }));
    assert!(central.cleared_at("pump7.running").is_none());
    assert_eq!(central.stored.lock().unwrap()[&other].cleared_at_site, None);
    eventually("the pending clear to be deleted", || {
        pending_clear_keys(&site.buffer).is_empty()
    })
    .await;
    site.shut_down().await;
    central_stop.cancel();
}

/// The whole ordering while central is away: the clear marks the key's buffered rows (GetStatus
/// says CLEARED); when central returns they arrive marked, THEN central is asked to clear the
/// key (retried after a refusal), and only then goes the row of the key sent after the clear.
/// Rows of another key or none are sent unmarked and never wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_while_central_is_away_reaches_central_after_the_rows_before_it() {
    let central_port = Reserved::new();
    let mut site = start_site(central_port.addr).await;
    let key = "tank4.level.high";

    let first = site.send_keyed("high", key).await;
    let second = site.send_keyed("still high", key).await;
    let other_key = site.send_keyed("pump stopped", "pump7.running").await;
    let no_key = site.send("plain").await;
    assert_eq!(site.clear(key).await.unwrap(), 2);
    assert_eq!(site.clear(key).await.unwrap(), 0, "already cleared");
    let after = site.send_keyed("high again", key).await;

    let view = site.status(&first).await.unwrap();
    assert_eq!(view.status(), NotificationStatus::Cleared);
    assert_eq!(view.condition_key, key);
    let view = site.status(&other_key).await.unwrap();
    assert_eq!(view.status(), NotificationStatus::Forwarding);
    assert_eq!(view.condition_key, "pump7.running");
    assert_eq!(
        site.status(&after).await.unwrap().status(),
        NotificationStatus::Forwarding
    );
    assert_eq!(pending_clear_keys(&site.buffer), vec![key.to_owned()]);

    let listener = central_port.listen();
    let central = FakeCentral::default();
    central.fail_clears.store(1, Ordering::SeqCst);
    let central_stop = CancellationToken::new();
    start_central(central.clone(), listener, central_stop.clone()).await;
    site.wait_for("the buffer to drain", |s| s.depth == 0).await;

    let stored = central.stored.lock().unwrap().clone();
    for id in [&first, &second] {
        assert!(stored[id].cleared_at_site.is_some(), "{id} arrives cleared");
    }
    for id in [&other_key, &no_key, &after] {
        assert_eq!(stored[id].cleared_at_site, None, "{id} is not touched");
    }
    let clear = central.cleared_at(key).expect("central applied the clear");
    for id in [&first, &second] {
        assert!(
            central.submitted_at(id).unwrap() < clear,
            "{id} before the clear: {:?}",
            central.received()
        );
    }
    assert!(
        central.submitted_at(&after).unwrap() > clear,
        "the row sent after the clear waits for it: {:?}",
        central.received()
    );
    assert!(
        central.clear_attempts.load(Ordering::SeqCst) >= 2,
        "retried"
    );
    assert!(central.cleared_at("pump7.running").is_none());
    eventually("the pending clear to be deleted", || {
        pending_clear_keys(&site.buffer).is_empty()
    })
    .await;
    site.shut_down().await;
    central_stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_condition_keys_are_refused_naming_the_field() {
    let central = Reserved::new();
    let mut site = start_site(central.addr).await;
    for bad in ["tank 4", "tänk", &"k".repeat(129)] {
        let request = SendRequest {
            condition_key: bad.to_string(),
            ..send_request("x")
        };
        let err = site.client.send(request).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().starts_with("condition_key: "), "{err:?}");
    }
    for bad in ["", "tank 4"] {
        let err = site.clear(bad).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().starts_with("condition_key: "), "{err:?}");
    }
    assert_eq!(site.stats().await.depth, 0);
    assert!(pending_clear_keys(&site.buffer).is_empty());
    site.shut_down().await;
}

/// A clear committed while central is away is not lost by a restart: its marks and its pending
/// central half are on disk, and the restarted site finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_clear_survives_a_restart() {
    let central_port = Reserved::new();
    let central_addr = central_port.addr;
    let dir = tempfile::tempdir().unwrap();
    let buffer = dir.path().join("buffer.db");
    let configure = || {
        let buffer = buffer.clone();
        move |config: &mut Config| config.buffer_path = buffer
    };
    let mut site = start_site_with(central_addr, configure()).await;
    let id = site.send_keyed("high", "tank4.level.high").await;
    assert_eq!(site.clear("tank4.level.high").await.unwrap(), 1);
    site.shut_down().await;

    let mut site = start_site_with(central_addr, configure()).await;
    assert_eq!(
        site.status(&id).await.unwrap().status(),
        NotificationStatus::Cleared
    );
    let listener = central_port.listen();
    let central = FakeCentral::default();
    let central_stop = CancellationToken::new();
    start_central(central.clone(), listener, central_stop.clone()).await;
    central
        .wait_for("the clear", |c| c.cleared_at("tank4.level.high").is_some())
        .await;
    assert!(central.submitted_at(&id).unwrap() < central.cleared_at("tank4.level.high").unwrap());
    assert!(
        central.stored.lock().unwrap()[&id]
            .cleared_at_site
            .is_some()
    );
    site.wait_for("the buffer to drain", |s| s.depth == 0).await;
    site.shut_down().await;
    central_stop.cancel();
}

/// The standby's copy follows the clears: rows a clear marks while it follows are copied again
/// marked, and so are rows marked while it was away, once it resumes. A standby refuses a clear
/// as it refuses a Send: only the active's clears reach central.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_gets_the_marks_of_a_clear_live_and_after_a_resume() {
    use crate::domain::Role;
    let central_port = Reserved::new();
    let central = central_port.addr;
    let (a_port, b_port) = (Reserved::new(), Reserved::new());
    let (a_pair, b_pair) = (a_port.addr, b_port.addr);
    let dir = tempfile::tempdir().unwrap();
    let (a_buffer, b_buffer) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let mut active = start_pair_node(
        central,
        a_port,
        pair_node("a", Role::Active, a_pair, b_pair, a_buffer.clone()),
    )
    .await;
    let standby_config = || pair_node("b", Role::Standby, b_pair, a_pair, b_buffer.clone());
    let mut standby = start_pair_node(central, b_port, standby_config()).await;

    let high = [
        active.send_keyed("high", "tank4.level.high").await,
        active.send_keyed("still high", "tank4.level.high").await,
    ];
    let pump = active.send_keyed("pump stopped", "pump7.running").await;
    standby
        .wait_for("the rows to be copied", |s| s.depth == 3)
        .await;
    assert!(marked_ids(&b_buffer).is_empty());
    assert_eq!(active.clear("tank4.level.high").await.unwrap(), 2);
    let expected: std::collections::BTreeSet<String> = high.iter().cloned().collect();
    eventually("the standby to copy the marks", || {
        marked_ids(&b_buffer) == expected
    })
    .await;
    // The clear's list goes with its marks or before them.
    assert_eq!(pending_clears(&b_buffer), pending_clears(&a_buffer));
    assert_eq!(
        pending_clear_keys(&b_buffer),
        vec!["tank4.level.high".to_owned()]
    );
    let err = standby.clear("tank4.level.high").await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("standby"), "{err:?}");
    assert_eq!(pending_clears(&b_buffer), pending_clears(&a_buffer));

    // Marked while the standby is away: a resume copies the marks it missed.
    standby.shut_down().await;
    let b_port = Reserved::again(b_pair);
    assert_eq!(active.clear("pump7.running").await.unwrap(), 1);
    let mut standby = start_pair_node(central, b_port, standby_config()).await;
    let mut expected = expected;
    expected.insert(pump);
    eventually("the resumed standby to copy the marks", || {
        marked_ids(&b_buffer) == expected
    })
    .await;
    assert_eq!(marked_ids(&a_buffer), expected);
    assert_eq!(buffered_ids(&b_buffer), buffered_ids(&a_buffer));
    assert_eq!(pending_clears(&b_buffer), pending_clears(&a_buffer));
    assert_eq!(pending_clear_keys(&b_buffer).len(), 2);
    assert_eq!(standby.stats().await.depth, 3);
    standby.shut_down().await;
    active.shut_down().await;
}

/// A row already on the stream, unmarked, when the clear is committed is marked here but
/// reaches central as it was sent: central is asked to clear the key only after that row's ack
/// (the watermark), so the clear finds it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_in_flight_at_the_clear_is_acked_before_central_is_asked_to_clear() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let central_addr = listener.local_addr().unwrap();
    let central = FakeCentral::default();
    central.acks_held.send_replace(true);
    let central_stop = CancellationToken::new();
    start_central(central.clone(), listener, central_stop.clone()).await;
    let mut site = start_site(central_addr).await;

    let id = site.send_keyed("high", "tank4.level.high").await;
    central
        .wait_for("the submit", |c| c.submitted_at(&id).is_some())
        .await;
    assert_eq!(site.clear("tank4.level.high").await.unwrap(), 1);
    assert_eq!(
        site.status(&id).await.unwrap().status(),
        NotificationStatus::Cleared
    );
    central.acks_held.send_replace(false);
    central
        .wait_for("the clear", |c| c.cleared_at("tank4.level.high").is_some())
        .await;
    assert!(
        central.acked_at(&id).unwrap() < central.cleared_at("tank4.level.high").unwrap(),
        "{:?}",
        central.received()
    );
    assert_eq!(
        central.stored.lock().unwrap()[&id].cleared_at_site,
        None,
        "sent before the clear"
    );
    site.shut_down().await;
    central_stop.cancel();
}

impl Site {
    /// Promotes this node (a standby) through its API, as an operator would.
    async fn promote(&mut self) {
        let view = self
            .client
            .promote(v1::PromoteRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(view.role(), v1::NodeRole::Active);
    }
}

impl FakeCentral {
    /// How many clears of `key` central applied.
    fn clears_of(&self, key: &str) -> usize {
        self.received()
            .iter()
            .filter(|r| matches!(r, Received::Clear { key: seen, .. } if seen == key))
            .count()
    }

    /// Central applied the clear of `key` after it received every one of `before` (marked
    /// cleared or not, as `marked` says) and before any of `after`.
    fn assert_cleared_between(&self, key: &str, before: &[(&String, bool)], after: &[&String]) {
        let clear = self.cleared_at(key).expect("central applied the clear");
        let stored = self.stored.lock().unwrap().clone();
        for (id, marked) in before {
            let at = self.submitted_at(id).expect("submitted");
            assert!(at < clear, "{id} before the clear: {:?}", self.received());
            assert_eq!(stored[*id].cleared_at_site.is_some(), *marked, "{id}");
        }
        for id in after {
            let at = self.submitted_at(id).expect("submitted");
            assert!(at > clear, "{id} after the clear: {:?}", self.received());
            assert_eq!(stored[*id].cleared_at_site, None, "{id} is not cleared");
        }
    }
}

/// A clear on the active while central is unreachable: the standby holds the same pending clear
/// (key, watermark, time) beside the same rows. The active is stopped for good and the standby
/// promoted: once central is back, the new active forwards the rows buffered before the clear
/// (the marked one as cleared), then asks central to clear the key, once, and only then
/// forwards the row of the key sent after the clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_sends_the_clear_the_active_left_pending() {
    use crate::domain::Role;
    let central_port = Reserved::new();
    let central_addr = central_port.addr;
    let (a_port, b_port) = (Reserved::new(), Reserved::new());
    let (a_pair, b_pair) = (a_port.addr, b_port.addr);
    let dir = tempfile::tempdir().unwrap();
    let (a_buffer, b_buffer) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let mut active = start_pair_node(
        central_addr,
        a_port,
        pair_node("a", Role::Active, a_pair, b_pair, a_buffer.clone()),
    )
    .await;
    let mut standby = start_pair_node(
        central_addr,
        b_port,
        pair_node("b", Role::Standby, b_pair, a_pair, b_buffer.clone()),
    )
    .await;
    let key = "tank4.level.high";
    let high = active.send_keyed("high", key).await;
    let plain = active.send("plain").await;
    assert_eq!(active.clear(key).await.unwrap(), 1);
    let again = active.send_keyed("high again", key).await;
    standby
        .wait_for("the rows to be copied", |s| s.depth == 3)
        .await;
    eventually("the standby to hold the pending clear", || {
        pending_clear_keys(&b_buffer) == [key]
    })
    .await;
    let on_the_active = pending_clears(&a_buffer);
    assert_eq!(pending_clears(&b_buffer), on_the_active);

    active.shut_down().await;
    standby.promote().await;
    let listener = central_port.listen();
    let central = FakeCentral::default();
    let central_stop = CancellationToken::new();
    start_central(central.clone(), listener, central_stop.clone()).await;
    standby
        .wait_for("the new active to drain", |s| {
            s.depth == 0 && pending_clear_keys(&b_buffer).is_empty()
        })
        .await;
    central.assert_cleared_between(key, &[(&high, true), (&plain, false)], &[&again]);
    assert_eq!(central.clears_of(key), 1);
    assert!(pending_clears(&b_buffer).is_empty());
    standby.shut_down().await;
    central_stop.cancel();
}

/// A clear central applied leaves the standby too: the active's list replaces the standby's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_central_applied_leaves_the_standby() {
    use crate::domain::Role;
    let central_port = Reserved::new();
    let central_addr = central_port.addr;
    let (a_port, b_port) = (Reserved::new(), Reserved::new());
    let (a_pair, b_pair) = (a_port.addr, b_port.addr);
    let dir = tempfile::tempdir().unwrap();
    let (a_buffer, b_buffer) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let mut active = start_pair_node(
        central_addr,
        a_port,
        pair_node("a", Role::Active, a_pair, b_pair, a_buffer.clone()),
    )
    .await;
    let mut standby = start_pair_node(
        central_addr,
        b_port,
        pair_node("b", Role::Standby, b_pair, a_pair, b_buffer.clone()),
    )
    .await;
    active.send_keyed("high", "tank4.level.high").await;
    active.clear("tank4.level.high").await.unwrap();
    active.clear("pump7.running").await.unwrap();
    eventually("the standby to hold both pending clears", || {
        pending_clear_keys(&b_buffer).len() == 2
    })
    .await;
    assert_eq!(pending_clears(&b_buffer), pending_clears(&a_buffer));

    let listener = central_port.listen();
    let central = FakeCentral::default();
    let central_stop = CancellationToken::new();
    start_central(central.clone(), listener, central_stop.clone()).await;
    active
        .wait_for("the active to finish", |s| {
            s.depth == 0 && pending_clear_keys(&a_buffer).is_empty()
        })
        .await;
    standby
        .wait_for("the standby to follow", |s| {
            s.depth == 0 && pending_clear_keys(&b_buffer).is_empty()
        })
        .await;
    assert!(pending_clears(&b_buffer).is_empty());
    assert_eq!(central.clears_of("tank4.level.high"), 1);
    assert_eq!(central.clears_of("pump7.running"), 1);
    standby.shut_down().await;
    active.shut_down().await;
    central_stop.cancel();
}

/// A clear the standby never saw is handed over. The active clears a key while its standby is
/// away and central unreachable, then stops; the standby is promoted and takes a Send of the
/// key. The old active comes back, steps down and hands its rows and its pending clear over:
/// the new active asks central to clear the key at once, before the rows of the key sent after
/// the clear, on either node (the row the clear marked arrives cleared whenever it goes). The
/// old active, now its standby, ends with the new active's pending clears, then none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_carries_the_pending_clear() {
    use crate::domain::Role;
    let central_port = Reserved::new();
    let central_addr = central_port.addr;
    let (a_port, b_port) = (Reserved::new(), Reserved::new());
    let (a_pair, b_pair) = (a_port.addr, b_port.addr);
    let dir = tempfile::tempdir().unwrap();
    let (a_buffer, b_buffer) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let a_config = || pair_node("a", Role::Active, a_pair, b_pair, a_buffer.clone());
    let b_config = || pair_node("b", Role::Standby, b_pair, a_pair, b_buffer.clone());
    let mut a = start_pair_node(central_addr, a_port, a_config()).await;
    let mut b = start_pair_node(central_addr, b_port, b_config()).await;
    b.wait_for("b to follow a", |s| s.active_node == "a").await;
    b.shut_down().await;
    let b_port = Reserved::again(b_pair);

    let key = "tank4.level.high";
    let high = a.send_keyed("high", key).await;
    assert_eq!(a.clear(key).await.unwrap(), 1);
    let again_on_a = a.send_keyed("high again", key).await;
    a.shut_down().await;
    let a_port = Reserved::again(a_pair);
    let on_a = pending_clears(&a_buffer);
    assert_eq!(pending_clear_keys(&a_buffer), [key]);
    assert!(pending_clear_keys(&b_buffer).is_empty());

    let mut b = start_pair_node(central_addr, b_port, b_config()).await;
    b.promote().await;
    let again_on_b = b.send_keyed("high on b", key).await;
    let a = start_pair_node(central_addr, a_port, a_config()).await;
    b.wait_for("a's rows and clear to be handed over", |s| {
        s.depth == 3 && pending_clear_keys(&b_buffer).len() == 1
    })
    .await;
    let handed = pending_clears(&b_buffer);
    assert_eq!(
        handed,
        vec![(key.to_owned(), 0, on_a[0].2)],
        "due at once on the new active, as cleared on the old one"
    );
    let mut a = a;
    a.wait_for("a to follow b", |s| s.active_node == "b" && s.depth == 3)
        .await;
    eventually("a to hold b's pending clears", || {
        pending_clears(&a_buffer) == handed
    })
    .await;

    let listener = central_port.listen();
    let central = FakeCentral::default();
    let central_stop = CancellationToken::new();
    start_central(central.clone(), listener, central_stop.clone()).await;
    b.wait_for("b to drain", |s| {
        s.depth == 0 && pending_clear_keys(&b_buffer).is_empty()
    })
    .await;
    // The row the clear marked arrives cleared, before or after the clear alike.
    central.assert_cleared_between(key, &[], &[&again_on_a, &again_on_b]);
    assert!(
        central.stored.lock().unwrap()[&high]
            .cleared_at_site
            .is_some()
    );
    assert_eq!(central.clears_of(key), 1);
    a.wait_for("a to follow", |s| {
        s.depth == 0 && pending_clear_keys(&a_buffer).is_empty()
    })
    .await;
    a.shut_down().await;
    b.shut_down().await;
    central_stop.cancel();
}

/// A buffer at `max_buffer_bytes` refuses Sends with RESOURCE_EXHAUSTED naming the setting and
/// its limit, and says so everywhere an operator or a load balancer looks (health of
/// SiteNotify, GetBufferStats, /metrics) without calling central unreachable for it; once
/// central is back and has drained the buffer, Sends are taken again with nothing done by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_buffer_refuses_sends_and_says_so_until_central_drains_it() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    const LIMIT: u64 = 1 << 20;
    let central = Reserved::new();
    let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_addr = metrics.local_addr().unwrap();
    let listeners = crate::Listeners {
        pair: None,
        metrics: Some(metrics),
    };
    let mut site = start_node(central.addr, listeners, |config| {
        config.metrics_listen = Some(metrics_addr);
        config.max_buffer_bytes = Some(LIMIT);
    })
    .await;
    let large = |i: usize| SendRequest {
        body: "x".repeat(16 * 1024),
        ..send_request(&format!("fill {i}"))
    };

    let mut accepted = Vec::new();
    let refusal = loop {
        match site.client.send(large(accepted.len())).await {
            Ok(response) => accepted.push(response.into_inner().notification_id),
            Err(status) => break status,
        }
        assert!(accepted.len() < 1000, "a 1 MiB buffer never refused");
    };
    assert_eq!(refusal.code(), Code::ResourceExhausted, "{refusal:?}");
    assert!(
        refusal
            .message()
            .contains("max_buffer_bytes: the buffer would hold"),
        "{refusal:?}"
    );
    assert!(
        refusal.message().contains("the limit is 1048576"),
        "{refusal:?}"
    );
    assert!(!accepted.is_empty());

    // Small Sends may still fit for a while; fill until a page does not, so the buffer as a
    // whole refuses.
    loop {
        match site.client.send(send_request("small")).await {
            Ok(response) => accepted.push(response.into_inner().notification_id),
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                break;
            }
        }
    }
    let stats = site
        .wait_for("the refusal in the stats", |s| s.sends_refused)
        .await;
    assert!(
        stats.sends_refused_reason.starts_with("max_buffer_bytes: "),
        "{stats:?}"
    );
    assert!(!stats.central_reachable, "central is away, not the disk");
    assert_eq!(
        stats.depth,
        accepted.len() as u64,
        "nothing refused was stored"
    );
    // Each Send is checked against an estimate of its size: the file may pass the limit by
    // the estimate's error (a few pages), never by more.
    assert!(
        stats.buffer_bytes > LIMIT / 2 && stats.buffer_bytes < LIMIT + LIMIT / 16,
        "{stats:?}"
    );

    let channel = Channel::from_shared(format!("http://{}", site.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let mut health_of = async |service: &str| {
        health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while health_of("outbox.v1.SiteNotify").await != ServingStatus::NotServing {
        assert!(
            tokio::time::Instant::now() < deadline,
            "SiteNotify still SERVING"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        health_of("").await,
        ServingStatus::Serving,
        "the process serves; only Sends are refused"
    );
    let text = scrape(metrics_addr).await;
    assert_eq!(
        metrics_endpoint::sample(&text, "outbox_site_sends_refused"),
        Some(1.0)
    );
    assert_eq!(
        metrics_endpoint::sample(&text, "outbox_site_central_reachable"),
        Some(0.0)
    );

    // Central comes back: everything is forwarded and deleted, and Sends work again by
    // themselves.
    let fake = FakeCentral::default();
    let central_stop = CancellationToken::new();
    start_central(fake.clone(), central.listen(), central_stop.clone()).await;
    let stats = site
        .wait_for("the buffer drained and taking Sends", |s| {
            s.depth == 0 && !s.sends_refused
        })
        .await;
    assert!(stats.sends_refused_reason.is_empty(), "{stats:?}");
    let stored = fake.stored.lock().unwrap().len();
    assert_eq!(stored, accepted.len());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while health_of("outbox.v1.SiteNotify").await != ServingStatus::Serving {
        assert!(
            tokio::time::Instant::now() < deadline,
            "SiteNotify still NOT_SERVING"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    site.client.send(large(0)).await.unwrap();
    let text = scrape(metrics_addr).await;
    assert_eq!(
        metrics_endpoint::sample(&text, "outbox_site_sends_refused"),
        Some(0.0)
    );
    assert!(
        metrics_endpoint::sample(&text, "outbox_site_buffer_bytes").is_some_and(|b| b > 0.0),
        "{text}"
    );
    site.shut_down().await;
    central_stop.cancel();
}

/// The node reports its health to central every `health_report_interval`, whether the stream is
/// busy or not: its buffer depth (here rows central holds unacked), oldest buffered age, name,
/// role and version; once central acks, the empty buffer and when it last forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_reports_its_health_to_central_every_interval() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let central_addr = listener.local_addr().unwrap();
    let central = FakeCentral::default();
    central.acks_held.send_replace(true);
    let central_stop = CancellationToken::new();
    start_central(central.clone(), listener, central_stop.clone()).await;
    let mut site = start_site_with(central_addr, |config| {
        config.health_report_interval = Duration::from_millis(50);
    })
    .await;

    central
        .wait_for("a first report, at start", |c| c.latest_report().is_some())
        .await;
    for subject in ["one", "two", "three"] {
        site.send(subject).await;
    }
    central
        .wait_for("a report of the three unacked rows", |c| {
            c.latest_report().is_some_and(|r| r.buffer_depth == 3)
        })
        .await;
    let busy = central.latest_report().unwrap();
    assert_eq!(busy.site_id, "site-a");
    assert_eq!(
        busy.node_name, "site-a",
        "a single node is named by its site"
    );
    assert_eq!(busy.role(), v1::NodeRole::Active);
    assert_eq!(busy.version, crate::health_report::VERSION);
    assert!(busy.oldest_buffered_age_seconds >= 0.0);
    assert_eq!(busy.last_forward_at, None, "nothing acked yet");
    assert_eq!((busy.standby_lag_rows, busy.rejected), (0, 0));

    central.acks_held.send_replace(false);
    central
        .wait_for("a report of the drained buffer", |c| {
            c.latest_report()
                .is_some_and(|r| r.buffer_depth == 0 && r.last_forward_at.is_some())
        })
        .await;
    let idle = central.latest_report().unwrap();
    assert_eq!(idle.oldest_buffered_age_seconds, 0.0);
    assert!(idle.central_reachable);
    // Idle, it goes on reporting.
    let reports = central.health_reports.lock().unwrap().len();
    central
        .wait_for("more reports while idle", |c| {
            c.health_reports.lock().unwrap().len() >= reports + 3
        })
        .await;
    site.shut_down().await;
    central_stop.cancel();
}
