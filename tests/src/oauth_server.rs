//! A real OAuth2 token endpoint for tests: the client-credentials grant of
//! RFC 6749 §4.4 at `POST /token`, enough to drive the outbox's XOAUTH2 SMTP
//! authentication end to end together with the SMTP sink
//! ([`OAuthServer::token_check`] makes the sink accept exactly the tokens this
//! server issued and has not expired or revoked).
//!
//! Protocol implemented:
//! - The body is `application/x-www-form-urlencoded` with
//!   `grant_type=client_credentials` and an optional `scope`; a parameter given
//!   twice, a missing grant type or another content type is `400 invalid_request`,
//!   another grant type `400 unsupported_grant_type` (§5.2).
//! - The client authenticates with HTTP Basic (client id and secret each
//!   form-urlencoded, then base64, §2.3.1) or with `client_id`/`client_secret` in
//!   the body; using both is `400 invalid_request`, neither or wrong ones
//!   `401 invalid_client` with `WWW-Authenticate: Basic`.
//! - Success is `200 {"access_token", "token_type": "Bearer", "expires_in"[, "scope"]}`
//!   with `Cache-Control: no-store` (§5.1); every grant issues a fresh token.
//!
//! Invariants: every POST to `/token` is counted and recorded, granted or not;
//! a token is valid from its issue until `expires_in` seconds later unless
//! revoked; nothing a client sends can panic the server; [`OAuthServer::stop`]
//! (or dropping the last handle) closes the listener.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::smtp_sink::TokenCheck;
use crate::webhook_server::BackgroundHttp;

/// How the client authenticated in a token request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// `Authorization: Basic ...`
    Basic,
    /// `client_id` / `client_secret` form parameters.
    Body,
    /// Neither (or both, which is refused).
    None,
}

/// One request to `/token`, as received and answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRequest {
    pub client_auth: ClientAuth,
    /// The client id presented, if any.
    pub client_id: Option<String>,
    pub grant_type: Option<String>,
    pub scope: Option<String>,
    /// The HTTP status answered.
    pub status: u16,
    /// The token issued, on success.
    pub issued: Option<String>,
}

/// Handle to a running token endpoint. Clones share the same server; it stops
/// when the last clone is dropped.
#[derive(Clone)]
pub struct OAuthServer {
    shared: Arc<Shared>,
    http: Arc<BackgroundHttp>,
    addr: SocketAddr,
}

struct Shared {
    client_id: String,
    client_secret: String,
    /// Seconds; atomic because tests may change it while clients fetch.
    expires_in: AtomicU64,
    /// While set, every request gets `503 temporarily_unavailable`.
    unavailable: AtomicBool,
    request_count: AtomicUsize,
    state: Mutex<TokenState>,
}

#[derive(Default)]
struct TokenState {
    issued: Vec<IssuedToken>,
    requests: Vec<TokenRequest>,
}

struct IssuedToken {
    token: String,
    expires_at: Instant,
    revoked: bool,
}

