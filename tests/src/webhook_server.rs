//! A real HTTP server that stands in for a webhook endpoint (a Teams/Slack
//! incoming webhook, a customer's receiver): it records every POST it receives and
//! answers from a script, so tests can check what the outbox sent and drive its
//! retry paths (5xx, 429 with Retry-After, a reply slower than the client's
//! timeout).
//!
//! Invariants:
//! - Every POST is recorded (with the reply chosen for it) *before* that reply is
//!   delayed or sent, so a request whose client gave up waiting is still visible.
//! - Scripted replies ([`WebhookServer::set_responses`]) are consumed one per
//!   request in arrival order; when they run out the default reply (200 unless
//!   changed) applies again.
//! - A HEAD (the outbox's probe of a failing endpoint) is answered with the
//!   default reply's status, at once and without a body: an endpoint that is down
//!   is down for a probe too. It consumes no scripted reply and is not recorded
//!   among the POSTs, only counted ([`WebhookServer::head_count`]).
//! - Nothing a client sends can panic the server: axum answers malformed requests
//!   itself, bodies are capped by axum's default limit (2 MB), and a configured
//!   reply that HTTP cannot carry (a status outside 100..=999, a Retry-After with
//!   control characters) is sent as 500 / without the header instead.
//! - [`WebhookServer::stop`] (or dropping the last handle) closes the listener and
//!   ends every delayed or held reply at once, so the server never outlives its
//!   test.
//!
//! [`verify_signature`] checks an `X-Outbox-Signature: t=<unix seconds>,v1=<hex>`
//! header (HMAC-SHA256 of `<t>.<id>.<raw body>` with the list secret, the id
//! being the `Idempotency-Key`) independently of the sender's code, the way the
//! docs/delivery.md tells receivers to: constant-time compare, and refuse a time more than
//! [`SIGNATURE_TOLERANCE`] away. [`ReplayGuard`] adds the last step, acting on
//! each id once.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The header the outbox signs webhook bodies in.
pub const SIGNATURE_HEADER: &str = "x-outbox-signature";
/// The header carrying the NotificationId, so a receiver can drop duplicates.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";
/// How far a signature's time may be from the receiver's clock, either way, as
/// the recipe in docs/delivery.md says: long enough for clock skew and a slow network,
/// short enough that a captured request is soon useless.
pub const SIGNATURE_TOLERANCE: Duration = Duration::from_secs(5 * 60);
/// A delay long enough to outlast any client timeout in the tests; see [`Reply::hang`].
const HANG: Duration = Duration::from_secs(3600);
/// How long [`BackgroundHttp::stop`] waits for in-flight responses to finish
/// before abandoning the server task. Handlers end at once on shutdown, so this
/// is only reached by a client that stalls mid-request.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// How the server answers one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    /// Sent as the `Retry-After` header (seconds or an HTTP date) when set.
    pub retry_after: Option<String>,
    /// Waited before answering; a stop ends the wait early (answered 503).
    pub delay: Option<Duration>,
}

impl Reply {
    /// 200, at once.
    pub fn ok() -> Self {
        Self::status(200)
    }

    /// This status, at once.
    pub fn status(status: u16) -> Self {
        Reply {
            status,
            retry_after: None,
            delay: None,
        }
    }

    /// A 200 that comes only after an hour: longer than any client timeout, so
    /// the client sees a timeout. The wait ends when the server stops.
    pub fn hang() -> Self {
        Self::ok().with_delay(HANG)
    }

    pub fn with_retry_after(mut self, retry_after: impl Into<String>) -> Self {
        self.retry_after = Some(retry_after.into());
        self
    }

    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }
}

/// One POST the server received.
#[derive(Clone, Debug)]
pub struct ReceivedRequest {
    /// The path, without the query.
    pub path: String,
    pub query: Option<String>,
    /// Header names in lower case; repeated headers joined with ", " (RFC 9110
    /// §5.3); values that are not UTF-8 have U+FFFD in place of bad bytes.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
    pub received_at: Instant,
    /// The status the server chose for this request (sent unless the server
    /// stopped during a delay, or the client gave up first).
    pub answered: u16,
}

