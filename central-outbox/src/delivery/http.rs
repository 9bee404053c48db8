//! The one HTTP client central uses for outbound HTTP: webhook POSTs and OAuth2 token requests.
//!
//! A hyper-util pooled client over rustls (ring provider, Mozilla's compiled-in roots, so the
//! outcome does not depend on the host's certificate store), HTTP/1.1 only. It never follows
//! redirects: a webhook that moved must be reconfigured, not silently chased to another host with
//! the same signed body. Every exchange, from connect to the last body byte read, is bounded by
//! the caller's timeout. Only a prefix of the response body is kept: callers need it for error
//! messages and small JSON documents, never a download.
//!
//! Errors never carry the request URL (its query string may hold a token), header values or the
//! body.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use outbox_proto::error_chain;

/// How much of a response body [`HttpClient::post`] keeps: enough for a status document or an
/// error message, small enough that a hostile endpoint cannot make us buffer much.
pub(crate) const REPLY_BODY_LIMIT: usize = 4 * 1024;

/// How long an idle pooled connection is kept. Most webhook receivers close idle connections
/// after about a minute; reusing one they are about to close costs a failed attempt.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(50);

/// Idle connections kept per host. Deliveries to one host rarely overlap by more than this.
const POOL_MAX_IDLE_PER_HOST: usize = 16;

/// A pooled HTTPS (and loopback-http) client. Clones share the pool.
#[derive(Clone)]
pub(crate) struct HttpClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient").finish_non_exhaustive()
    }
}

/// What the server answered.
pub(crate) struct HttpReply {
    pub status: u16,
    /// The raw `Retry-After` header, if the server sent one (RFC 9110 §10.2.3).
    pub retry_after: Option<String>,
    /// The first [`REPLY_BODY_LIMIT`] bytes of the body, decoded as UTF-8 lossily.
    pub body: String,
}

impl fmt::Debug for HttpReply {
    // The body is left out: a token endpoint's reply carries the access token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpReply")
            .field("status", &self.status)
            .field("retry_after", &self.retry_after)
            .field("body_len", &self.body.len())
            .finish()
    }
}

/// Why no reply arrived. None of the texts contains the URL, a header or the body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HttpError {
    /// The whole exchange did not finish within the timeout.
    #[error("no complete response within the timeout")]
    Timeout,
    /// No connection: DNS, TCP or TLS failed.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// The connection broke, the response was malformed, or a request header was unusable.
    #[error("HTTP exchange failed: {0}")]
    Io(String),
    /// The URL cannot be requested (not absolute http/https with a host).
    #[error("invalid URL: {0}")]
    InvalidUrl(String),
}

impl HttpClient {
    /// A client trusting Mozilla's roots (webpki-roots) with rustls on ring, HTTP/1.1 only.
    pub(crate) fn new() -> Result<Self, String> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| format!("cannot set up TLS for the HTTP client: {e}"))?
            // http:// is allowed here; the domain only accepts it for loopback addresses.
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
            .build(https);
        Ok(Self { client })
    }

    /// POST `body` with `headers`; the whole exchange (connect to last body byte) bounded by
    /// `timeout`. Keeps the first [`REPLY_BODY_LIMIT`] bytes of the response body.
    pub(crate) async fn post(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<HttpReply, HttpError> {
        self.post_limited(url, headers, body, timeout, REPLY_BODY_LIMIT)
            .await
    }

    /// [`Self::post`] keeping up to `body_limit` bytes of the response body (a token response
    /// with a large JWT does not fit in 4 KiB).
    pub(crate) async fn post_limited(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
        timeout: Duration,
        body_limit: usize,
    ) -> Result<HttpReply, HttpError> {
        let request = build_request(http::Method::POST, url, headers, body)?;
        self.exchange(request, timeout, body_limit).await
    }

    /// HEAD `url`, bounded by `timeout`: the cheapest exchange that says whether an endpoint
    /// answers (a webhook's probe while its list is on a fallback); nothing is posted.
    pub(crate) async fn head(&self, url: &str, timeout: Duration) -> Result<HttpReply, HttpError> {
        let request = build_request(http::Method::HEAD, url, &[], Vec::new())?;
        self.exchange(request, timeout, 0).await
    }

    /// Sends `request` and reads its answer, keeping up to `body_limit` bytes of its body.
    async fn exchange(
        &self,
        request: http::Request<Full<Bytes>>,
        timeout: Duration,
        body_limit: usize,
    ) -> Result<HttpReply, HttpError> {
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| {
                let text = error_chain(&e);
                if e.is_connect() {
                    HttpError::Connect(text)
                } else {
                    HttpError::Io(text)
                }
            })?;
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim().to_owned());
            let body = read_prefix(response.into_body(), body_limit).await?;
            Ok(HttpReply {
                status,
                retry_after,
                body: String::from_utf8_lossy(&body).into_owned(),
            })
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or(Err(HttpError::Timeout))
    }
}