impl OAuthServer {
    /// Binds 127.0.0.1:0 and serves the token endpoint for one client until
    /// stopped or dropped; tokens say (and are) valid for `expires_in` seconds.
    pub async fn start(
        client_id: impl Into<String>,
        client_secret: impl Into<String>,
        expires_in: u64,
    ) -> io::Result<OAuthServer> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            client_id: client_id.into(),
            client_secret: client_secret.into(),
            expires_in: AtomicU64::new(expires_in),
            unavailable: AtomicBool::new(false),
            request_count: AtomicUsize::new(0),
            state: Mutex::new(TokenState::default()),
        });
        let app = Router::new()
            .route("/token", post(token))
            .with_state(Arc::clone(&shared));
        // No handler here waits, so only the serve loop watches the shutdown.
        let (shutdown, _) = watch::channel(false);
        let http = BackgroundHttp::spawn(listener, app, shutdown, "oauth server");
        Ok(OAuthServer {
            shared,
            http: Arc::new(http),
            addr,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The token endpoint: `http://127.0.0.1:PORT/token`.
    pub fn url(&self) -> String {
        format!("http://{}/token", self.addr)
    }

    /// Every token issued so far, oldest first.
    pub fn tokens_issued(&self) -> Vec<String> {
        lock(&self.shared.state)
            .issued
            .iter()
            .map(|issued| issued.token.clone())
            .collect()
    }

    /// The token issued last, if any (valid or not).
    pub fn current_token(&self) -> Option<String> {
        lock(&self.shared.state)
            .issued
            .last()
            .map(|issued| issued.token.clone())
    }

    /// Number of POSTs to `/token`, granted or refused.
    pub fn request_count(&self) -> usize {
        self.shared.request_count.load(Ordering::SeqCst)
    }

    /// Every POST to `/token`, in arrival order.
    pub fn requests(&self) -> Vec<TokenRequest> {
        lock(&self.shared.state).requests.clone()
    }

    /// Whether `token` was issued here, has not expired and was not revoked.
    pub fn accepts(&self, token: &str) -> bool {
        self.shared.accepts(token)
    }

    /// A check for `AuthRequirement::xoauth2` that accepts what [`Self::accepts`]
    /// accepts, at the moment of each AUTH.
    pub fn token_check(&self) -> TokenCheck {
        let shared = Arc::clone(&self.shared);
        TokenCheck::from_fn(move |token| shared.accepts(token))
    }

    /// Makes every token issued so far invalid (as if the provider rotated its
    /// keys), so a client must fetch a new one.
    pub fn revoke_tokens(&self) {
        for issued in &mut lock(&self.shared.state).issued {
            issued.revoked = true;
        }
    }

    /// Lifetime of tokens issued from now on, in seconds.
    pub fn set_expires_in(&self, seconds: u64) {
        self.shared.expires_in.store(seconds, Ordering::SeqCst);
    }

    /// While true, every request gets `503 {"error":"temporarily_unavailable"}`.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.shared.unavailable.store(unavailable, Ordering::SeqCst);
    }

    /// Stops accepting connections and waits (briefly) until the server task is
    /// gone, so the port refuses connections once this returns.
    pub async fn stop(&self) {
        self.http.stop().await;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Nothing here leaves the token lists half-updated on a panic.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn accepts(&self, token: &str) -> bool {
        let now = Instant::now();
        lock(&self.state)
            .issued
            .iter()
            .any(|issued| issued.token == token && !issued.revoked && now < issued.expires_at)
    }

    fn issue(&self) -> (String, u64) {
        let expires_in = self.expires_in.load(Ordering::SeqCst);
        let mut state = lock(&self.state);
        // A counter makes tokens easy to tell apart in assertion messages; the
        // random part makes them unguessable, like a real provider's.
        let token = format!(
            "at-{}-{}",
            state.issued.len() + 1,
            uuid::Uuid::new_v4().simple()
        );
        let lifetime = Duration::from_secs(expires_in);
        let now = Instant::now();
        state.issued.push(IssuedToken {
            token: token.clone(),
            // An absurd lifetime saturates instead of overflowing.
            expires_at: now
                .checked_add(lifetime)
                .unwrap_or(now + Duration::from_secs(86_400 * 365 * 100)),
            revoked: false,
        });
        (token, expires_in)
    }
}

/// Why a request is refused: the status and the RFC 6749 §5.2 error code.
struct Refusal {
    status: StatusCode,
    error: &'static str,
}

impl Refusal {
    const fn new(status: StatusCode, error: &'static str) -> Self {
        Refusal { status, error }
    }
}

async fn token(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    shared.request_count.fetch_add(1, Ordering::SeqCst);
    let mut record = TokenRequest {
        client_auth: ClientAuth::None,
        client_id: None,
        grant_type: None,
        scope: None,
        status: 0,
        issued: None,
    };
    let outcome = grant(&shared, &headers, &body, &mut record);
    let response = match outcome {
        Ok((token, expires_in)) => {
            let mut document = serde_json::json!({
                "access_token": token,
                "token_type": "Bearer",
                "expires_in": expires_in,
            });
            if let Some(scope) = &record.scope {
                document["scope"] = scope.clone().into();
            }
            record.status = 200;
            record.issued = Some(token);
            json_response(StatusCode::OK, &document)
        }
        Err(refusal) => {
            record.status = refusal.status.as_u16();
            let mut response = json_response(
                refusal.status,
                &serde_json::json!({ "error": refusal.error }),
            );
            if refusal.status == StatusCode::UNAUTHORIZED {
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Basic realm=\"outbox-test\""),
                );
            }
            response
        }
    };
    lock(&shared.state).requests.push(record);
    response
}

