//! Webhook delivery: one JSON POST per endpoint of the list, in the format the list names
//! (the outbox's generic document, a Teams message card or a Slack message).
//!
//! All endpoints of a list are posted to concurrently, each bounded by the channel's timeout, so
//! one attempt takes at most one timeout however many endpoints the list has (a sequential walk
//! could outlive the dispatcher's claim). A notification is delivered only when every endpoint
//! answered 2xx; a retry posts to all endpoints again, and the `Idempotency-Key` header (the
//! NotificationId) lets receivers drop the repeats.
//!
//! Every request is signed when the list has a secret:
//! `X-Outbox-Signature: t=<unix seconds>,v1=<hex>`, where the hex is the HMAC-SHA256 of
//! `<t>.<NotificationId>.<body bytes>` under the secret. A receiver checks origin and integrity
//! of the body, the id and the time together: it rejects a signature older than its tolerance
//! (docs/delivery.md says 5 minutes) and drops repeats of an id it has seen, so a captured request
//! cannot be replayed later. Each attempt signs afresh, so a retry carries a current time.
//!
//! Classification per endpoint: 2xx delivered; 408, 429, 5xx, connect errors and
//! timeouts transient; 429/503 with `Retry-After` throttled (never retried sooner, capped at an
//! hour); 3xx and other 4xx permanent. Across endpoints a retryable failure wins over a permanent
//! one, since a retry may still deliver the rest. Error texts name the endpoint without its query
//! string (which may hold a token), the status and a short piece of the response body; never the
//! secret.

use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, SecondsFormat, Utc};
use futures_util::future::join_all;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use super::http::{HttpClient, HttpError};
use crate::domain::channel::{Secret, WebhookSettings};
use crate::domain::delivery::{Delivered, DeliveryError};
use crate::domain::escalation::{IncidentId, IncidentRef};
use crate::domain::failover::ProviderOutcome;
use crate::domain::webhook::{WebhookFormat, WebhookTarget, WebhookUrl};
use crate::domain::{NotificationContent, NotificationId, Provenance};

/// Longest wait a `Retry-After` may impose. A server asking for more is most likely
/// misconfigured, and an hour keeps the notification moving without hammering it.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60 * 60);

/// How much of a response body goes into an error message: enough for a JSON error or the first
/// line of an HTML page, short enough for LastError.
const ERROR_BODY_CHARS: usize = 200;

/// Failed endpoints named in a combined error message; the rest are counted. Keeps LastError
/// readable for a list with many endpoints.
const ERRORS_LISTED: usize = 5;

/// The header carrying the signature: `t=<unix seconds>,v1=<hex HMAC-SHA256>`.
pub(crate) const SIGNATURE_HEADER: &str = "X-Outbox-Signature";

/// What one webhook attempt sends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outgoing<'a> {
    pub id: NotificationId,
    pub content: &'a NotificationContent,
    pub provenance: &'a Provenance,
    /// The incident it belongs to, named in the generic document (`incident`).
    pub incident: Option<IncidentRef>,
    /// A digest's incidents (`digest.incidents`), empty for any other notification.
    pub digest_incidents: &'a [IncidentId],
    /// Its acknowledgement link, where it carries one (`incident.acknowledge_url`, or
    /// `digest.acknowledge_url`).
    pub acknowledge_url: Option<&'a str>,
}

/// Posts notifications to webhook endpoints. Cheap to share; clones of the client share its pool.
#[derive(Debug, Clone)]
pub(crate) struct WebhookAdapter {
    http: HttpClient,
}

/// One endpoint's result.
enum EndpointOutcome {
    Ok,
    Transient(String),
    Throttled(String, Duration),
    Permanent(String),
}

impl WebhookAdapter {
    pub(crate) fn new(http: HttpClient) -> Self {
        Self { http }
    }

