//! OAuth2 client-credentials tokens (RFC 6749 §4.4) for SMTP XOAUTH2, fetched on demand and
//! cached per credentials until shortly before they expire.
//!
//! Invariants:
//! - A cached token is handed out only until its refresh time: 60 s before it expires, or a
//!   tenth of its lifetime before if that is shorter (a 5-minute token is refreshed after 4.5).
//!   The lifetime is measured from when the request was sent, so the server's clock and network
//!   delay can only make us refresh early.
//! - Concurrent callers with the same credentials share one fetch: each credentials value has
//!   its own async mutex, held across the fetch, so a burst of deliveries after expiry makes one
//!   token request, not one per SMTP session.
//! - The client secret and the token never appear in errors, logs or `Debug` output.
//!
//! Classification: a 4xx answer from the token endpoint (bad client, bad scope) is permanent,
//! except 408 and 429, which say "later"; a 5xx, a connect error or a timeout is transient, as is
//! anything else that may heal by itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Deserialize;

use super::http::{HttpClient, HttpError};
use crate::domain::channel::{OAuthClientCredentials, Secret};
use crate::domain::delivery::DeliveryError;

/// Refresh this long before expiry (unless a tenth of the lifetime is shorter): covers the SMTP
/// session that uses the token and clock skew with the authorisation server.
const REFRESH_MARGIN: Duration = Duration::from_secs(60);

/// Lifetime assumed when the response has no `expires_in` (RFC 6749 §5.1 makes it optional);
/// an hour is the common default, and a rejected token is invalidated anyway.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);

/// Longest lifetime believed. Keeps `Instant` arithmetic far from overflow and makes a token with
/// an absurd `expires_in` be refreshed at least daily.
const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// How much of a token response is read. Access tokens are often JWTs of a few KiB; anything
/// larger than this is not a token response.
const TOKEN_RESPONSE_LIMIT: usize = 64 * 1024;

/// How much of an error response's description goes into a message.
const ERROR_TEXT_CHARS: usize = 200;

/// A token and when to stop handing it out.
#[derive(Clone)]
struct CachedToken {
    token: Secret,
    refresh_at: Instant,
}

/// One slot per credentials value. The async mutex is held across a fetch so that concurrent
/// callers wait for it instead of fetching too.
type Slot = Arc<tokio::sync::Mutex<Option<CachedToken>>>;

/// Caches client-credentials access tokens. Cheap to share behind an `Arc`.
pub(crate) struct TokenCache {
    http: HttpClient,
    /// Slots by credentials (the secret is part of the key, so a rotated secret fetches anew).
    /// A plain mutex: only held to look up or replace a slot, never across an await.
    slots: Mutex<HashMap<OAuthClientCredentials, Slot>>,
    /// The clock; tests move it forward instead of sleeping.
    now: Box<dyn Fn() -> Instant + Send + Sync>,
}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCache").finish_non_exhaustive()
    }
}

/// The fields of a successful token response (RFC 6749 §5.1) that matter here. No `Debug`: it
/// holds the token.
#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    token_type: Option<String>,
    /// A number per the RFC; some servers send it as a string.
    #[serde(default)]
    expires_in: Option<serde_json::Value>,
}

/// An error response (RFC 6749 §5.2).
#[derive(Deserialize)]
struct ErrorResponse {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

impl TokenCache {
    pub(crate) fn new(http: HttpClient) -> Self {
        Self::with_clock(http, Instant::now)
    }

    fn with_clock(http: HttpClient, now: impl Fn() -> Instant + Send + Sync + 'static) -> Self {
        Self {
            http,
            slots: Mutex::new(HashMap::new()),
            now: Box::new(now),
        }
    }

