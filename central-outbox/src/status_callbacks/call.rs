//! One status callback call: the JSON document for a change, signed as webhook deliveries are,
//! POSTed to the list's endpoint, and its answer classified (`domain::status_callback`).
//!
//! The document:
//! `{"event": "notification.status", "change": <seq>, "notification_id", "status",
//! "decided_at", "reason", "delivered_to", "list", "site_id", "subject", "priority",
//! "condition_key"}`. Headers: `Idempotency-Key: <notification_id>:<change>` (the same for
//! every call of one change, so a receiver drops the repeats of a call whose answer was
//! lost), `X-Outbox-Event: notification.status`, and `X-Outbox-Signature: t=<unix>,v1=<hex>`,
//! the HMAC-SHA256 of `<t>.<Idempotency-Key>.<body>` under `status_callbacks.key`, exactly
//! as a webhook list signs its deliveries (`delivery::webhook`), so one verifier serves both.

use std::time::{Duration, Instant};

use chrono::{SecondsFormat, Utc};
use serde_json::json;

use crate::delivery::http::{HttpClient, HttpError};
use crate::delivery::webhook::{SIGNATURE_HEADER, sign};
use crate::domain::channel::Secret;
use crate::domain::status_callback::CallResult;
use crate::domain::webhook::WebhookUrl;
use crate::records::SiteStatusChange;

/// The event name, in the body and the `X-Outbox-Event` header.
pub(crate) const EVENT: &str = "notification.status";

/// How much of a refusing answer's body goes into the history entry's error.
const ERROR_BODY_CHARS: usize = 200;

/// The body of the call for `change`.
pub(crate) fn document(change: &SiteStatusChange) -> Vec<u8> {
    let state = &change.state;
    let at = |t: chrono::DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Millis, true);
    json!({
        "event": EVENT,
        "change": change.seq,
        "notification_id": state.id.to_string(),
        "status": state.status.as_str(),
        "decided_at": state.resolved_at.map(at),
        "reason": state.last_error,
        "delivered_to": change.delivered_to,
        "list": state.list_name,
        "site_id": state.source_site_id,
        "subject": state.subject,
        "priority": state.priority.as_str(),
        "condition_key": state.condition_key,
    })
    .to_string()
    .into_bytes()
}

/// Makes the call for `change` to `endpoint`, signed with `key`; what it took, and how it
/// ended.
pub(crate) async fn call(
    http: &HttpClient,
    endpoint: &WebhookUrl,
    key: &Secret,
    change: &SiteStatusChange,
    timeout: Duration,
) -> (Duration, CallResult) {
    let started = Instant::now();
    let body = document(change);
    let idempotency_key = format!("{}:{}", change.state.id, change.seq);
    let signature = match sign(key, Utc::now().timestamp(), &idempotency_key, &body) {
        Ok(signature) => signature,
        Err(e) => {
            return (
                Duration::ZERO,
                CallResult::Permanent(e.message().to_owned()),
            );
        }
    };
    let headers = [
        ("Content-Type", "application/json".to_owned()),
        ("Idempotency-Key", idempotency_key),
        ("X-Outbox-Event", EVENT.to_owned()),
        (
            "User-Agent",
            concat!("notification-outbox/", env!("CARGO_PKG_VERSION")).to_owned(),
        ),
        (SIGNATURE_HEADER, signature),
    ];
    let result = match http.post(endpoint.as_str(), &headers, body, timeout).await {
        Ok(reply) => classify(reply.status, &reply.body),
        Err(HttpError::Timeout) => CallResult::Transient(format!(
            "no complete answer within {}",
            humantime::format_duration(timeout)
        )),
        Err(e @ (HttpError::Connect(_) | HttpError::Io(_))) => CallResult::Transient(e.to_string()),
        Err(e @ HttpError::InvalidUrl(_)) => CallResult::Permanent(e.to_string()),
    };
    (started.elapsed(), result)
}

/// An answer's meaning: 2xx answered; 408, 429 and 5xx may be answered later; anything else
/// (another 4xx, a redirect, which is not followed) will be refused the same way again.
fn classify(status: u16, body: &str) -> CallResult {
    let described = || {
        let excerpt: String = body.trim().chars().take(ERROR_BODY_CHARS).collect();
        let excerpt = crate::domain::webhook::cut_urls(&excerpt).into_owned();
        if excerpt.is_empty() {
            format!("HTTP {status}")
        } else {
            format!("HTTP {status}: {excerpt}")
        }
    };
    match status {
        200..=299 => CallResult::Answered,
        408 | 429 | 500..=599 => CallResult::Transient(described()),
        300..=399 => CallResult::Permanent(format!(
            "{}; redirects are not followed, configure the final URL",
            described()
        )),
        _ => CallResult::Permanent(described()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_classified_as_the_rules_say() {
        assert_eq!(classify(204, ""), CallResult::Answered);
        assert_eq!(
            classify(503, "busy"),
            CallResult::Transient("HTTP 503: busy".into())
        );
        assert_eq!(classify(429, ""), CallResult::Transient("HTTP 429".into()));
        assert!(matches!(classify(302, ""), CallResult::Permanent(e) if e.contains("redirects")));
        assert_eq!(
            classify(410, "gone"),
            CallResult::Permanent("HTTP 410: gone".into())
        );
    }
}