    /// Posts `outgoing` to every endpoint of `target`.
    pub(crate) async fn deliver(
        &self,
        settings: &WebhookSettings,
        outgoing: &Outgoing<'_>,
        target: &WebhookTarget,
    ) -> Result<Delivered, DeliveryError> {
        if target.endpoints.is_empty() {
            return Err(DeliveryError::permanent(format!(
                "notification list {:?} has no webhook endpoints",
                outgoing.content.list_name.as_str()
            )));
        }
        let body = payload(target.format, outgoing);
        let headers = headers(outgoing.id, target.secret.as_ref(), &body, Utc::now())?;
        let outcomes = join_all(
            target
                .endpoints
                .iter()
                .map(|endpoint| self.post_one(endpoint, &headers, body.clone(), settings.timeout)),
        )
        .await;
        combine(target, outcomes)
    }

    /// Whether `endpoint` answers, for the probe of a list's first endpoint while the list is
    /// on a fallback (`domain::failover`): a HEAD, nothing posted, classified as a POST's answer
    /// would be. No answer in time, a connection or TLS failure, 408, 429 or 5xx: it still
    /// fails; any other status (404 and 405 too: something answers, and only a POST can say
    /// more) counts as an answer.
    pub(crate) async fn probe(&self, endpoint: &WebhookUrl, timeout: Duration) -> ProviderOutcome {
        let shown = without_query(endpoint.as_str());
        let outcome = match self.http.head(endpoint.as_str(), timeout).await {
            Ok(reply) => classify_status(shown, reply.status, None, "", Utc::now()),
            Err(e) => EndpointOutcome::Transient(format!("{shown}: {e}")),
        };
        match outcome {
            EndpointOutcome::Ok | EndpointOutcome::Permanent(_) => ProviderOutcome::Answered,
            EndpointOutcome::Transient(why) | EndpointOutcome::Throttled(why, _) => {
                tracing::info!(endpoint = %crate::domain::webhook::cut_urls(&why), "the first endpoint still does not answer");
                ProviderOutcome::Failed
            }
        }
    }

    async fn post_one(
        &self,
        endpoint: &WebhookUrl,
        headers: &[(&str, String)],
        body: Vec<u8>,
        timeout: Duration,
    ) -> EndpointOutcome {
        let shown = without_query(endpoint.as_str());
        match self
            .http
            .post(endpoint.as_str(), headers, body, timeout)
            .await
        {
            Ok(reply) => classify_status(
                shown,
                reply.status,
                reply.retry_after.as_deref(),
                &reply.body,
                Utc::now(),
            ),
            Err(HttpError::Timeout) => EndpointOutcome::Transient(format!(
                "{shown}: no complete response within {}",
                humantime::format_duration(timeout)
            )),
            Err(e @ (HttpError::Connect(_) | HttpError::Io(_))) => {
                EndpointOutcome::Transient(format!("{shown}: {e}"))
            }
            Err(e @ HttpError::InvalidUrl(_)) => {
                EndpointOutcome::Permanent(format!("{shown}: {e}"))
            }
        }
    }
}

/// The request body for `format`.
fn payload(format: WebhookFormat, outgoing: &Outgoing<'_>) -> Vec<u8> {
    let content = outgoing.content;
    let document = match format {
        WebhookFormat::Generic => {
            let p = outgoing.provenance;
            // TypeData is checked at ingest to be a JSON object or empty; anything else is sent
            // as null rather than failing the delivery.
            let type_data = match content.type_data.as_str() {
                "" => Value::Null,
                text => serde_json::from_str::<Value>(text)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or(Value::Null),
            };
            let mut document = json!({
                "notification_id": outgoing.id.to_string(),
                "type": "webhook",
                "list_name": content.list_name.as_str(),
                "subject": content.subject.as_str(),
                "body": content.body.as_str(),
                "type_data": type_data,
                "source": {
                    "site_id": p.source_site_id.as_str(),
                    "instance_id": p.source_instance_id,
                    "script": p.source_script,
                    "execution_id": p.origin_execution_id.map(|u| u.to_string()),
                    "parent_execution_id": p.origin_parent_execution_id.map(|u| u.to_string()),
                    "site_enqueued_at": p.site_enqueued_at.to_rfc3339_opts(SecondsFormat::AutoSi, true),
                },
            });
            // A notification of an escalating incident names it, so a receiver can tie the
            // pages of one incident together (its text ends with how to acknowledge it).
            if let Some(incident) = outgoing.incident {
                document["incident"] = json!({
                    "id": incident.id.0,
                    "page": incident.page_no,
                    "acknowledge_url": outgoing.acknowledge_url,
                });
            }
            // A digest names the incidents of its alarms; one acknowledgement covers them.
            if !outgoing.digest_incidents.is_empty() {
                document["digest"] = json!({
                    "incidents": outgoing.digest_incidents.iter().map(|i| i.0).collect::<Vec<_>>(),
                    "acknowledge_url": outgoing.acknowledge_url,
                });
            }
            document
        }
        WebhookFormat::Teams => json!({
            "@type": "MessageCard",
            "@context": "https://schema.org/extensions",
            "summary": content.subject.as_str(),
            "title": content.subject.as_str(),
            "text": content.body.as_str(),
        }),
        WebhookFormat::Slack => json!({
            "text": format!(
                "*{}*\n{}",
                slack_escape(content.subject.as_str()),
                slack_escape(content.body.as_str())
            ),
        }),
    };
    // Serialising a `Value` cannot fail (all keys are strings).
    serde_json::to_vec(&document).unwrap_or_default()
}