impl ReceivedRequest {
    /// The header called `name`, any case.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// The body as text (bad UTF-8 replaced with U+FFFD).
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON, if it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }

    pub fn idempotency_key(&self) -> Option<&str> {
        self.header(IDEMPOTENCY_HEADER)
    }

    /// Whether the request carries an `X-Outbox-Signature` that matches its
    /// body and `Idempotency-Key` under `secret`, dated within
    /// [`SIGNATURE_TOLERANCE`] of now.
    pub fn signature_valid(&self, secret: &[u8]) -> bool {
        self.verify_signature(secret, unix_now()).is_ok()
    }

    /// [`verify_signature`] on this request's headers and body, at `now` (Unix
    /// seconds).
    pub fn verify_signature(&self, secret: &[u8], now: i64) -> Result<i64, SignatureRejection> {
        let header = self
            .header(SIGNATURE_HEADER)
            .ok_or(SignatureRejection::Malformed)?;
        let id = self
            .idempotency_key()
            .ok_or(SignatureRejection::Malformed)?;
        verify_signature(secret, id, &self.body, header, now)
    }
}

/// Handle to a running webhook receiver. Clones share the same server; it stops
/// when the last clone is dropped.
#[derive(Clone)]
pub struct WebhookServer {
    shared: Arc<Shared>,
    http: Arc<BackgroundHttp>,
    addr: SocketAddr,
}

struct Shared {
    requests: Mutex<Vec<ReceivedRequest>>,
    /// Number of recorded requests; waiters watch it instead of polling.
    received: watch::Sender<usize>,
    script: Mutex<Script>,
    /// While true every reply waits until it turns false (or the server stops).
    paused: watch::Sender<bool>,
    /// Requests waiting right now on a pause; a watch so tests can wait for it.
    held: watch::Sender<usize>,
    /// Requests being answered right now, and the most seen at once.
    active: watch::Sender<usize>,
    max_active: Mutex<usize>,
    /// HEAD requests answered (probes).
    heads: Mutex<usize>,
    /// Turns true on stop; handlers that wait select on it.
    shutdown: watch::Receiver<bool>,
}

struct Script {
    queued: VecDeque<Reply>,
    default: Reply,
}