/// Checks one token request and issues a token, filling `record` as it learns.
fn grant(
    shared: &Shared,
    headers: &HeaderMap,
    body: &[u8],
    record: &mut TokenRequest,
) -> Result<(String, u64), Refusal> {
    const INVALID_REQUEST: Refusal = Refusal::new(StatusCode::BAD_REQUEST, "invalid_request");
    const INVALID_CLIENT: Refusal = Refusal::new(StatusCode::UNAUTHORIZED, "invalid_client");

    if shared.unavailable.load(Ordering::SeqCst) {
        return Err(Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
        ));
    }
    let form_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|mime| {
            mime.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        });
    if !form_type {
        return Err(INVALID_REQUEST);
    }
    let params = parse_form(body).ok_or(INVALID_REQUEST)?;
    let param = |name: &str| {
        params
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    record.grant_type = param("grant_type");
    record.scope = param("scope");

    let basic = match headers.get(header::AUTHORIZATION) {
        None => None,
        Some(value) => Some(parse_basic(value.as_bytes()).ok_or(INVALID_CLIENT)?),
    };
    let in_body = param("client_id").map(|id| (id, param("client_secret").unwrap_or_default()));
    let (id, secret) = match (basic, in_body) {
        (Some(_), Some(_)) => return Err(INVALID_REQUEST),
        (Some(credentials), None) => {
            record.client_auth = ClientAuth::Basic;
            credentials
        }
        (None, Some(credentials)) => {
            record.client_auth = ClientAuth::Body;
            credentials
        }
        (None, None) => return Err(INVALID_CLIENT),
    };
    record.client_id = Some(id.clone());
    if id != shared.client_id || secret != shared.client_secret {
        return Err(INVALID_CLIENT);
    }
    match record.grant_type.as_deref() {
        None => return Err(INVALID_REQUEST),
        Some("client_credentials") => {}
        Some(_) => {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "unsupported_grant_type",
            ));
        }
    }
    Ok(shared.issue())
}

fn json_response(status: StatusCode, document: &serde_json::Value) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
            (header::PRAGMA, "no-cache"),
        ],
        document.to_string(),
    )
        .into_response()
}

/// `Basic base64(urlencode(id) ":" urlencode(secret))` (RFC 6749 §2.3.1).
fn parse_basic(value: &[u8]) -> Option<(String, String)> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("Basic") {
        return None;
    }
    let decoded = BASE64.decode(encoded.trim()).ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (id, secret) = decoded.split_once(':')?;
    Some((form_decode(id)?, form_decode(secret)?))
}

/// Parses an `application/x-www-form-urlencoded` body. None if it is not UTF-8,
/// has a bad escape, or repeats a parameter (RFC 6749 §3.2).
fn parse_form(body: &[u8]) -> Option<Vec<(String, String)>> {
    let body = std::str::from_utf8(body).ok()?;
    let mut params: Vec<(String, String)> = Vec::new();
    for pair in body.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let (key, value) = (form_decode(key)?, form_decode(value)?);
        if params.iter().any(|(seen, _)| *seen == key) {
            return None;
        }
        params.push((key, value));
    }
    Some(params)
}