/// Slack's control characters in message text (its "Escaping text" rules): only these three.
fn slack_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// The headers every POST carries; the signature is dated `now`.
fn headers(
    id: NotificationId,
    secret: Option<&Secret>,
    body: &[u8],
    now: DateTime<Utc>,
) -> Result<Vec<(&'static str, String)>, DeliveryError> {
    let mut headers = vec![
        ("Content-Type", "application/json".to_owned()),
        ("Idempotency-Key", id.to_string()),
        (
            "User-Agent",
            concat!("notification-outbox/", env!("CARGO_PKG_VERSION")).to_owned(),
        ),
    ];
    if let Some(secret) = secret {
        let key = id.to_string();
        headers.push((SIGNATURE_HEADER, sign(secret, now.timestamp(), &key, body)?));
    }
    Ok(headers)
}

/// The `X-Outbox-Signature` value: `t=<timestamp>,v1=<lower-case hex HMAC-SHA256 of
/// "<timestamp>.<key>.<body>" keyed with secret>`, where `key` is the request's
/// `Idempotency-Key` (a delivery's NotificationId, a status callback's `<id>:<change>`). The key
/// and time are signed with the body, so neither can be changed on a captured request; "."
/// occurs in neither, so the signed string splits one way only.
pub(crate) fn sign(
    secret: &Secret,
    timestamp: i64,
    key: &str,
    body: &[u8],
) -> Result<String, DeliveryError> {
    // HMAC takes keys of any length; the error exists only for the trait's sake.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.expose().as_bytes())
        .map_err(|_| DeliveryError::permanent("the webhook secret cannot key HMAC-SHA256"))?;
    mac.update(format!("{timestamp}.{key}.").as_bytes());
    mac.update(body);
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(format!("t={timestamp},v1={hex}"))
}

/// The endpoint as it may appear in messages: without query string or fragment.
fn without_query(url: &str) -> &str {
    url.split(['?', '#']).next().unwrap_or(url)
}

/// One endpoint's outcome from its status code.
fn classify_status(
    endpoint: &str,
    status: u16,
    retry_after: Option<&str>,
    body: &str,
    now: DateTime<Utc>,
) -> EndpointOutcome {
    let describe = || {
        let excerpt = excerpt(body);
        if excerpt.is_empty() {
            format!("{endpoint}: HTTP {status}")
        } else {
            format!("{endpoint}: HTTP {status}: {excerpt}")
        }
    };
    match status {
        200..=299 => EndpointOutcome::Ok,
        429 | 503 => match retry_after.and_then(|v| parse_retry_after(v, now)) {
            Some(wait) => EndpointOutcome::Throttled(describe(), wait),
            None => EndpointOutcome::Transient(describe()),
        },
        408 | 500..=599 => EndpointOutcome::Transient(describe()),
        300..=399 => EndpointOutcome::Permanent(format!(
            "{}; redirects are not followed; configure the final URL",
            describe()
        )),
        _ => EndpointOutcome::Permanent(describe()),
    }
}