fn build_request(
    method: http::Method,
    url: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> Result<http::Request<Full<Bytes>>, HttpError> {
    // The parse error's text describes the problem without echoing the URL.
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| HttpError::InvalidUrl(e.to_string()))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(HttpError::InvalidUrl("scheme must be http or https".into()));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(HttpError::InvalidUrl("no host".into()));
    }
    let mut request = http::Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        let name = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| HttpError::Io(format!("request header name {name:?} is not valid")))?;
        // The value may be a credential: name the header, never show the value.
        let value = http::HeaderValue::from_str(value)
            .map_err(|_| HttpError::Io(format!("request header {name} has an invalid value")))?;
        request = request.header(name, value);
    }
    request
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| HttpError::Io(format!("cannot build the request: {e}")))
}

/// Reads at most `limit` bytes of `body`. The rest is not read: dropping the body closes the
/// connection instead of draining an arbitrarily large response.
async fn read_prefix<B>(mut body: B, limit: usize) -> Result<Vec<u8>, HttpError>
where
    B: BodyExt<Data = Bytes> + Unpin,
    B::Error: std::error::Error,
{
    let mut kept = Vec::new();
    while kept.len() < limit {
        let Some(frame) = body.frame().await else {
            break;
        };
        let frame = frame.map_err(|e| HttpError::Io(error_chain(&e)))?;
        if let Ok(data) = frame.into_data() {
            let room = limit - kept.len();
            kept.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    use axum::Router;
    use axum::http::StatusCode;
    use axum::routing::post;

    async fn serve(router: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn posts_and_keeps_only_a_prefix_of_the_reply() {
        let base = serve(Router::new().route(
            "/big",
            post(|body: String| async move {
                (
                    StatusCode::ACCEPTED,
                    [("retry-after", "5")],
                    format!("{body}{}", "x".repeat(10_000)),
                )
            }),
        ))
        .await;
        let http = HttpClient::new().unwrap();
        let reply = http
            .post(
                &format!("{base}/big"),
                &[("content-type", "text/plain".to_owned())],
                b"echo:".to_vec(),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert_eq!(reply.status, 202);
        assert_eq!(reply.retry_after.as_deref(), Some("5"));
        assert_eq!(reply.body.len(), REPLY_BODY_LIMIT);
        assert!(reply.body.starts_with("echo:xxx"));
    }

    #[tokio::test]
    async fn bad_urls_and_refused_connections_are_classified() {
        let http = HttpClient::new().unwrap();
        let post = |url: &'static str| {
            let http = http.clone();
            async move {
                http.post(url, &[], Vec::new(), Duration::from_secs(5))
                    .await
                    .unwrap_err()
            }
        };
        assert!(matches!(post("not a url").await, HttpError::InvalidUrl(_)));
        assert!(matches!(post("/relative").await, HttpError::InvalidUrl(_)));
        assert!(matches!(
            post("ftp://127.0.0.1/x").await,
            HttpError::InvalidUrl(_)
        ));
        // Bind then drop a listener: nothing listens on that port any more.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let url: &'static str = format!("http://127.0.0.1:{port}/x?token=abc").leak();
        let err = post(url).await;
        assert!(matches!(err, HttpError::Connect(_)), "{err:?}");
        assert!(!err.to_string().contains("token=abc"), "{err}");
    }

    #[tokio::test]
    async fn https_goes_through_tls_and_a_failed_handshake_is_a_connect_error() {
        // A server that answers the TLS ClientHello with plain HTTP.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            while let Ok((mut socket, _)) = listener.accept().await {
                let _ = socket.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await;
            }
        });
        let err = HttpClient::new()
            .unwrap()
            .post(
                &format!("https://127.0.0.1:{port}/hook"),
                &[],
                Vec::new(),
                Duration::from_secs(5),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, HttpError::Connect(_)), "{err:?}");
    }

    #[tokio::test]
    async fn an_invalid_header_value_is_named_but_not_shown() {
        let http = HttpClient::new().unwrap();
        let err = http
            .post(
                "http://127.0.0.1:1/",
                &[("authorization", "Bearer s3cret\r\nX: y".to_owned())],
                Vec::new(),
                Duration::from_secs(1),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("authorization"), "{err}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }
}