/// Undoes form encoding: `+` is a space, `%XX` a byte; the result must be UTF-8.
fn form_decode(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut input = text.bytes();
    while let Some(byte) = input.next() {
        match byte {
            b'+' => bytes.push(b' '),
            b'%' => {
                let high = char::from(input.next()?).to_digit(16)?;
                let low = char::from(input.next()?).to_digit(16)?;
                bytes.push(u8::try_from(high * 16 + low).ok()?);
            }
            other => bytes.push(other),
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
#[allow(
    clippy::expect_used,
    reason = "a failed expectation in a test should stop it with a clear message"
)]
mod tests {
    use super::*;
    use crate::smtp_sink::{AuthRequirement, SinkOptions, SmtpSink};
    use crate::webhook_server::tests::{HttpResponse, STEP, http_request};

    const FORM: (&str, &str) = ("Content-Type", "application/x-www-form-urlencoded");

    async fn request(server: &OAuthServer, headers: &[(&str, &str)], body: &str) -> HttpResponse {
        tokio::time::timeout(
            STEP,
            http_request(server.addr(), "POST", "/token", headers, body.as_bytes()),
        )
        .await
        .expect("request timed out")
        .expect("request")
    }

    fn basic(id: &str, secret: &str) -> String {
        format!("Basic {}", BASE64.encode(format!("{id}:{secret}")))
    }

    fn json(response: &HttpResponse) -> serde_json::Value {
        serde_json::from_str(&response.body).expect("json body")
    }

    #[tokio::test]
    async fn basic_auth_grant_issues_a_fresh_bearer_token_each_time() {
        let server = OAuthServer::start("outbox", "p@ss word", 3600)
            .await
            .expect("start");
        assert_eq!(server.url(), format!("http://{}/token", server.addr()));
        // RFC 6749 §2.3.1: id and secret are form-encoded before base64.
        let authorization = basic("outbox", "p%40ss+word");
        let headers = [FORM, ("Authorization", authorization.as_str())];
        let body =
            "grant_type=client_credentials&scope=https%3A%2F%2Foutlook.office365.com%2F.default";
        let first = request(&server, &headers, body).await;
        assert_eq!(first.status, 200, "{first:?}");
        assert_eq!(
            first.headers.get("content-type").map(String::as_str),
            Some("application/json")
        );
        assert_eq!(
            first.headers.get("cache-control").map(String::as_str),
            Some("no-store")
        );
        let document = json(&first);
        assert_eq!(document["token_type"], "Bearer");
        assert_eq!(document["expires_in"], 3600);
        assert_eq!(document["scope"], "https://outlook.office365.com/.default");
        let token = document["access_token"]
            .as_str()
            .expect("token")
            .to_string();
        assert!(server.accepts(&token));

        let second = json(&request(&server, &headers, body).await);
        let second_token = second["access_token"].as_str().expect("token");
        assert_ne!(second_token, token);
        assert_eq!(
            server.tokens_issued(),
            [token.clone(), second_token.to_string()]
        );
        assert_eq!(server.current_token().as_deref(), Some(second_token));
        assert_eq!(server.request_count(), 2);
        // Both stay valid until they expire.
        assert!(server.accepts(&token) && server.accepts(second_token));
        assert!(!server.accepts("at-1-forged"));
        let requests = server.requests();
        assert_eq!(requests[0].client_auth, ClientAuth::Basic);
        assert_eq!(requests[0].client_id.as_deref(), Some("outbox"));
        assert_eq!(
            requests[0].grant_type.as_deref(),
            Some("client_credentials")
        );
        assert_eq!(requests[0].issued.as_deref(), Some(token.as_str()));
    }

    #[tokio::test]
    async fn body_credentials_work_and_bad_requests_are_refused_per_rfc_6749() {
        let server = OAuthServer::start("outbox", "secret", 60)
            .await
            .expect("start");
        let ok = request(
            &server,
            &[FORM],
            "grant_type=client_credentials&client_id=outbox&client_secret=secret",
        )
        .await;
        assert_eq!(ok.status, 200, "{ok:?}");
        assert!(json(&ok).get("scope").is_none());
        assert_eq!(server.requests()[0].client_auth, ClientAuth::Body);

        // (request headers, body, expected status, expected error code)
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, u16, &'a str);
        let cases: [Case; 9] = [
            (
                &[FORM],
                "grant_type=client_credentials&client_id=outbox&client_secret=wrong",
                401,
                "invalid_client",
            ),
            (
                &[FORM],
                "grant_type=client_credentials",
                401,
                "invalid_client",
            ),
            (
                &[FORM, ("Authorization", "Basic !!!")],
                "grant_type=client_credentials",
                401,
                "invalid_client",
            ),
            (
                &[FORM, ("Authorization", "Bearer abc")],
                "grant_type=client_credentials",
                401,
                "invalid_client",
            ),
            (
                &[FORM],
                "client_id=outbox&client_secret=secret",
                400,
                "invalid_request",
            ),
            (
                &[FORM],
                "grant_type=password&client_id=outbox&client_secret=secret",
                400,
                "unsupported_grant_type",
            ),
            (
                &[FORM],
                "grant_type=client_credentials&grant_type=client_credentials&client_id=outbox&client_secret=secret",
                400,
                "invalid_request",
            ),
            (
                &[("Content-Type", "application/json")],
                r#"{"grant_type":"client_credentials"}"#,
                400,
                "invalid_request",
            ),
            (&[FORM], "grant_type=%ZZ", 400, "invalid_request"),
        ];
        for (headers, body, status, error) in cases {
            let response = request(&server, headers, body).await;
            assert_eq!(response.status, status, "{body}: {response:?}");
            assert_eq!(json(&response)["error"], error, "{body}");
            if status == 401 {
                assert!(response.headers.contains_key("www-authenticate"));
            }
        }
        // Both methods at once.
        let authorization = basic("outbox", "secret");
        let both = request(
            &server,
            &[FORM, ("Authorization", authorization.as_str())],
            "grant_type=client_credentials&client_id=outbox&client_secret=secret",
        )
        .await;
        assert_eq!(both.status, 400);
        assert_eq!(server.tokens_issued().len(), 1);
        assert_eq!(server.request_count(), 11);
        assert_eq!(server.requests().len(), 11);

        // Only POST /token exists.
        let get = http_request(server.addr(), "GET", "/token", &[], b"")
            .await
            .expect("get");
        assert_eq!(get.status, 405);
        let other = http_request(server.addr(), "POST", "/other", &[FORM], b"")
            .await
            .expect("other");
        assert_eq!(other.status, 404);
    }

    #[tokio::test]
    async fn expiry_revocation_and_outages() {
        let server = OAuthServer::start("outbox", "secret", 0)
            .await
            .expect("start");
        let authorization = basic("outbox", "secret");
        let headers = [FORM, ("Authorization", authorization.as_str())];
        let body = "grant_type=client_credentials";
        let expired = json(&request(&server, &headers, body).await);
        assert_eq!(expired["expires_in"], 0);
        assert!(!server.accepts(expired["access_token"].as_str().expect("token")));

        server.set_expires_in(600);
        let live = json(&request(&server, &headers, body).await);
        let live = live["access_token"].as_str().expect("token").to_string();
        assert!(server.accepts(&live));
        server.revoke_tokens();
        assert!(!server.accepts(&live));

        server.set_unavailable(true);
        let down = request(&server, &headers, body).await;
        assert_eq!(down.status, 503);
        assert_eq!(json(&down)["error"], "temporarily_unavailable");
        server.set_unavailable(false);
        let fresh = json(&request(&server, &headers, body).await);
        assert!(server.accepts(fresh["access_token"].as_str().expect("token")));
        assert_eq!(server.tokens_issued().len(), 3);

        let addr = server.addr();
        server.stop().await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn the_sink_accepts_exactly_the_tokens_the_server_issued() {
        use lettre::transport::smtp::authentication::{Credentials, Mechanism};
        use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

        let server = OAuthServer::start("outbox", "secret", 3600)
            .await
            .expect("start");
        let sink = SmtpSink::start_with(SinkOptions {
            auth: Some(AuthRequirement::xoauth2(
                "notifications@example.test",
                server.token_check(),
            )),
        })
        .await
        .expect("sink");
        let send = |token: String| {
            let transport = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1")
                .port(sink.addr().port())
                .timeout(Some(STEP))
                .credentials(Credentials::new("notifications@example.test".into(), token))
                .authentication(vec![Mechanism::Xoauth2])
                .build();
            async move {
                let message = Message::builder()
                    .from("notifications@example.test".parse().expect("from"))
                    .to("ops@example.test".parse().expect("to"))
                    .subject("Tank 4")
                    .body(String::from("Level 97%"))
                    .expect("message");
                transport.send(message).await
            }
        };
        let authorization = basic("outbox", "secret");
        let grant = request(
            &server,
            &[FORM, ("Authorization", authorization.as_str())],
            "grant_type=client_credentials&scope=https%3A%2F%2Fmail.google.com%2F",
        )
        .await;
        let token = json(&grant)["access_token"]
            .as_str()
            .expect("token")
            .to_string();
        send(token.clone()).await.expect("send with issued token");
        assert!(send("at-1-forged".into()).await.is_err());
        server.revoke_tokens();
        assert!(send(token).await.is_err());
        assert_eq!(sink.messages().len(), 1);
        assert_eq!(sink.auth_failures(), 2);
    }

    #[test]
    fn forms_and_basic_credentials_are_decoded() {
        assert_eq!(
            parse_form(b"a=1&b=x+y%2Bz&c&&d=%C3%A9").expect("form"),
            [
                ("a".to_string(), "1".to_string()),
                ("b".into(), "x y+z".into()),
                ("c".into(), String::new()),
                ("d".into(), "\u{e9}".into()),
            ]
        );
        assert_eq!(parse_form(b"a=1&a=2"), None);
        assert_eq!(parse_form(b"a=%4"), None);
        assert_eq!(parse_form(b"a=%FF"), None);
        assert_eq!(parse_form(b"\xff=1"), None);
        assert_eq!(
            parse_basic(basic("id%3Ax", "s:e+c").as_bytes()),
            Some(("id:x".to_string(), "s:e c".to_string()))
        );
        assert_eq!(
            parse_basic(b"basic Og=="),
            Some((String::new(), String::new()))
        );
        assert_eq!(parse_basic(b"Basic bm9jb2xvbg=="), None);
        assert_eq!(parse_basic(b"Basic"), None);
    }
}