/// Up to [`ERROR_BODY_CHARS`] characters of a response body, on one line.
fn excerpt(body: &str) -> String {
    let one_line: String = body
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(ERROR_BODY_CHARS)
        .collect();
    one_line.trim().to_owned()
}

/// A `Retry-After` value (RFC 9110 §10.2.3): delay-seconds, or an HTTP-date in any of the three
/// formats RFC 9110 §5.6.7 makes recipients accept. A date in the past means "now". Capped at
/// [`MAX_RETRY_AFTER`]; `None` when unparseable.
pub(crate) fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    let wait = if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // All digits: only overflow can fail, and a huge number is simply "the cap".
        Duration::from_secs(value.parse::<u64>().unwrap_or(u64::MAX))
    } else {
        let at = parse_http_date(value)?;
        (at - now).to_std().unwrap_or(Duration::ZERO)
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), RFC 850 (`Sunday, 06-Nov-94 08:49:37 GMT`) or
/// asctime (`Sun Nov  6 08:49:37 1994`); all are UTC.
fn parse_http_date(value: &str) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc2822(value) {
        return Some(t.with_timezone(&Utc));
    }
    let asctime = value.split_whitespace().collect::<Vec<_>>().join(" ");
    [
        (value, "%A, %d-%b-%y %H:%M:%S GMT"),
        (asctime.as_str(), "%a %b %e %H:%M:%S %Y"),
    ]
    .into_iter()
    .find_map(|(text, format)| NaiveDateTime::parse_from_str(text, format).ok())
    .map(|t| t.and_utc())
}

