//! Webhook targets: the endpoints a webhook list posts to, the payload format each expects, and
//! the optional signing secret. The HTTP side lives in `delivery::webhook`.

use std::fmt;

use super::ContentError;
use super::channel::Secret;

/// The body shape an endpoint expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookFormat {
    /// The outbox's own JSON document (id, subject, body, provenance, type_data).
    Generic,
    /// A Microsoft Teams incoming-webhook message card.
    Teams,
    /// A Slack incoming-webhook message.
    Slack,
}

impl WebhookFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Generic => "generic",
            Self::Teams => "teams",
            Self::Slack => "slack",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [Self::Generic, Self::Teams, Self::Slack]
            .into_iter()
            .find(|f| f.as_str() == text)
    }
}

/// An endpoint URL: https, or plain http to a loopback address (a local relay or a test).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WebhookUrl(String);

/// Longest endpoint URL accepted.
const MAX_URL_LEN: usize = 2048;

impl WebhookUrl {
    pub fn parse(text: &str) -> Result<Self, ContentError> {
        if text.len() > MAX_URL_LEN {
            return Err(ContentError::new(
                "endpoints",
                format!("longer than {MAX_URL_LEN} bytes"),
            ));
        }
        let url = url::Url::parse(text)
            .map_err(|e| ContentError::new("endpoints", format!("{text:?} is not a URL: {e}")))?;
        match url.scheme() {
            "https" => {}
            "http" if is_loopback(&url) => {}
            "http" => {
                return Err(ContentError::new(
                    "endpoints",
                    format!("{text:?}: plain http:// is only allowed to a loopback address"),
                ));
            }
            other => {
                return Err(ContentError::new(
                    "endpoints",
                    format!("{text:?}: scheme {other:?} is not https"),
                ));
            }
        }
        if !url.username().is_empty() || url.password().is_some() {
            // Credentials in a URL end up in logs and LastError; use the list secret instead.
            return Err(ContentError::new(
                "endpoints",
                "must not carry credentials (user:password@); use webhook_secret",
            ));
        }
        Ok(Self(url.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WebhookUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether the URL's host is this machine.
pub fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(domain)) => domain.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// Where a webhook list posts, in which format, and how it signs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookTarget {
    pub endpoints: Vec<WebhookUrl>,
    pub format: WebhookFormat,
    /// HMAC-SHA256 key for the `X-Outbox-Signature` header; `None` sends no signature.
    pub secret: Option<Secret>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_must_be_https_or_loopback_http_without_credentials() {
        for good in [
            "https://hooks.example.test/a?b=c",
            "http://127.0.0.1:8080/hook",
            "http://localhost/hook",
            "http://[::1]:9/x",
        ] {
            assert!(WebhookUrl::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "http://hooks.example.test/a",
            "ftp://x.test/",
            "not a url",
            "https://user:pw@x.test/",
        ] {
            assert_eq!(
                WebhookUrl::parse(bad).unwrap_err().field,
                "endpoints",
                "{bad}"
            );
        }
    }

    #[test]
    fn formats_round_trip() {
        for f in [
            WebhookFormat::Generic,
            WebhookFormat::Teams,
            WebhookFormat::Slack,
        ] {
            assert_eq!(WebhookFormat::parse(f.as_str()), Some(f));
        }
        assert_eq!(WebhookFormat::parse("discord"), None);
    }
}