impl WebhookServer {
    /// Binds 127.0.0.1:0 and serves in a background tokio task until stopped or
    /// dropped.
    pub async fn start() -> io::Result<WebhookServer> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            requests: Mutex::new(Vec::new()),
            received: watch::Sender::new(0),
            script: Mutex::new(Script {
                queued: VecDeque::new(),
                default: Reply::ok(),
            }),
            paused: watch::Sender::new(false),
            held: watch::Sender::new(0),
            active: watch::Sender::new(0),
            max_active: Mutex::new(0),
            heads: Mutex::new(0),
            shutdown: shutdown_rx,
        });
        let app = Router::new()
            .fallback(receive)
            .with_state(Arc::clone(&shared));
        let http = BackgroundHttp::spawn(listener, app, shutdown, "webhook server");
        Ok(WebhookServer {
            shared,
            http: Arc::new(http),
            addr,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/<path>` (a leading "/" on `path` is optional).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{}", self.addr, path.trim_start_matches('/'))
    }

    /// Every POST received so far, in arrival order.
    pub fn requests(&self) -> Vec<ReceivedRequest> {
        lock(&self.shared.requests).clone()
    }

    /// Waits until at least `n` POSTs were received, or `timeout` passes;
    /// returns all received so far either way.
    pub async fn wait_for_requests(&self, n: usize, timeout: Duration) -> Vec<ReceivedRequest> {
        let mut count = self.shared.received.subscribe();
        // The sender lives in `self.shared`; only the timeout can end this early.
        let _ = tokio::time::timeout(timeout, count.wait_for(|received| *received >= n)).await;
        self.requests()
    }

    /// Answers the next requests with `replies`, one each in order, then goes
    /// back to the default reply. Replaces any replies still queued.
    pub fn set_responses(&self, replies: Vec<Reply>) {
        lock(&self.shared.script).queued = replies.into();
    }

    /// The reply used when no scripted one is queued (200 at first), e.g. a
    /// permanent 500 for "the endpoint is broken for good".
    pub fn set_default_reply(&self, reply: Reply) {
        lock(&self.shared.script).default = reply;
    }

    /// Holds every reply until [`Self::resume_replies`] (requests are still
    /// recorded at once). With [`Self::wait_for_held_replies`] a test can wait
    /// until N deliveries are in flight, assert, then release them.
    pub fn pause_replies(&self) {
        self.shared.paused.send_replace(true);
    }

    pub fn resume_replies(&self) {
        self.shared.paused.send_replace(false);
    }

    /// Requests waiting right now on a paused reply.
    pub fn held_replies(&self) -> usize {
        *self.shared.held.borrow()
    }

    /// Waits until at least `n` requests are held by [`Self::pause_replies`], or
    /// `timeout` passes; returns whether they were.
    pub async fn wait_for_held_replies(&self, n: usize, timeout: Duration) -> bool {
        let mut held = self.shared.held.subscribe();
        matches!(
            tokio::time::timeout(timeout, held.wait_for(|held| *held >= n)).await,
            Ok(Ok(_))
        )
    }

    /// Requests being answered right now (received, reply not yet sent).
    pub fn active_requests(&self) -> usize {
        *self.shared.active.borrow()
    }

    /// HEAD requests (the outbox's probes) answered so far.
    pub fn head_count(&self) -> usize {
        *lock(&self.shared.heads)
    }

    /// The most requests that were being answered at the same time.
    pub fn max_concurrent_requests(&self) -> usize {
        *lock(&self.shared.max_active)
    }

    /// Stops accepting connections, ends every delayed or held reply, and waits
    /// (briefly) until the server task is gone, so the port refuses connections
    /// once this returns.
    pub async fn stop(&self) {
        self.http.stop().await;
    }
}

/// Locks a mutex, ignoring poisoning: nothing here leaves the data behind these
/// locks half-updated.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Keeps a watch counter raised for as long as it lives, also when the handler
/// is cancelled (the client hung up).
struct Raised<'a>(&'a watch::Sender<usize>);

impl<'a> Raised<'a> {
    fn new(counter: &'a watch::Sender<usize>) -> Self {
        counter.send_modify(|n| *n += 1);
        Raised(counter)
    }
}

impl Drop for Raised<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

async fn receive(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if method == Method::HEAD {
        *lock(&shared.heads) += 1;
        let status = lock(&shared.script).default.status;
        return StatusCode::from_u16(status)
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            .into_response();
    }
    if method != Method::POST {
        return (StatusCode::METHOD_NOT_ALLOWED, [(header::ALLOW, "POST")]).into_response();
    }
    let _active = Raised::new(&shared.active);
    {
        let mut max = lock(&shared.max_active);
        *max = (*max).max(*shared.active.borrow());
    }
    let reply = {
        let mut script = lock(&shared.script);
        script
            .queued
            .pop_front()
            .unwrap_or_else(|| script.default.clone())
    };
    shared.record(ReceivedRequest {
        path: uri.path().to_string(),
        query: uri.query().map(str::to_string),
        headers: header_map(&headers),
        body: body.to_vec(),
        received_at: Instant::now(),
        answered: reply.status,
    });

    let mut shutdown = shared.shutdown.clone();
    let stopped = async move {
        // Err means the server handle is gone: a shutdown as well.
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stopped);
    if let Some(delay) = reply.delay {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = &mut stopped => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
        }
    }
    let mut paused = shared.paused.subscribe();
    if *paused.borrow_and_update() {
        let _held = Raised::new(&shared.held);
        tokio::select! {
            _ = paused.wait_for(|paused| !*paused) => {}
            () = &mut stopped => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
        }
    }
    reply_response(&reply)
}

impl Shared {
    fn record(&self, request: ReceivedRequest) {
        let mut requests = lock(&self.requests);
        requests.push(request);
        // Published under the lock so the count never goes backwards for a waiter.
        self.received.send_replace(requests.len());
    }
}

fn header_map(headers: &HeaderMap) -> BTreeMap<String, String> {
    let mut map: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        map.entry(name.as_str().to_string())
            .and_modify(|joined| {
                joined.push_str(", ");
                joined.push_str(&value);
            })
            .or_insert_with(|| value.into_owned());
    }
    map
}

fn reply_response(reply: &Reply) -> Response {
    let status = StatusCode::from_u16(reply.status).unwrap_or_else(|_| {
        tracing::warn!(
            status = reply.status,
            "webhook server: scripted status is not valid HTTP; sending 500"
        );
        StatusCode::INTERNAL_SERVER_ERROR
    });
    let mut response = (status, format!("scripted {}\n", status.as_u16())).into_response();
    if let Some(retry_after) = &reply.retry_after {
        match HeaderValue::from_str(retry_after) {
            Ok(value) => {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            Err(_) => tracing::warn!(
                retry_after,
                "webhook server: Retry-After is not a valid header value; left out"
            ),
        }
    }
    response
}

// ---- Signatures ---------------------------------------------------------------------

/// The receiver's clock as Unix seconds (0 if it is before 1970).
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Why [`verify_signature`] refused a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignatureRejection {
    /// No header, no id, or not `t=<digits>,v1=<64 hex digits>`.
    Malformed,
    /// The HMAC does not match: another secret, or the time, id or body changed.
    Mismatch,
    /// Signed correctly, but `age` seconds away from now (negative: in the
    /// future), beyond [`SIGNATURE_TOLERANCE`]: a replay, or a clock far off.
    Stale { age: i64 },
}

/// `t=<timestamp>,v1=<lower-case hex HMAC-SHA256 of "<timestamp>.<id>.<body>">`:
/// the value the outbox is expected to send in `X-Outbox-Signature` for
/// notification `id` at `timestamp` (Unix seconds).
pub fn sign(secret: &[u8], timestamp: i64, id: &str, body: &[u8]) -> String {
    let Some(mut mac) = hmac_sha256(secret) else {
        return String::new();
    };
    mac.update(format!("{timestamp}.{id}.").as_bytes());
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    let hex: String = tag.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("t={timestamp},v1={hex}")
}

/// The recipe in docs/delivery.md: split `header_value` into `t` and `v1` (surrounding
/// whitespace ignored, hex in either case), recompute the HMAC-SHA256 of
/// `"<t>.<id>.<body>"` under `secret`, compare in constant time, then refuse a
/// `t` more than [`SIGNATURE_TOLERANCE`] from `now` (Unix seconds). Returns `t`.
/// Dropping a repeat of an accepted id is the caller's last step ([`ReplayGuard`]).
pub fn verify_signature(
    secret: &[u8],
    id: &str,
    body: &[u8],
    header_value: &str,
    now: i64,
) -> Result<i64, SignatureRejection> {
    let (t, hex) = header_value
        .trim()
        .strip_prefix("t=")
        .and_then(|rest| rest.split_once(",v1="))
        .ok_or(SignatureRejection::Malformed)?;
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SignatureRejection::Malformed);
    }
    let timestamp: i64 = t.parse().map_err(|_| SignatureRejection::Malformed)?;
    // HMAC-SHA256 tags are 32 bytes: 64 hex digits, no more, no fewer.
    if hex.len() != 64 {
        return Err(SignatureRejection::Malformed);
    }
    let tag = decode_hex(hex).ok_or(SignatureRejection::Malformed)?;
    let mut mac = hmac_sha256(secret).ok_or(SignatureRejection::Malformed)?;
    mac.update(format!("{t}.{id}.").as_bytes());
    mac.update(body);
    // `verify_slice` compares in constant time (and checks the length).
    mac.verify_slice(&tag)
        .map_err(|_| SignatureRejection::Mismatch)?;
    let age = now.saturating_sub(timestamp);
    let tolerance = i64::try_from(SIGNATURE_TOLERANCE.as_secs()).unwrap_or(i64::MAX);
    if age.unsigned_abs() > tolerance.unsigned_abs() {
        return Err(SignatureRejection::Stale { age });
    }
    Ok(timestamp)
}

/// Whether a verified request is the first with its id, or a repeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Act on it.
    New,
    /// Answer 2xx and do nothing: the outbox retries, and a replay within the
    /// tolerance, both repeat an id.
    Repeat,
}

/// The whole receiver recipe for one secret: [`verify_signature`], then each
/// id acted on once. Remembering ids for the tolerance window is enough, since
/// an older signature is refused anyway; this test helper keeps them all.
pub struct ReplayGuard {
    secret: Vec<u8>,
    seen: HashSet<String>,
}

impl ReplayGuard {
    pub fn new(secret: &[u8]) -> Self {
        ReplayGuard {
            secret: secret.to_vec(),
            seen: HashSet::new(),
        }
    }

    /// Verifies one request at `now` (Unix seconds) and says whether its id is new.
    pub fn admit(
        &mut self,
        id: &str,
        body: &[u8],
        header_value: &str,
        now: i64,
    ) -> Result<Arrival, SignatureRejection> {
        verify_signature(&self.secret, id, body, header_value, now)?;
        Ok(if self.seen.insert(id.to_owned()) {
            Arrival::New
        } else {
            Arrival::Repeat
        })
    }
}

/// HMAC accepts keys of any length, so this is always Some; the Option only
/// avoids an unwrap on the library's fallible signature.
fn hmac_sha256(secret: &[u8]) -> Option<Hmac<Sha256>> {
    <Hmac<Sha256> as Mac>::new_from_slice(secret).ok()
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    hex.as_bytes()
        .chunks(2)
        .map(|pair| {
            let text = std::str::from_utf8(pair).ok()?;
            u8::from_str_radix(text, 16).ok()
        })
        .collect()
}

// ---- Running an axum app in the background --------------------------------------------

/// An axum app served on its own task until [`Self::stop`] or drop; shared by
/// the test HTTP servers.
pub(crate) struct BackgroundHttp {
    shutdown: watch::Sender<bool>,
    /// Turns true when the serve task has finished (listener closed).
    finished: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl BackgroundHttp {
    /// Serves `app` on `listener` until `shutdown` turns true (or is dropped with
    /// this value). Handlers that may wait should watch a receiver of the same
    /// channel. Must be called inside a tokio runtime.
    pub(crate) fn spawn(
        listener: TcpListener,
        app: Router,
        shutdown: watch::Sender<bool>,
        name: &'static str,
    ) -> Self {
        let mut signal = shutdown.subscribe();
        let (finished_tx, finished) = watch::channel(false);
        let task = tokio::spawn(async move {
            let stop = async move {
                let _ = signal.wait_for(|stop| *stop).await;
            };
            if let Err(err) = axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
            {
                tracing::warn!(%err, "{name}: server ended with an error");
            }
            finished_tx.send_replace(true);
        });
        BackgroundHttp {
            shutdown,
            finished,
            task,
        }
    }

    pub(crate) async fn stop(&self) {
        self.shutdown.send_replace(true);
        let mut finished = self.finished.clone();
        let done = tokio::time::timeout(STOP_GRACE, finished.wait_for(|done| *done)).await;
        if !matches!(done, Ok(Ok(_))) {
            // A client stalled mid-request; stop waiting for it.
            self.task.abort();
        }
    }
}

impl Drop for BackgroundHttp {
    fn drop(&mut self) {
        // Graceful: the task closes the listener and ends idle connections itself.
        self.shutdown.send_replace(true);
    }
}

#[cfg(test)]
#[allow(
    clippy::expect_used,
    reason = "a failed expectation in a test should stop it with a clear message"
)]
pub(crate) mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// Upper bound for any single network step in these tests; only reached if
    /// something is broken.
    pub(crate) const STEP: Duration = Duration::from_secs(10);

    /// A response as a minimal HTTP/1.1 client saw it.
    #[derive(Debug)]
    pub(crate) struct HttpResponse {
        pub status: u16,
        /// Lower-case names.
        pub headers: BTreeMap<String, String>,
        pub body: String,
    }

    /// Sends one request on a fresh connection (`Connection: close`) and reads
    /// the whole response: enough HTTP to test the servers without a client crate.
    pub(crate) async fn http_request(
        addr: SocketAddr,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<HttpResponse> {
        let mut stream = TcpStream::connect(addr).await?;
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).await?;
        stream.write_all(body).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let bad = || io::Error::new(io::ErrorKind::InvalidData, raw.clone());
        let (head, body) = raw.split_once("\r\n\r\n").ok_or_else(bad)?;
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|line| line.split(' ').nth(1))
            .and_then(|code| code.parse().ok())
            .ok_or_else(bad)?;
        let headers = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
            .collect();
        Ok(HttpResponse {
            status,
            headers,
            body: body.to_string(),
        })
    }

    async fn post(server: &WebhookServer, path: &str, body: &str) -> HttpResponse {
        tokio::time::timeout(
            STEP,
            http_request(
                server.addr(),
                "POST",
                path,
                &[("Content-Type", "application/json")],
                body.as_bytes(),
            ),
        )
        .await
        .expect("request timed out")
        .expect("request")
    }

    #[tokio::test]
    async fn records_posts_with_headers_and_body() {
        let server = WebhookServer::start().await.expect("start");
        assert_eq!(
            server.url("/hooks/teams"),
            format!("http://{}/hooks/teams", server.addr())
        );
        assert_eq!(server.url("x"), format!("http://{}/x", server.addr()));
        let body = r#"{"id":"n-1","subject":"Tank 4"}"#;
        let signature = sign(b"list-secret", unix_now(), "n-1", body.as_bytes());
        let response = tokio::time::timeout(
            STEP,
            http_request(
                server.addr(),
                "POST",
                "/hooks/teams?tenant=a",
                &[
                    ("Content-Type", "application/json"),
                    ("Idempotency-Key", "n-1"),
                    ("X-Outbox-Signature", &signature),
                    ("X-Multi", "a"),
                    ("X-Multi", "b"),
                ],
                body.as_bytes(),
            ),
        )
        .await
        .expect("timed out")
        .expect("request");
        assert_eq!(response.status, 200);

        let requests = server.wait_for_requests(1, STEP).await;
        assert_eq!(requests.len(), 1);
        let request = &requests[0];
        assert_eq!(request.path, "/hooks/teams");
        assert_eq!(request.query.as_deref(), Some("tenant=a"));
        assert_eq!(request.header("content-type"), Some("application/json"));
        assert_eq!(request.header("IDEMPOTENCY-KEY"), Some("n-1"));
        assert_eq!(request.idempotency_key(), Some("n-1"));
        assert_eq!(request.header("x-multi"), Some("a, b"));
        assert_eq!(request.body_text(), body);
        assert_eq!(request.json().expect("json")["subject"], "Tank 4");
        assert!(request.signature_valid(b"list-secret"));
        assert!(!request.signature_valid(b"other-secret"));
        assert_eq!(request.answered, 200);
        assert!(request.received_at <= Instant::now());
    }

    #[tokio::test]
    async fn scripted_replies_are_used_in_order_then_the_default() {
        let server = WebhookServer::start().await.expect("start");
        server.set_responses(vec![
            Reply::status(503),
            Reply::status(429).with_retry_after("7"),
            Reply::status(500).with_retry_after("bad\nvalue"),
            Reply::status(42),
        ]);
        let first = post(&server, "/h", "{}").await;
        assert_eq!(first.status, 503);
        let second = post(&server, "/h", "{}").await;
        assert_eq!(second.status, 429);
        assert_eq!(
            second.headers.get("retry-after").map(String::as_str),
            Some("7")
        );
        let third = post(&server, "/h", "{}").await;
        assert_eq!(third.status, 500);
        assert!(!third.headers.contains_key("retry-after"));
        // Not a valid HTTP status: sent as 500, recorded as scripted.
        assert_eq!(post(&server, "/h", "{}").await.status, 500);
        assert_eq!(post(&server, "/h", "{}").await.status, 200);

        server.set_default_reply(Reply::status(410));
        assert_eq!(post(&server, "/h", "{}").await.status, 410);
        let answered: Vec<u16> = server.requests().iter().map(|r| r.answered).collect();
        assert_eq!(answered, [503, 429, 500, 42, 200, 410]);
    }

    #[tokio::test]
    async fn non_post_requests_are_refused_and_not_recorded() {
        let server = WebhookServer::start().await.expect("start");
        let response =
            tokio::time::timeout(STEP, http_request(server.addr(), "GET", "/h", &[], b""))
                .await
                .expect("timed out")
                .expect("request");
        assert_eq!(response.status, 405);
        assert!(server.requests().is_empty());
        // Garbage instead of HTTP gets an error from hyper, not a panic.
        let mut stream = TcpStream::connect(server.addr()).await.expect("connect");
        stream
            .write_all(b"\x00\x01 not http\r\n\r\n")
            .await
            .expect("write");
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(STEP, stream.read_to_end(&mut rest)).await;
        assert_eq!(post(&server, "/h", "{}").await.status, 200);
    }

    #[tokio::test]
    async fn a_hanging_reply_outlasts_the_client_and_ends_at_stop() {
        let server = WebhookServer::start().await.expect("start");
        server.set_responses(vec![Reply::hang()]);
        let client_timeout = Duration::from_millis(50);
        let result = tokio::time::timeout(
            client_timeout,
            http_request(server.addr(), "POST", "/slow", &[], b"{}"),
        )
        .await;
        assert!(result.is_err(), "the client should have timed out");
        // Recorded although never answered.
        let requests = server.wait_for_requests(1, STEP).await;
        assert_eq!(requests[0].path, "/slow");

        // A second client waits on a hang until the server stops.
        server.set_responses(vec![Reply::hang()]);
        let addr = server.addr();
        let waiting =
            tokio::spawn(async move { http_request(addr, "POST", "/slow", &[], b"{}").await });
        server.wait_for_requests(2, STEP).await;
        tokio::time::timeout(STEP, server.stop())
            .await
            .expect("stop should not wait for the hanging reply");
        let response = tokio::time::timeout(STEP, waiting)
            .await
            .expect("client still waiting")
            .expect("client task");
        if let Ok(response) = response {
            assert_eq!(response.status, 503);
        }
        assert!(TcpStream::connect(addr).await.is_err(), "still listening");
    }

    #[tokio::test]
    async fn paused_replies_hold_requests_until_resumed() {
        let server = WebhookServer::start().await.expect("start");
        server.pause_replies();
        let addr = server.addr();
        let clients: Vec<_> = (0..3)
            .map(|i| {
                tokio::spawn(async move {
                    http_request(addr, "POST", &format!("/h{i}"), &[], b"{}").await
                })
            })
            .collect();
        assert!(server.wait_for_held_replies(3, STEP).await);
        assert_eq!(server.requests().len(), 3);
        assert_eq!(server.active_requests(), 3);
        server.resume_replies();
        for client in clients {
            let response = tokio::time::timeout(STEP, client)
                .await
                .expect("timed out")
                .expect("task")
                .expect("request");
            assert_eq!(response.status, 200);
        }
        assert_eq!(server.max_concurrent_requests(), 3);
        assert_eq!(server.held_replies(), 0);
    }

    #[tokio::test]
    async fn dropping_the_last_handle_stops_the_server() {
        let server = WebhookServer::start().await.expect("start");
        let addr = server.addr();
        let clone = server.clone();
        drop(server);
        assert_eq!(post(&clone, "/h", "{}").await.status, 200);
        drop(clone);
        // The listener closes shortly after the last handle goes.
        let deadline = tokio::time::Instant::now() + STEP;
        while TcpStream::connect(addr).await.is_ok() {
            assert!(tokio::time::Instant::now() < deadline, "still listening");
            tokio::task::yield_now().await;
        }
    }

    const ID: &str = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
    const T: i64 = 1_700_000_000;

    #[test]
    fn signatures_are_checked_strictly() {
        // Computed outside this code: Python's hmac.new(b"Jefe",
        // b"1700000000.<ID>.what do ya want for nothing?", hashlib.sha256).
        let body = b"what do ya want for nothing?";
        let expected = "t=1700000000,\
                        v1=f4e76a59036774e3ae0c95d51b2d1d0775a8e67674567f40ede9dc8178875c26";
        assert_eq!(sign(b"Jefe", T, ID, body), expected);
        let good = sign(b"Jefe", T, ID, body);
        assert_eq!(verify_signature(b"Jefe", ID, body, &good, T), Ok(T));
        assert_eq!(
            verify_signature(
                b"Jefe",
                ID,
                body,
                &good
                    .to_ascii_uppercase()
                    .replace("T=", "t=")
                    .replace("V1=", "v1="),
                T
            ),
            Ok(T)
        );
        assert_eq!(
            verify_signature(b"Jefe", ID, body, &format!(" {good} "), T),
            Ok(T)
        );
        let mismatch = Err(SignatureRejection::Mismatch);
        assert_eq!(
            verify_signature(b"Jefe", ID, b"what do ya want for nothing!", &good, T),
            mismatch
        );
        assert_eq!(verify_signature(b"jefe", ID, body, &good, T), mismatch);
        assert_eq!(
            verify_signature(b"Jefe", "another-id", body, &good, T),
            mismatch
        );
        // A later time pasted onto the old tag: the time is signed too.
        let moved = good.replace("t=1700000000", "t=1700000600");
        assert_eq!(
            verify_signature(b"Jefe", ID, body, &moved, T + 600),
            mismatch
        );
        let malformed = Err(SignatureRejection::Malformed);
        for bad in [
            good.trim_start_matches("t=1700000000,").to_owned(),
            good.replace("v1=", "sha256="),
            good.replace("t=1700000000", "t=-5"),
            good[..good.len() - 2].to_owned(),
            format!("{good}0"),
            "t=1,v1=zz".to_owned(),
            String::new(),
        ] {
            assert_eq!(
                verify_signature(b"Jefe", ID, body, &bad, T),
                malformed,
                "{bad:?}"
            );
        }
    }

    /// A captured request replayed later fails the recipe: its signed time is
    /// too old, and it cannot be re-dated without the secret. Within the window
    /// it is a repeat of an id already acted on.
    #[test]
    fn a_replayed_request_is_refused_or_dropped_as_a_repeat() {
        let secret = b"hook-secret-0123456789";
        let body = br#"{"notification_id":"0190a1b2"}"#;
        let captured = sign(secret, T, ID, body);
        let tolerance = SIGNATURE_TOLERANCE.as_secs() as i64;
        let mut guard = ReplayGuard::new(secret);
        assert_eq!(guard.admit(ID, body, &captured, T + 1), Ok(Arrival::New));
        assert_eq!(guard.admit(ID, body, &captured, T + 2), Ok(Arrival::Repeat));
        assert_eq!(
            verify_signature(secret, ID, body, &captured, T + tolerance),
            Ok(T),
            "the edge of the window is still accepted"
        );
        assert_eq!(
            guard.admit(ID, body, &captured, T + tolerance + 1),
            Err(SignatureRejection::Stale { age: tolerance + 1 })
        );
        assert_eq!(
            verify_signature(secret, ID, body, &captured, T - tolerance - 1),
            Err(SignatureRejection::Stale {
                age: -tolerance - 1
            }),
            "a time far in the future is refused too"
        );
        // The same body under another id (a new delivery forged from an old one).
        assert_eq!(
            guard.admit(
                "0190a1b2-0000-7000-8000-000000000000",
                body,
                &captured,
                T + 1
            ),
            Err(SignatureRejection::Mismatch)
        );
    }
}