    /// A valid access token for these credentials: cached until 60 s (or a tenth of its life, if
    /// shorter) before it expires, else fetched. Waiting for another caller's fetch counts
    /// against `timeout` too.
    pub(crate) async fn token(
        &self,
        creds: &OAuthClientCredentials,
        timeout: Duration,
    ) -> Result<Secret, DeliveryError> {
        let slot = self.slot(creds);
        let work = async {
            let mut cached = slot.lock().await;
            if let Some(token) = cached.as_ref()
                && (self.now)() < token.refresh_at
            {
                return Ok(token.token.clone());
            }
            *cached = None;
            let fresh = self.fetch(creds, timeout).await?;
            let token = fresh.token.clone();
            *cached = Some(fresh);
            Ok(token)
        };
        tokio::time::timeout(timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(DeliveryError::transient(format!(
                    "OAuth2 token request to {} timed out after {}",
                    shown_url(&creds.token_url),
                    humantime::format_duration(timeout)
                )))
            })
    }

    /// Forgets the cached token for these credentials (after the SMTP server rejects it), so the
    /// next [`Self::token`] fetches a new one.
    pub(crate) fn invalidate(&self, creds: &OAuthClientCredentials) {
        // Dropping the slot rather than clearing it: a fetch holding the old slot's lock may be
        // in progress, and it must not block this. Its result lands in the dropped slot.
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(creds);
    }

    fn slot(&self, creds: &OAuthClientCredentials) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(slots.entry(creds.clone()).or_default())
    }

    async fn fetch(
        &self,
        creds: &OAuthClientCredentials,
        timeout: Duration,
    ) -> Result<CachedToken, DeliveryError> {
        let shown = shown_url(&creds.token_url);
        // Finished before any await: the serializer is not `Send`, and the dispatcher runs
        // deliveries on other threads.
        let form = {
            let mut form = url::form_urlencoded::Serializer::new(String::new());
            form.append_pair("grant_type", "client_credentials");
            if !creds.scope.trim().is_empty() {
                form.append_pair("scope", creds.scope.trim());
            }
            form.finish()
        };
        let headers = [
            (
                "Content-Type",
                "application/x-www-form-urlencoded".to_owned(),
            ),
            ("Accept", "application/json".to_owned()),
            ("Authorization", basic_authorization(creds)),
            (
                "User-Agent",
                concat!("notification-outbox/", env!("CARGO_PKG_VERSION")).to_owned(),
            ),
        ];
        let sent_at = (self.now)();
        let reply = self
            .http
            .post_limited(
                &creds.token_url,
                &headers,
                form.into_bytes(),
                timeout,
                TOKEN_RESPONSE_LIMIT,
            )
            .await
            .map_err(|e| match e {
                HttpError::InvalidUrl(_) => {
                    DeliveryError::permanent(format!("OAuth2 token URL {shown}: {e}"))
                }
                HttpError::Timeout => DeliveryError::transient(format!(
                    "OAuth2 token request to {shown} timed out after {}",
                    humantime::format_duration(timeout)
                )),
                HttpError::Connect(_) | HttpError::Io(_) => {
                    DeliveryError::transient(format!("OAuth2 token request to {shown}: {e}"))
                }
            })?;
        match reply.status {
            200..=299 => parse_token(&reply.body, sent_at, &shown),
            status => Err(rejected(status, &reply.body)),
        }
    }
}

/// `Basic base64(urlencode(client_id) ":" urlencode(client_secret))` (RFC 6749 §2.3.1).
fn basic_authorization(creds: &OAuthClientCredentials) -> String {
    let encode = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let pair = format!(
        "{}:{}",
        encode(&creds.client_id),
        encode(creds.client_secret.expose())
    );
    format!("Basic {}", BASE64.encode(pair))
}

/// The token URL as it may appear in messages: without query string or fragment.
fn shown_url(url: &str) -> String {
    url.split(['?', '#']).next().unwrap_or(url).to_owned()
}

