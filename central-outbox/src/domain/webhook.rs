//! Webhook targets: the endpoints a webhook list posts to, the payload format each expects, and
//! the optional signing secret. The HTTP side lives in `delivery::webhook`.
//!
//! An endpoint URL is itself a credential for the chat services (Slack, Teams and Discord keep
//! the webhook's secret in the path; some endpoints take a token in the query): whoever reads
//! it can post to the channel. [`cut_urls`] is what a reader who may not post is shown of it.
//!
//! A list with one endpoint may name fallback endpoints, in order: its providers for failover
//! (`domain::failover`). An attempt goes to one of them ([`WebhookTarget::via`]); each is
//! named by its scheme, host and port only ([`WebhookTarget::provider_names`]), since the rest
//! of the URL may be the credential.

use std::borrow::Cow;
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

    /// Where requests to this endpoint go: its scheme, host and port (the default port when
    /// none is written, so `https://h/` and `https://h:443/` are one receiver). `None` only for
    /// a value that no longer parses, which `parse` never builds.
    fn receiver(&self) -> Option<url::Origin> {
        url::Url::parse(&self.0).ok().map(|url| url.origin())
    }

    /// Its scheme, host and port as text (`https://h:443`): how history and errors name it,
    /// since the path and query may hold a credential.
    pub fn origin(&self) -> String {
        self.receiver()
            .map_or_else(|| "?".to_owned(), |o| o.ascii_serialization())
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

/// What replaces the part of a URL that is cut.
pub const CUT: &str = "/\u{2026}";

/// `text` with every `http://` and `https://` URL in it cut to its scheme, host and port: the
/// path, query and fragment become [`CUT`], user information is dropped. Works on free text
/// (an error message, a list of targets), where a URL runs to the next whitespace; punctuation
/// ending that run (`,` `;` `:` `.` `)` `]` `>` and quotes) is kept as the text's own. Text
/// without a URL comes back as it is.
pub fn cut_urls(text: &str) -> Cow<'_, str> {
    // ASCII lower-casing keeps every byte where it was, so positions found in `lower` are
    // positions (and char boundaries) in `text`.
    let lower = text.to_ascii_lowercase();
    let mut out = String::new();
    let mut copied = 0;
    let mut from = 0;
    while let Some(scheme_end) = next_url(&lower, from) {
        let run_end = text[scheme_end..]
            .find(char::is_whitespace)
            .map_or(text.len(), |i| scheme_end + i);
        let url_end = scheme_end
            + text[scheme_end..run_end]
                .trim_end_matches([',', ';', ':', '.', ')', ']', '>', '"', '\'', '!', '?'])
                .len();
        let url = &text[scheme_end..url_end];
        let authority_len = url.find(['/', '?', '#']).unwrap_or(url.len());
        let authority = &url[..authority_len];
        // `user:password@host`: the part before the last '@' is a credential too.
        let host_port = authority
            .rsplit_once('@')
            .map_or(authority, |(_, host)| host);
        out.push_str(&text[copied..scheme_end]);
        out.push_str(host_port);
        if authority_len < url.len() {
            out.push_str(CUT);
        }
        copied = url_end;
        from = url_end.max(scheme_end);
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

/// Where the next URL's `http://` or `https://` ends, at or after `from` in lower-cased text.
fn next_url(lower: &str, from: usize) -> Option<usize> {
    let rest = lower.get(from..)?;
    let at = rest.find("http")? + from;
    let after = &lower[at..];
    if after.starts_with("https://") {
        Some(at + "https://".len())
    } else if after.starts_with("http://") {
        Some(at + "http://".len())
    } else {
        // "http" in another word: look on after it.
        next_url(lower, at + "http".len())
    }
}

/// Most fallback endpoints one list may name: as many as an email channel's fallback relays
/// (`smtp_relay::MAX_FALLBACK_RELAYS`). Each costs up to `after_failures` failed attempts
/// before the next is tried, so a longer chain only delays delivery further.
pub const MAX_FALLBACK_URLS: usize = 4;

/// Where a webhook list posts, in which format, and how it signs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookTarget {
    pub endpoints: Vec<WebhookUrl>,
    /// Where attempts go instead of the one endpoint while it fails, in order (failover);
    /// empty for most lists. Never set beside more than one endpoint (`NotificationList::parse`).
    pub fallbacks: Vec<WebhookUrl>,
    pub format: WebhookFormat,
    /// HMAC-SHA256 key for the `X-Outbox-Signature` header; `None` sends no signature.
    pub secret: Option<Secret>,
}

impl WebhookTarget {
    /// Whether every one of `endpoints` goes to a receiver (scheme, host and port) that one of
    /// these endpoints (or fallbacks) goes to: paths may change, endpoints may be dropped or
    /// added beside the old ones, but no request goes anywhere new. Host names compare as the
    /// URL parser writes them (lower case); another spelling of the same address is another
    /// receiver.
    pub fn same_receivers<'a>(&self, endpoints: impl IntoIterator<Item = &'a WebhookUrl>) -> bool {
        let known: Vec<url::Origin> = self
            .endpoints
            .iter()
            .chain(&self.fallbacks)
            .filter_map(WebhookUrl::receiver)
            .collect();
        endpoints
            .into_iter()
            .all(|e| e.receiver().is_some_and(|r| known.contains(&r)))
    }

    /// How many providers failover chooses from: the endpoint and its fallbacks, or one (the
    /// whole set of endpoints) for a list without fallbacks.
    pub fn providers(&self) -> usize {
        1 + self.fallbacks.len()
    }

    /// The providers' names in order, for attempts' history, logs and the console: each URL's
    /// scheme, host and port (its path and query may hold the credential), with its place in
    /// the order added where two share one. Empty for a list without fallbacks: it has nothing
    /// to choose from.
    pub fn provider_names(&self) -> Vec<String> {
        if self.fallbacks.is_empty() {
            return Vec::new();
        }
        let origins: Vec<String> = self
            .endpoints
            .iter()
            .take(1)
            .chain(&self.fallbacks)
            .map(WebhookUrl::origin)
            .collect();
        origins
            .iter()
            .enumerate()
            .map(|(i, origin)| {
                if origins.iter().filter(|o| *o == origin).count() > 1 {
                    format!("{origin} #{}", i + 1)
                } else {
                    origin.clone()
                }
            })
            .collect()
    }

    /// The target an attempt at provider `index` posts to: this one for the first (or an index
    /// past the end: the order changed under the caller), else the one fallback alone.
    pub fn via(&self, index: usize) -> Self {
        match index.checked_sub(1).and_then(|i| self.fallbacks.get(i)) {
            Some(fallback) => Self {
                endpoints: vec![fallback.clone()],
                fallbacks: Vec::new(),
                format: self.format,
                secret: self.secret.clone(),
            },
            None => self.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(endpoints: &[&str]) -> WebhookTarget {
        WebhookTarget {
            endpoints: endpoints
                .iter()
                .map(|e| WebhookUrl::parse(e).unwrap())
                .collect(),
            fallbacks: Vec::new(),
            format: WebhookFormat::Generic,
            secret: Some(Secret::new("hook-secret-0123456789".into())),
        }
    }

    #[test]
    fn same_receivers_means_the_same_scheme_host_and_port() {
        let stored = target(&["https://hooks.plant.test/a", "http://127.0.0.1:8080/b"]);
        let same = |endpoints: &[&str]| stored.same_receivers(&target(endpoints).endpoints);
        let mut with_fallback = target(&["https://hooks.plant.test/a"]);
        with_fallback.fallbacks = target(&["https://backup.plant.test/a"]).endpoints;
        assert!(with_fallback.same_receivers(&target(&["https://backup.plant.test/b"]).endpoints));
        assert!(same(&["https://hooks.plant.test/other?x=1"]));
        assert!(same(&[
            "https://HOOKS.plant.test:443/a",
            "http://127.0.0.1:8080/c"
        ]));
        assert!(same(&["http://127.0.0.1:8080/b"]), "one dropped");
        for moved in [
            "https://hooks.elsewhere.test/a",
            "https://hooks.plant.test:8443/a",
            "https://127.0.0.1:8080/b",
            "http://127.0.0.1:8081/b",
            "http://localhost:8080/b",
        ] {
            assert!(!same(&[moved]), "{moved}");
            assert!(
                !same(&["https://hooks.plant.test/a", moved]),
                "{moved} added"
            );
        }
    }

    #[test]
    fn providers_are_named_by_origin_and_an_attempt_goes_to_one() {
        let mut t = target(&["https://hooks.slack.test/services/T0/B0/secret"]);
        assert!(
            t.provider_names().is_empty(),
            "no fallbacks: nothing to choose"
        );
        assert_eq!(t.providers(), 1);
        t.fallbacks = target(&[
            "http://127.0.0.1:8080/hook?token=abc",
            "https://hooks.slack.test/services/T1/B1/other",
        ])
        .endpoints;
        assert_eq!(
            t.provider_names(),
            [
                "https://hooks.slack.test #1",
                "http://127.0.0.1:8080",
                "https://hooks.slack.test #3"
            ]
        );
        assert_eq!(t.providers(), 3);
        assert_eq!(t.via(0), t);
        let second = t.via(1);
        assert_eq!(second.endpoints, t.fallbacks[..1]);
        assert!(second.fallbacks.is_empty());
        assert_eq!(second.secret, t.secret);
        assert_eq!(t.via(9), t, "past the end: the first");
    }

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
    fn urls_are_cut_to_scheme_host_and_port_wherever_they_are_in_the_text() {
        let cases = [
            (
                "https://hooks.slack.com/services/T0/B0/secret",
                "https://hooks.slack.com/\u{2026}",
            ),
            (
                "http://127.0.0.1:8080/hook?token=abc#frag",
                "http://127.0.0.1:8080/\u{2026}",
            ),
            ("https://[::1]:9/x", "https://[::1]:9/\u{2026}"),
            ("https://h.test", "https://h.test"),
            ("https://h.test?token=t", "https://h.test/\u{2026}"),
            ("HTTPS://H.test/Secret", "HTTPS://H.test/\u{2026}"),
            ("https://user:pw@h.test/p", "https://h.test/\u{2026}"),
            // Free text: LastError, attempt errors, ResolvedTargets.
            (
                "https://a.test/s1: HTTP 500: oops",
                "https://a.test/\u{2026}: HTTP 500: oops",
            ),
            (
                "1 of 2 webhook endpoints failed: https://a.test/s1: HTTP 404",
                "1 of 2 webhook endpoints failed: https://a.test/\u{2026}: HTTP 404",
            ),
            (
                "https://a.test/s1, https://b.test:8443/s2?q=1",
                "https://a.test/\u{2026}, https://b.test:8443/\u{2026}",
            ),
            (
                "error sending request (https://a.test/s1).",
                "error sending request (https://a.test/\u{2026}).",
            ),
            (
                "ops@plant.test, http-proxy said httpx",
                "ops@plant.test, http-proxy said httpx",
            ),
            ("", ""),
            ("https://", "https://"),
            (
                "päss https://ü.test/ä ok",
                "päss https://ü.test/\u{2026} ok",
            ),
        ];
        for (text, shown) in cases {
            assert_eq!(cut_urls(text), shown, "{text:?}");
        }
        assert!(matches!(cut_urls("no url here"), Cow::Borrowed(_)));
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