/// The attempt's result from every endpoint's outcome.
fn combine(
    target: &WebhookTarget,
    outcomes: Vec<EndpointOutcome>,
) -> Result<Delivered, DeliveryError> {
    let total = outcomes.len();
    let mut failures = Vec::new();
    let mut retryable = false;
    let mut retry_after: Option<Duration> = None;
    for outcome in outcomes {
        match outcome {
            EndpointOutcome::Ok => {}
            EndpointOutcome::Transient(message) => {
                retryable = true;
                failures.push(message);
            }
            EndpointOutcome::Throttled(message, wait) => {
                retryable = true;
                retry_after = Some(retry_after.map_or(wait, |w| w.max(wait)));
                failures.push(message);
            }
            EndpointOutcome::Permanent(message) => failures.push(message),
        }
    }
    if failures.is_empty() {
        return Ok(Delivered {
            resolved_targets: target.endpoints.iter().map(ToString::to_string).collect(),
        });
    }
    let mut message = if total == 1 {
        String::new()
    } else {
        format!("{} of {total} webhook endpoints failed: ", failures.len())
    };
    message.push_str(
        &failures
            .iter()
            .take(ERRORS_LISTED)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("; "),
    );
    if failures.len() > ERRORS_LISTED {
        message.push_str(&format!("; and {} more", failures.len() - ERRORS_LISTED));
    }
    Err(match (retryable, retry_after) {
        (true, Some(retry_after)) => DeliveryError::Throttled {
            message,
            retry_after,
        },
        (true, None) => DeliveryError::Transient(message),
        (false, _) => DeliveryError::Permanent(message),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::body::Bytes;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use axum::routing::post;

    use crate::domain::channel::DeliveryPolicy;
    use crate::domain::retry::Backoff;
    use crate::domain::{Body, ListName, NotificationType, SiteId, Subject, TypeData};

    /// What the test server received.
    #[derive(Clone, Default)]
    struct Received(Arc<Mutex<Vec<(String, HeaderMap, Bytes)>>>);

    impl Received {
        fn all(&self) -> Vec<(String, HeaderMap, Bytes)> {
            self.0.lock().unwrap().clone()
        }
    }

    /// A server on 127.0.0.1:0 answering each path as the test says, recording every request.
    /// Paths: `/ok`, `/status/<code>`, `/retry-after/<code>/<value>`, `/slow`.
    async fn server() -> (String, Received) {
        async fn record(
            State(received): State<Received>,
            uri: axum::http::Uri,
            headers: HeaderMap,
            body: Bytes,
        ) -> axum::response::Response {
            let path = uri.path().to_owned();
            received
                .0
                .lock()
                .unwrap()
                .push((path.clone(), headers, body));
            let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
            match parts.as_slice() {
                ["ok"] => (StatusCode::OK, "thanks").into_response(),
                ["status", code] => {
                    let code = StatusCode::from_u16(code.parse().unwrap()).unwrap();
                    let mut headers = HeaderMap::new();
                    if code.is_redirection() {
                        headers.insert("location", "https://elsewhere.test/".parse().unwrap());
                    }
                    (code, headers, format!("error page\nfor {code}")).into_response()
                }
                ["retry-after", code, value] => {
                    let code = StatusCode::from_u16(code.parse().unwrap()).unwrap();
                    let value = value.replace("%20", " ");
                    (code, [("retry-after", value)], "slow down").into_response()
                }
                ["slow"] => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    (StatusCode::OK, "late").into_response()
                }
                _ => StatusCode::NOT_FOUND.into_response(),
            }
        }
        let received = Received::default();
        let router = Router::new()
            .route("/{*path}", post(record))
            .with_state(received.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        (format!("http://{addr}"), received)
    }

    fn settings(timeout: Duration) -> WebhookSettings {
        WebhookSettings {
            timeout,
            policy: DeliveryPolicy {
                max_retries: 3,
                retry_delay: Duration::from_secs(60),
                backoff: Backoff::Fixed,
                max_concurrent_connections: 4,
                rate_limit: None,
            },
        }
    }

    fn content(type_data: &str) -> NotificationContent {
        NotificationContent {
            kind: NotificationType::Webhook,
            list_name: ListName::parse("ops-hooks".into()).unwrap(),
            subject: Subject::parse("Tank 4 <high> & rising".into()).unwrap(),
            body: Body::parse("Level 97%\nsecond line".into()).unwrap(),
            type_data: TypeData::parse(type_data.into()).unwrap(),
        }
    }

    fn provenance() -> Provenance {
        Provenance {
            source_site_id: SiteId::parse("site-a".into()).unwrap(),
            source_instance_id: "node-1".into(),
            source_script: "tank4.py".into(),
            origin_execution_id: Some(uuid::Uuid::nil()),
            origin_parent_execution_id: None,
            site_enqueued_at: DateTime::parse_from_rfc3339("2026-11-21T10:00:00Z")
                .unwrap()
                .with_timezone(&Utc),
        }
    }

    fn target(base: &str, paths: &[&str], format: WebhookFormat) -> WebhookTarget {
        WebhookTarget {
            endpoints: paths
                .iter()
                .map(|p| WebhookUrl::parse(&format!("{base}{p}")).unwrap())
                .collect(),
            fallbacks: Vec::new(),
            format,
            secret: None,
        }
    }

    async fn deliver(
        target: &WebhookTarget,
        timeout: Duration,
        type_data: &str,
    ) -> (NotificationId, Result<Delivered, DeliveryError>) {
        let adapter = WebhookAdapter::new(HttpClient::new().unwrap());
        let content = content(type_data);
        let provenance = provenance();
        let id = NotificationId::generate();
        let outgoing = Outgoing {
            id,
            content: &content,
            provenance: &provenance,
            incident: None,
            digest_incidents: &[],
            acknowledge_url: None,
        };
        let result = adapter.deliver(&settings(timeout), &outgoing, target).await;
        (id, result)
    }

    fn hex_hmac(key: &str, message: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).unwrap();
        mac.update(message);
        let bytes = mac.finalize().into_bytes();
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    const SIGNATURE_VECTOR: &str =
        "8dd391167b03f2d4aed646cc8bff2ed65b5c3cc2ca402d45e0d8550e1e907838";

    /// A fixed vector, computed outside this code (Python's hmac module):
    /// `hmac.new(b"0123456789abcdef-webhook-key", b"1700000000.0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b.{}",
    /// hashlib.sha256).hexdigest()`.
    #[test]
    fn the_signature_covers_time_id_and_body() {
        let secret = Secret::new("0123456789abcdef-webhook-key".into());
        let id = NotificationId::parse("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "id")
            .unwrap()
            .to_string();
        let header = sign(&secret, 1_700_000_000, &id, b"{}").unwrap();
        assert_eq!(header, format!("t=1700000000,v1={SIGNATURE_VECTOR}"));
        let other_id = NotificationId::generate().to_string();
        for changed in [
            sign(&secret, 1_700_000_001, &id, b"{}").unwrap(),
            sign(&secret, 1_700_000_000, &other_id, b"{}").unwrap(),
            sign(&secret, 1_700_000_000, &id, b"{ }").unwrap(),
        ] {
            assert_ne!(changed.split_once(",v1=").unwrap().1, SIGNATURE_VECTOR);
        }
    }

    #[tokio::test]
    async fn a_2xx_delivers_the_generic_document_with_headers_and_a_verifiable_signature() {
        let (base, received) = server().await;
        let mut target = target(&base, &["/ok?token=t0ps3cret"], WebhookFormat::Generic);
        let key = "0123456789abcdef-webhook-key";
        target.secret = Some(Secret::new(key.into()));
        let before = Utc::now().timestamp();
        let (id, result) = deliver(&target, Duration::from_secs(5), r#"{"tank":4}"#).await;
        let after = Utc::now().timestamp();
        assert_eq!(
            result.unwrap().resolved_targets,
            [format!("{base}/ok?token=t0ps3cret")]
        );

        let requests = received.all();
        assert_eq!(requests.len(), 1);
        let (path, headers, body) = &requests[0];
        assert_eq!(path, "/ok");
        let header = |name: &str| headers.get(name).unwrap().to_str().unwrap().to_owned();
        assert_eq!(header("content-type"), "application/json");
        assert_eq!(header("idempotency-key"), id.to_string());
        assert_eq!(
            header("user-agent"),
            format!("notification-outbox/{}", env!("CARGO_PKG_VERSION"))
        );
        let signature = header("x-outbox-signature");
        let (t, v1) = signature
            .strip_prefix("t=")
            .and_then(|rest| rest.split_once(",v1="))
            .unwrap();
        let t: i64 = t.parse().unwrap();
        assert!((before..=after).contains(&t), "{signature}");
        let mut signed = format!("{t}.{id}.").into_bytes();
        signed.extend_from_slice(body);
        assert_eq!(v1, hex_hmac(key, &signed));

        let doc: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(doc["notification_id"], id.to_string());
        assert_eq!(doc["type"], "webhook");
        assert_eq!(doc["list_name"], "ops-hooks");
        assert_eq!(doc["subject"], "Tank 4 <high> & rising");
        assert_eq!(doc["body"], "Level 97%\nsecond line");
        assert_eq!(doc["type_data"], json!({"tank": 4}));
        assert_eq!(
            doc["source"],
            json!({
                "site_id": "site-a",
                "instance_id": "node-1",
                "script": "tank4.py",
                "execution_id": "00000000-0000-0000-0000-000000000000",
                "parent_execution_id": null,
                "site_enqueued_at": "2026-11-21T10:00:00Z",
            })
        );
    }

    #[tokio::test]
    async fn without_a_secret_there_is_no_signature_and_empty_type_data_is_null() {
        let (base, received) = server().await;
        let (_, result) = deliver(
            &target(&base, &["/ok"], WebhookFormat::Generic),
            Duration::from_secs(5),
            "",
        )
        .await;
        assert!(result.is_ok());
        let (_, headers, body) = &received.all()[0];
        assert!(headers.get("x-outbox-signature").is_none());
        let doc: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(doc["type_data"], Value::Null);
    }

    #[tokio::test]
    async fn teams_and_slack_bodies_have_their_shapes() {
        let (base, received) = server().await;
        let (_, teams) = deliver(
            &target(&base, &["/ok"], WebhookFormat::Teams),
            Duration::from_secs(5),
            "",
        )
        .await;
        let (_, slack) = deliver(
            &target(&base, &["/ok"], WebhookFormat::Slack),
            Duration::from_secs(5),
            "",
        )
        .await;
        assert!(teams.is_ok() && slack.is_ok());
        let requests = received.all();
        let teams: Value = serde_json::from_slice(&requests[0].2).unwrap();
        assert_eq!(
            teams,
            json!({
                "@type": "MessageCard",
                "@context": "https://schema.org/extensions",
                "summary": "Tank 4 <high> & rising",
                "title": "Tank 4 <high> & rising",
                "text": "Level 97%\nsecond line",
            })
        );
        let slack: Value = serde_json::from_slice(&requests[1].2).unwrap();
        assert_eq!(
            slack,
            json!({"text": "*Tank 4 &lt;high&gt; &amp; rising*\nLevel 97%\nsecond line"})
        );
    }

    #[tokio::test]
    async fn server_errors_timeouts_and_throttling_are_transient() {
        let (base, _) = server().await;
        for code in ["500", "502", "408", "429", "503"] {
            let (_, result) = deliver(
                &target(&base, &[&format!("/status/{code}")], WebhookFormat::Generic),
                Duration::from_secs(5),
                "",
            )
            .await;
            match result {
                Err(DeliveryError::Transient(message)) => {
                    assert!(message.contains(code), "{message}");
                    assert!(message.contains("error page for"), "{message}");
                }
                other => panic!("{code}: {other:?}"),
            }
        }
        let (_, result) = deliver(
            &target(&base, &["/retry-after/429/7"], WebhookFormat::Generic),
            Duration::from_secs(5),
            "",
        )
        .await;
        match result {
            Err(DeliveryError::Throttled {
                message,
                retry_after,
            }) => {
                assert_eq!(retry_after, Duration::from_secs(7));
                assert!(message.contains("429"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let (_, result) = deliver(
            &target(&base, &["/retry-after/503/86400"], WebhookFormat::Generic),
            Duration::from_secs(5),
            "",
        )
        .await;
        assert!(matches!(
            result,
            Err(DeliveryError::Throttled { retry_after, .. }) if retry_after == MAX_RETRY_AFTER
        ));
    }

    #[tokio::test]
    async fn a_handler_slower_than_the_timeout_is_transient() {
        let (base, _) = server().await;
        let (_, result) = deliver(
            &target(&base, &["/slow"], WebhookFormat::Generic),
            Duration::from_millis(200),
            "",
        )
        .await;
        match result {
            Err(DeliveryError::Transient(message)) => {
                assert!(message.contains("/slow"), "{message}");
                assert!(message.contains("200ms"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn client_errors_and_redirects_are_permanent_without_the_query_string() {
        let (base, _) = server().await;
        let (_, result) = deliver(
            &target(
                &base,
                &["/status/404?token=t0ps3cret"],
                WebhookFormat::Generic,
            ),
            Duration::from_secs(5),
            "",
        )
        .await;
        match result {
            Err(DeliveryError::Permanent(message)) => {
                assert!(message.contains("HTTP 404"), "{message}");
                assert!(message.contains(&format!("{base}/status/404")), "{message}");
                assert!(!message.contains("t0ps3cret"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let (_, result) = deliver(
            &target(&base, &["/status/301"], WebhookFormat::Generic),
            Duration::from_secs(5),
            "",
        )
        .await;
        match result {
            Err(DeliveryError::Permanent(message)) => {
                assert!(message.contains("301"), "{message}");
                assert!(message.contains("redirects are not followed"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn every_endpoint_must_succeed_and_retryable_failures_win() {
        let (base, received) = server().await;
        let (_, result) = deliver(
            &target(&base, &["/ok", "/status/500"], WebhookFormat::Generic),
            Duration::from_secs(5),
            "",
        )
        .await;
        match result {
            Err(DeliveryError::Transient(message)) => {
                assert!(
                    message.starts_with("1 of 2 webhook endpoints failed"),
                    "{message}"
                );
                assert!(message.contains("/status/500"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(received.all().len(), 2, "both endpoints were posted to");

        let (_, result) = deliver(
            &target(
                &base,
                &["/status/404", "/retry-after/429/3", "/retry-after/503/9"],
                WebhookFormat::Generic,
            ),
            Duration::from_secs(5),
            "",
        )
        .await;
        match result {
            Err(DeliveryError::Throttled {
                message,
                retry_after,
            }) => {
                assert_eq!(retry_after, Duration::from_secs(9), "the longest wait wins");
                assert!(message.contains("404"), "{message}");
            }
            other => panic!("{other:?}"),
        }

        let (_, result) = deliver(
            &target(
                &base,
                &["/status/404", "/status/410"],
                WebhookFormat::Generic,
            ),
            Duration::from_secs(5),
            "",
        )
        .await;
        assert!(
            matches!(result, Err(DeliveryError::Permanent(_))),
            "{result:?}"
        );
    }

    #[test]
    fn the_generic_document_names_the_incident_and_its_acknowledgement_link() {
        let (content, provenance) = (content(""), provenance());
        let url = "https://outbox.plant.example/ack/12/2.1800000000.bGlzdCBvcHM.c2ln";
        let outgoing = Outgoing {
            id: NotificationId::generate(),
            content: &content,
            provenance: &provenance,
            incident: Some(IncidentRef {
                id: crate::domain::escalation::IncidentId(12),
                page_no: Some(2),
            }),
            digest_incidents: &[],
            acknowledge_url: Some(url),
        };
        let document: Value =
            serde_json::from_slice(&payload(WebhookFormat::Generic, &outgoing)).unwrap();
        assert_eq!(
            document["incident"],
            json!({"id": 12, "page": 2, "acknowledge_url": url})
        );
        let plain = Outgoing {
            incident: None,
            acknowledge_url: None,
            ..outgoing
        };
        let document: Value =
            serde_json::from_slice(&payload(WebhookFormat::Generic, &plain)).unwrap();
        assert!(document.get("incident").is_none(), "{document}");
        assert!(document.get("digest").is_none(), "{document}");
        let ids = [
            crate::domain::escalation::IncidentId(7),
            crate::domain::escalation::IncidentId(9),
        ];
        let digest = Outgoing {
            digest_incidents: &ids,
            acknowledge_url: Some(url),
            ..plain
        };
        let document: Value =
            serde_json::from_slice(&payload(WebhookFormat::Generic, &digest)).unwrap();
        assert_eq!(
            document["digest"],
            json!({"incidents": [7, 9], "acknowledge_url": url})
        );
    }

    #[test]
    fn the_delivery_future_can_run_on_another_thread() {
        fn assert_send<T: Send>(_: &T) {}
        let adapter = WebhookAdapter::new(HttpClient::new().unwrap());
        let (content, provenance) = (content(""), provenance());
        let outgoing = Outgoing {
            id: NotificationId::generate(),
            content: &content,
            provenance: &provenance,
            incident: None,
            digest_incidents: &[],
            acknowledge_url: None,
        };
        let target = target("http://127.0.0.1:9", &["/x"], WebhookFormat::Generic);
        let settings = settings(Duration::from_secs(1));
        assert_send(&adapter.deliver(&settings, &outgoing, &target));
    }

    #[test]
    fn retry_after_accepts_seconds_and_all_http_date_formats() {
        let now = DateTime::parse_from_rfc3339("1994-11-06T08:49:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(parse_retry_after("7", now), secs(7));
        assert_eq!(parse_retry_after(" 0 ", now), secs(0));
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
            secs(37)
        );
        assert_eq!(
            parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now),
            secs(37)
        );
        assert_eq!(parse_retry_after("Sun Nov  6 08:49:37 1994", now), secs(37));
        assert_eq!(
            parse_retry_after("Sat, 05 Nov 1994 08:49:37 GMT", now),
            secs(0)
        );
        assert_eq!(
            parse_retry_after("Mon, 07 Nov 1994 08:49:00 GMT", now),
            Some(MAX_RETRY_AFTER)
        );
        for bad in ["", "-1", "1.5", "soon", "Sun, 06 Nov 1994"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn error_excerpts_are_short_and_single_line() {
        let long = format!("line one\r\nline two {}", "z".repeat(500));
        let e = excerpt(&long);
        assert_eq!(e.chars().count(), ERROR_BODY_CHARS);
        assert!(!e.contains('\n') && !e.contains('\r'));
        assert_eq!(
            without_query("https://h.test/a/b?k=v#f"),
            "https://h.test/a/b"
        );
        assert_eq!(without_query("https://h.test/a#f"), "https://h.test/a");
    }
}