/// A token from a 2xx response body.
fn parse_token(body: &str, sent_at: Instant, shown: &str) -> Result<CachedToken, DeliveryError> {
    let unusable = |why: &str| {
        DeliveryError::permanent(format!(
            "OAuth2 token response from {shown} is unusable: {why}"
        ))
    };
    // serde_json's messages quote at most a mistyped scalar (never a string that fits its
    // field), so a string access_token cannot end up in the error.
    let response: TokenResponse =
        serde_json::from_str(body).map_err(|e| unusable(&format!("not the expected JSON: {e}")))?;
    if response.access_token.is_empty() {
        return Err(unusable("access_token is empty"));
    }
    match response.token_type.as_deref() {
        Some(t) if t.eq_ignore_ascii_case("bearer") => {}
        Some(t) => {
            let t: String = t.chars().take(40).collect();
            return Err(unusable(&format!(
                "token_type is {t:?}, XOAUTH2 needs a Bearer token"
            )));
        }
        None => return Err(unusable("token_type is missing (must be Bearer)")),
    }
    let lifetime = match response.expires_in {
        None | Some(serde_json::Value::Null) => DEFAULT_LIFETIME,
        Some(value) => {
            let seconds = match &value {
                serde_json::Value::Number(n) => n.as_f64(),
                serde_json::Value::String(s) => s.trim().parse::<f64>().ok(),
                _ => None,
            }
            .filter(|s| s.is_finite())
            .ok_or_else(|| unusable("expires_in is not a number"))?;
            Duration::from_secs_f64(seconds.clamp(0.0, MAX_LIFETIME.as_secs_f64()))
        }
    };
    Ok(CachedToken {
        token: Secret::new(response.access_token),
        refresh_at: sent_at + refresh_after(lifetime),
    })
}

/// How long after the request a token with this lifetime is still handed out.
fn refresh_after(lifetime: Duration) -> Duration {
    lifetime.saturating_sub(REFRESH_MARGIN.min(lifetime / 10))
}

/// The error for a non-2xx answer: the status, and the RFC 6749 §5.2 `error` code (plus a short
/// description) when the body is such a document, else a short excerpt of the body.
fn rejected(status: u16, body: &str) -> DeliveryError {
    let detail = match serde_json::from_str::<ErrorResponse>(body) {
        Ok(e) => match e.error_description.filter(|d| !d.trim().is_empty()) {
            Some(d) => format!("{} ({})", one_line(&e.error), one_line(&d)),
            None => one_line(&e.error),
        },
        Err(_) => one_line(body),
    };
    let message = if detail.is_empty() {
        format!("OAuth2 token request rejected: {status}")
    } else {
        format!("OAuth2 token request rejected: {status} {detail}")
    };
    match status {
        408 | 429 | 500..=599 => DeliveryError::Transient(message),
        // 1xx cannot reach here (hyper handles them); 3xx is a misconfigured URL.
        _ => DeliveryError::Permanent(message),
    }
}

/// Up to [`ERROR_TEXT_CHARS`] characters of `text`, control characters replaced, trimmed.
fn one_line(text: &str) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(ERROR_TEXT_CHARS)
        .collect();
    line.trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    use axum::Router;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use axum::routing::post;
    use futures_util::future::join_all;

    /// A token endpoint that counts requests, records the last one, and answers `reply` for the
    /// client id `good-client`, 401 `invalid_client` for anything else.
    #[derive(Clone, Default)]
    struct Endpoint {
        fetches: Arc<AtomicUsize>,
        last: Arc<Mutex<Option<(HeaderMap, String)>>>,
    }

    async fn token_endpoint(expires_in: &'static str) -> (String, Endpoint) {
        async fn answer(
            State((endpoint, expires_in)): State<(Endpoint, &'static str)>,
            headers: HeaderMap,
            body: String,
        ) -> axum::response::Response {
            let n = endpoint.fetches.fetch_add(1, Ordering::SeqCst) + 1;
            let auth = headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Basic "))
                .and_then(|v| BASE64.decode(v).ok())
                .map(|v| String::from_utf8(v).unwrap())
                .unwrap_or_default();
            *endpoint.last.lock().unwrap() = Some((headers, body));
            if !auth.starts_with("good-client:") {
                return (
                    StatusCode::UNAUTHORIZED,
                    r#"{"error":"invalid_client","error_description":"Client authentication failed"}"#,
                )
                    .into_response();
            }
            let expires = if expires_in.is_empty() {
                String::new()
            } else {
                format!(r#","expires_in":{expires_in}"#)
            };
            (
                [("content-type", "application/json")],
                format!(r#"{{"access_token":"tok-{n}","token_type":"bearer"{expires}}}"#),
            )
                .into_response()
        }
        let endpoint = Endpoint::default();
        let router = Router::new()
            .route("/token", post(answer))
            .with_state((endpoint.clone(), expires_in));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        (format!("http://{addr}/token"), endpoint)
    }

    fn creds(url: &str, client_id: &str) -> OAuthClientCredentials {
        OAuthClientCredentials {
            token_url: url.to_owned(),
            client_id: client_id.to_owned(),
            client_secret: Secret::new("s3cr:t/+ value".into()),
            scope: "https://outlook.office365.com/.default".into(),
        }
    }

    /// A cache whose clock the test moves forward, and the handle that moves it (in seconds).
    fn cache_with_clock() -> (Arc<TokenCache>, Arc<AtomicU64>) {
        let start = Instant::now();
        let offset = Arc::new(AtomicU64::new(0));
        let clock = Arc::clone(&offset);
        let cache = TokenCache::with_clock(HttpClient::new().unwrap(), move || {
            start + Duration::from_secs(clock.load(Ordering::SeqCst))
        });
        (Arc::new(cache), offset)
    }

    const TIMEOUT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn many_concurrent_callers_share_one_fetch_with_basic_auth_and_a_form_body() {
        let (url, endpoint) = token_endpoint("3600").await;
        let cache = Arc::new(TokenCache::new(HttpClient::new().unwrap()));
        let creds = creds(&url, "good-client");
        let tokens = join_all((0..20).map(|_| {
            let cache = Arc::clone(&cache);
            let creds = creds.clone();
            async move { cache.token(&creds, TIMEOUT).await.unwrap() }
        }))
        .await;
        assert!(tokens.iter().all(|t| t.expose() == "tok-1"));
        assert_eq!(endpoint.fetches.load(Ordering::SeqCst), 1);
        assert_eq!(
            cache.token(&creds, TIMEOUT).await.unwrap().expose(),
            "tok-1"
        );
        assert_eq!(endpoint.fetches.load(Ordering::SeqCst), 1);

        let (headers, body) = endpoint.last.lock().unwrap().clone().unwrap();
        // RFC 6749 §2.3.1: each part form-urlencoded, then joined and base64-encoded.
        let expected = format!(
            "Basic {}",
            BASE64.encode("good-client:s3cr%3At%2F%2B+value")
        );
        assert_eq!(headers["authorization"], expected.as_str());
        assert_eq!(headers["content-type"], "application/x-www-form-urlencoded");
        assert_eq!(
            body,
            "grant_type=client_credentials&scope=https%3A%2F%2Foutlook.office365.com%2F.default"
        );
    }

    #[tokio::test]
    async fn a_token_is_refetched_near_expiry_and_after_invalidation() {
        let (url, endpoint) = token_endpoint("3600").await;
        let (cache, clock) = cache_with_clock();
        let creds = creds(&url, "good-client");
        assert_eq!(
            cache.token(&creds, TIMEOUT).await.unwrap().expose(),
            "tok-1"
        );
        // Valid until 60 s before expiry...
        clock.store(3539, Ordering::SeqCst);
        assert_eq!(
            cache.token(&creds, TIMEOUT).await.unwrap().expose(),
            "tok-1"
        );
        // ...then refreshed.
        clock.store(3540, Ordering::SeqCst);
        assert_eq!(
            cache.token(&creds, TIMEOUT).await.unwrap().expose(),
            "tok-2"
        );
        assert_eq!(
            cache.token(&creds, TIMEOUT).await.unwrap().expose(),
            "tok-2"
        );
        cache.invalidate(&creds);
        assert_eq!(
            cache.token(&creds, TIMEOUT).await.unwrap().expose(),
            "tok-3"
        );
        assert_eq!(endpoint.fetches.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_short_lived_token_is_refreshed_a_tenth_of_its_life_early() {
        let (url, endpoint) = token_endpoint("300").await;
        let (cache, clock) = cache_with_clock();
        let creds = creds(&url, "good-client");
        assert_eq!(
            cache.token(&creds, TIMEOUT).await.unwrap().expose(),
            "tok-1"
        );
        clock.store(269, Ordering::SeqCst);
        assert_eq!(
            cache.token(&creds, TIMEOUT).await.unwrap().expose(),
            "tok-1"
        );
        clock.store(270, Ordering::SeqCst);
        assert_eq!(
            cache.token(&creds, TIMEOUT).await.unwrap().expose(),
            "tok-2"
        );
        assert_eq!(endpoint.fetches.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn without_expires_in_a_token_lives_an_hour() {
        let (url, _) = token_endpoint("").await;
        let (cache, clock) = cache_with_clock();
        let creds = creds(&url, "good-client");
        assert_eq!(
            cache.token(&creds, TIMEOUT).await.unwrap().expose(),
            "tok-1"
        );
        clock.store(3539, Ordering::SeqCst);
        assert_eq!(
            cache.token(&creds, TIMEOUT).await.unwrap().expose(),
            "tok-1"
        );
        clock.store(3540, Ordering::SeqCst);
        assert_eq!(
            cache.token(&creds, TIMEOUT).await.unwrap().expose(),
            "tok-2"
        );
    }

    #[tokio::test]
    async fn a_rejected_client_is_permanent_and_the_secret_never_shows() {
        let (url, endpoint) = token_endpoint("3600").await;
        let cache = TokenCache::new(HttpClient::new().unwrap());
        let err = cache
            .token(&creds(&url, "bad-client"), TIMEOUT)
            .await
            .unwrap_err();
        match &err {
            DeliveryError::Permanent(message) => {
                assert!(
                    message.starts_with("OAuth2 token request rejected: 401 invalid_client"),
                    "{message}"
                );
                assert!(!message.contains("s3cr"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // A failure is not cached: the next call asks again.
        assert!(
            cache
                .token(&creds(&url, "bad-client"), TIMEOUT)
                .await
                .is_err()
        );
        assert_eq!(endpoint.fetches.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_token_future_can_run_on_another_thread() {
        fn assert_send<T: Send>(_: &T) {}
        let cache = TokenCache::new(HttpClient::new().unwrap());
        let creds = creds("http://127.0.0.1:9/token", "good-client");
        assert_send(&cache.token(&creds, TIMEOUT));
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_is_transient() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let cache = TokenCache::new(HttpClient::new().unwrap());
        let err = cache
            .token(
                &creds(&format!("http://127.0.0.1:{port}/token"), "good-client"),
                TIMEOUT,
            )
            .await
            .unwrap_err();
        assert!(matches!(err, DeliveryError::Transient(_)), "{err:?}");
    }

    #[test]
    fn responses_are_classified() {
        let at = Instant::now();
        let ok = parse_token(
            r#"{"access_token":"abc","token_type":"Bearer","expires_in":"120"}"#,
            at,
            "u",
        )
        .unwrap();
        assert_eq!(ok.token.expose(), "abc");
        assert_eq!(ok.refresh_at, at + Duration::from_secs(108));
        for (body, why) in [
            (r#"{"access_token":"abc","token_type":"mac"}"#, "token_type"),
            (r#"{"access_token":"abc"}"#, "token_type"),
            (r#"{"access_token":"","token_type":"Bearer"}"#, "empty"),
            (r#"{"token_type":"Bearer"}"#, "JSON"),
            (
                r#"{"access_token":"abc","token_type":"Bearer","expires_in":[1]}"#,
                "expires_in",
            ),
            ("<html>", "JSON"),
        ] {
            let err = parse_token(body, at, "u").map(|_| ()).unwrap_err();
            assert!(matches!(err, DeliveryError::Permanent(_)), "{body}");
            assert!(err.message().contains(why), "{body}: {err}");
            assert!(!err.message().contains("abc"), "{body}: {err}");
        }
        assert!(matches!(rejected(503, ""), DeliveryError::Transient(_)));
        assert!(matches!(rejected(429, "{}"), DeliveryError::Transient(_)));
        assert!(matches!(rejected(400, "bad"), DeliveryError::Permanent(_)));
        assert_eq!(
            rejected(400, r#"{"error":"invalid_scope"}"#).message(),
            "OAuth2 token request rejected: 400 invalid_scope"
        );
        assert_eq!(refresh_after(Duration::ZERO), Duration::ZERO);
        assert_eq!(
            refresh_after(Duration::from_secs(3600)),
            Duration::from_secs(3540)
        );
    }
}
