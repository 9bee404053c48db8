//! Notification lists (who a notification goes to) and the channels' settings (how it gets
//! there: the email channel's relay and both channels' pacing and retries). All of them live in
//! the database, which is their authority, and are resolved at delivery time, so an operator's
//! edit applies to every notification not yet delivered. Every channel default is here, once
//! ([`defaults`]): the config file, the admin API and the dispatcher all take them from here.

use std::fmt;
use std::time::Duration;

use super::consolidation::Consolidation;
use super::escalation::EscalationPolicy;
use super::smtp_relay::SmtpRelay;
use super::webhook::{MAX_FALLBACK_URLS, WebhookFormat, WebhookTarget, WebhookUrl};
use super::{ContentError, ListName, NotificationType};

/// Every default a channel setting takes when the config file, the admin API or `outboxctl`
/// leaves it unset, and the values non-positive retry settings fall back to. One place, so the
/// file, the API and the dispatcher can never disagree on what "unset" means.
pub mod defaults {
    use std::time::Duration;

    use super::TlsMode;
    use crate::domain::retry::Backoff;

    /// Submission relays listen on 587 or 465, but an MTA on the same host takes 25: the port
    /// the system this replaces used.
    pub const SMTP_PORT: u16 = 25;
    /// Encrypted when the relay offers it, and refused when it does not: never silent plain text.
    pub const SMTP_TLS: TlsMode = TlsMode::StartTls;
    /// Retries after the first attempt, both channels (so 11 attempts); also what a
    /// non-positive `max_retries` falls back to.
    pub const MAX_RETRIES: u32 = 10;
    /// The wait before a retry (the first, with exponential backoff), both channels; also what
    /// a zero `retry_delay` falls back to. A minute, as the system this replaces waited.
    pub const RETRY_DELAY: Duration = Duration::from_secs(60);
    /// The longest exponential wait: an outage of hours is retried hourly, not daily.
    pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(3600);
    /// Email retries at a fixed interval, as the system this replaces did.
    pub const SMTP_BACKOFF: Backoff = Backoff::Fixed;
    /// Webhook receivers are many and independent, so their retries spread out.
    pub const WEBHOOK_BACKOFF: Backoff = Backoff::Exponential {
        cap: MAX_RETRY_DELAY,
    };
    /// SMTP sessions at once: what a typical relay allows one client without throttling.
    pub const SMTP_MAX_CONNECTIONS: u32 = 4;
    /// POSTs in flight at once: HTTP endpoints take more parallel work than a mail relay.
    pub const WEBHOOK_MAX_CONNECTIONS: u32 = 8;
    /// Connect and per-command timeout of an SMTP session (RFC 5321 suggests minutes per
    /// command; a relay that is slower than this is better retried).
    pub const SMTP_TIMEOUT: Duration = Duration::from_secs(30);
    /// One whole SMTP delivery: connect, auth and a transaction of a few commands.
    pub const SMTP_OVERALL_TIMEOUT: Duration = Duration::from_secs(120);
    /// One POST, connect to last byte: a chat webhook answers in well under a second.
    pub const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
}

/// A syntactically plausible mailbox address (`local@domain`). Deliberately simple: the relay is
/// the judge of deliverability; this only keeps garbage and header injection out of the store.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EmailAddress(String);

/// Longest address SMTP allows (RFC 5321 path limit minus the angle brackets).
const MAX_ADDRESS_LEN: usize = 254;

impl EmailAddress {
    pub fn parse(text: &str, field: &'static str) -> Result<Self, ContentError> {
        let bad = |why: &str| {
            ContentError::new(field, format!("{text:?} is not an email address: {why}"))
        };
        if text.len() > MAX_ADDRESS_LEN {
            return Err(ContentError::new(
                field,
                format!("address is longer than {MAX_ADDRESS_LEN} bytes"),
            ));
        }
        let (local, domain) = text.rsplit_once('@').ok_or_else(|| bad("no '@'"))?;
        if local.is_empty() || domain.is_empty() {
            return Err(bad("empty local part or domain"));
        }
        if text
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '<' | '>' | ',' | ';'))
        {
            return Err(bad("contains whitespace, control or separator characters"));
        }
        if domain.starts_with('.') || domain.ends_with('.') || domain.contains("..") {
            return Err(bad("malformed domain"));
        }
        Ok(Self(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn domain(&self) -> &str {
        self.0.rsplit_once('@').map_or("", |(_, d)| d)
    }
}

impl fmt::Display for EmailAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a list delivers: email recipients or webhook endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListTargets {
    Email(Vec<EmailAddress>),
    Webhook(WebhookTarget),
}

/// A named set of targets for one channel type. Resolved at delivery time, so an edit applies to
/// every notification not yet delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotificationList {
    pub name: ListName,
    pub targets: ListTargets,
    /// Flood consolidation (`domain::consolidation`); `None`: every notification goes out on
    /// its own.
    pub consolidation: Option<Consolidation>,
    /// Escalation until acknowledged (`domain::escalation`); `None`: its alarms open no
    /// incident.
    pub escalation: Option<EscalationPolicy>,
    /// The endpoint told every final status of its notifications (`domain::status_callback`);
    /// `None`: nobody is.
    pub status_callback: Option<WebhookUrl>,
}

/// Most recipients (or endpoints) one list may have: a list is a team, not a mailing campaign,
/// and every address goes into one message's BCC.
pub const MAX_LIST_RECIPIENTS: usize = 1000;

/// A list as an operator or the config file gives it, before checking. `Debug` hides the secret.
#[derive(Clone, Default)]
pub struct ListInput {
    pub name: String,
    pub kind: Option<NotificationType>,
    pub recipients: Vec<String>,
    pub endpoints: Vec<String>,
    /// Webhook lists with one endpoint: where attempts go while it fails, in order.
    pub fallback_urls: Vec<String>,
    pub webhook_format: Option<WebhookFormat>,
    /// Write-only HMAC key; `None` means "no signature".
    pub webhook_secret: Option<String>,
    /// Already checked by `Consolidation::parse`, where the input's form is known.
    pub consolidation: Option<Consolidation>,
    /// Already checked by `EscalationPolicy::parse`, likewise.
    pub escalation: Option<EscalationPolicy>,
    /// Any list: the status callback endpoint; `None` or empty: none.
    pub status_callback_url: Option<String>,
}

impl fmt::Debug for ListInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListInput")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("recipients", &self.recipients)
            .field("endpoints", &self.endpoints)
            .field("fallback_urls", &self.fallback_urls)
            .field("webhook_format", &self.webhook_format)
            .field(
                "webhook_secret",
                &self.webhook_secret.as_ref().map(|_| "***"),
            )
            .field("consolidation", &self.consolidation)
            .field("escalation", &self.escalation)
            .field("status_callback_url", &self.status_callback_url)
            .finish()
    }
}

impl NotificationList {
    pub fn kind(&self) -> NotificationType {
        match self.targets {
            ListTargets::Email(_) => NotificationType::Email,
            ListTargets::Webhook(_) => NotificationType::Webhook,
        }
    }

    /// Recipient addresses or endpoint URLs, as text (what ResolvedTargets snapshots).
    pub fn target_names(&self) -> Vec<String> {
        match &self.targets {
            ListTargets::Email(recipients) => recipients.iter().map(ToString::to_string).collect(),
            ListTargets::Webhook(target) => {
                target.endpoints.iter().map(ToString::to_string).collect()
            }
        }
    }

    /// Checks a list. An unset type means email. Errors name `name`, `recipients`, `endpoints`
    /// or `fallback_urls` (with the entry's position), `webhook_format`, `webhook_secret` or
    /// `status_callback_url`.
    pub fn parse(input: ListInput) -> Result<Self, ContentError> {
        let name = ListName::parse(input.name)?;
        let status_callback = input
            .status_callback_url
            .as_deref()
            .filter(|url| !url.is_empty())
            .map(|url| {
                WebhookUrl::parse(url)
                    .map_err(|e| ContentError::new("status_callback_url", e.problem))
            })
            .transpose()?;
        let bounded = |field: &'static str, items: &[String]| {
            if items.is_empty() {
                return Err(ContentError::new(field, "at least one is required"));
            }
            if items.len() > MAX_LIST_RECIPIENTS {
                return Err(ContentError::new(
                    field,
                    format!(
                        "{} given, at most {MAX_LIST_RECIPIENTS} allowed",
                        items.len()
                    ),
                ));
            }
            Ok(())
        };
        let targets = match input.kind.unwrap_or(NotificationType::Email) {
            NotificationType::Email => {
                if !input.endpoints.is_empty()
                    || !input.fallback_urls.is_empty()
                    || input.webhook_format.is_some()
                    || input.webhook_secret.is_some()
                {
                    return Err(ContentError::new(
                        "endpoints",
                        "webhook settings given for an email list",
                    ));
                }
                bounded("recipients", &input.recipients)?;
                let recipients = input
                    .recipients
                    .iter()
                    .enumerate()
                    .map(|(i, address)| {
                        EmailAddress::parse(address, "recipients").map_err(|e| {
                            ContentError::new(
                                "recipients",
                                format!("entry {}: {}", i + 1, e.problem),
                            )
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                ListTargets::Email(recipients)
            }
            NotificationType::Webhook => {
                if !input.recipients.is_empty() {
                    return Err(ContentError::new(
                        "recipients",
                        "a webhook list has endpoints, not recipients",
                    ));
                }
                bounded("endpoints", &input.endpoints)?;
                let endpoints = input
                    .endpoints
                    .iter()
                    .enumerate()
                    .map(|(i, url)| {
                        WebhookUrl::parse(url).map_err(|e| {
                            ContentError::new(
                                "endpoints",
                                format!("entry {}: {}", i + 1, e.problem),
                            )
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let fallbacks = fallback_urls(&endpoints, &input.fallback_urls)?;
                let secret = match input.webhook_secret {
                    Some(secret) if secret.len() < 16 => {
                        return Err(ContentError::new(
                            "webhook_secret",
                            "must be at least 16 characters (it keys an HMAC-SHA256 signature)",
                        ));
                    }
                    secret => secret.map(Secret::new),
                };
                ListTargets::Webhook(WebhookTarget {
                    endpoints,
                    fallbacks,
                    format: input.webhook_format.unwrap_or(WebhookFormat::Generic),
                    secret,
                })
            }
        };
        Ok(Self {
            name,
            targets,
            consolidation: input.consolidation,
            escalation: input.escalation,
            status_callback,
        })
    }
}

/// A webhook list's fallback endpoints, checked as its endpoints are (`WebhookUrl::parse`):
/// at most [`MAX_FALLBACK_URLS`], only beside exactly one endpoint (with several, every one is
/// posted to and none is the one a fallback stands in for), and none the endpoint itself or
/// another fallback again (it would be the same provider twice). Errors name `fallback_urls`.
fn fallback_urls(
    endpoints: &[WebhookUrl],
    given: &[String],
) -> Result<Vec<WebhookUrl>, ContentError> {
    const FIELD: &str = "fallback_urls";
    if given.is_empty() {
        return Ok(Vec::new());
    }
    if given.len() > MAX_FALLBACK_URLS {
        return Err(ContentError::new(
            FIELD,
            format!("{} given, at most {MAX_FALLBACK_URLS} allowed", given.len()),
        ));
    }
    if endpoints.len() != 1 {
        return Err(ContentError::new(
            FIELD,
            format!(
                "a list with fallback URLs has exactly one endpoint (the one they stand in \
                 for), not {}",
                endpoints.len()
            ),
        ));
    }
    let mut fallbacks: Vec<WebhookUrl> = Vec::with_capacity(given.len());
    for (i, url) in given.iter().enumerate() {
        let url = WebhookUrl::parse(url)
            .map_err(|e| ContentError::new(FIELD, format!("entry {}: {}", i + 1, e.problem)))?;
        if endpoints.contains(&url) || fallbacks.contains(&url) {
            return Err(ContentError::new(
                FIELD,
                format!(
                    "entry {}: {url} is already the endpoint or an earlier fallback",
                    i + 1
                ),
            ));
        }
        fallbacks.push(url);
    }
    Ok(fallbacks)
}

impl NotificationList {
    /// This list, changed with its signing secret left out (the admin API's and the console's
    /// "keep the stored one"), with `current`'s secret. Nobody can read a stored secret back, so
    /// keeping one must not let anybody have it used somewhere else: it is kept only while every
    /// endpoint goes to a receiver (scheme, host and port) the stored endpoints went to
    /// ([`WebhookTarget::same_receivers`]); with the endpoints moved elsewhere it must be given
    /// again, or removed (an empty secret), as the SMTP password must when the relay moves
    /// ([`SmtpAuthChange::resolve`]). Signed requests at a host of an admin's choosing would let
    /// that host test guesses of the secret at leisure, and carry signatures the real receivers
    /// accept. The error names `webhook_secret`.
    pub fn keeping_secret_of(
        mut self,
        current: Option<&NotificationList>,
    ) -> Result<Self, ContentError> {
        let stored = match current.map(|c| &c.targets) {
            Some(ListTargets::Webhook(stored)) if stored.secret.is_some() => stored,
            _ => return Ok(self),
        };
        let ListTargets::Webhook(target) = &mut self.targets else {
            return Ok(self);
        };
        if target.secret.is_some() {
            return Ok(self);
        }
        if !stored.same_receivers(target.endpoints.iter().chain(&target.fallbacks)) {
            return Err(ContentError::new(
                "webhook_secret",
                "must be given again (or removed with an empty value) when the endpoints or \
                 fallback URLs move to another host, port or scheme: the stored secret signs \
                 only for the receivers it was given for",
            ));
        }
        target.secret.clone_from(&stored.secret);
        Ok(self)
    }
}

/// A stored configuration value and when it was last written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored<T> {
    pub value: T,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// A credential that must never be shown: `Debug` prints a placeholder and there is no
/// `Display`, so neither a log line nor an error message can carry one by accident. At rest it is
/// sealed by the store (see `crate::secrets`); the clear value lives only in memory.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    /// The only way to the value: call sites that need it are easy to find and review.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// How the SMTP connection is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain text. Only for a relay on the same host or a trusted segment.
    None,
    /// Connect in plain text and require the STARTTLS upgrade; fail if the server lacks it.
    StartTls,
    /// TLS from the first byte (usually port 465).
    Implicit,
}

impl TlsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::StartTls => "starttls",
            Self::Implicit => "tls",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "none" => Some(Self::None),
            "starttls" => Some(Self::StartTls),
            "tls" => Some(Self::Implicit),
            _ => None,
        }
    }
}

/// SMTP authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SmtpAuth {
    None,
    /// PLAIN or LOGIN, whichever the server offers.
    Password {
        username: String,
        password: Secret,
    },
    /// XOAUTH2 with an access token from an OAuth2 client-credentials grant, fetched and cached
    /// until shortly before it expires.
    XOAuth2 {
        username: String,
        oauth: OAuthClientCredentials,
    },
}

impl SmtpAuth {
    pub fn mechanism(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Password { .. } => "password",
            Self::XOAuth2 { .. } => "xoauth2",
        }
    }
}

/// SMTP authentication as a change asks for it (the admin API, the console's form): a secret
/// left out (`None`) asks to keep the stored one. [`Self::resolve`] decides whether it may be
/// kept, the one rule every way of changing the settings shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SmtpAuthChange {
    None,
    Password {
        username: String,
        password: Option<Secret>,
    },
    XOAuth2 {
        username: String,
        token_url: String,
        client_id: String,
        client_secret: Option<Secret>,
        scope: String,
    },
}

/// Where the credentials of the email channel go: the relay (which sees the password, or the
/// OAuth access token) and how the connection to it is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relay<'a> {
    pub host: &'a str,
    pub port: u16,
    pub tls: TlsMode,
}

impl Relay<'_> {
    /// Host names compare without regard to case (DNS does); any other difference, even
    /// another spelling of the same address, is a move.
    fn same_as(&self, stored: &SmtpSettings) -> bool {
        self.host.eq_ignore_ascii_case(&stored.host)
            && self.port == stored.port
            && self.tls == stored.tls
    }
}

impl SmtpAuthChange {
    /// The authentication to store for `relay`, given what is stored now. Nobody can read a
    /// stored secret back (not even an admin), so keeping one must not let anybody send it
    /// somewhere else: a secret left out is kept only for the same identity (username, or
    /// OAuth client) going to the same place as before. A password goes to the relay, so a
    /// change of host, port or TLS mode needs it again; a client secret goes to the token
    /// endpoint, and the tokens it yields to the relay, so a change of the token URL, host,
    /// port or TLS mode needs it again. Errors name `password` or `oauth_client_secret`.
    pub fn resolve(
        self,
        relay: Relay<'_>,
        current: Option<&SmtpSettings>,
    ) -> Result<SmtpAuth, ContentError> {
        let same_relay = current.is_some_and(|c| relay.same_as(c));
        match self {
            Self::None => Ok(SmtpAuth::None),
            Self::Password {
                username,
                password: Some(password),
            } => Ok(SmtpAuth::Password { username, password }),
            Self::Password {
                username,
                password: None,
            } => {
                let stored = match current.map(|c| &c.auth) {
                    Some(SmtpAuth::Password {
                        username: u,
                        password,
                    }) if *u == username => password.clone(),
                    _ => {
                        return Err(ContentError::new(
                            "password",
                            "required when setting a username (or changing it)",
                        ));
                    }
                };
                if !same_relay {
                    return Err(ContentError::new(
                        "password",
                        "must be given again when host, port or TLS mode change: the stored \
                         password is sent only to the relay it was given for",
                    ));
                }
                Ok(SmtpAuth::Password {
                    username,
                    password: stored,
                })
            }
            Self::XOAuth2 {
                username,
                token_url,
                client_id,
                client_secret,
                scope,
            } => {
                let client_secret = match client_secret {
                    Some(secret) => secret,
                    None => {
                        let stored = match current.map(|c| &c.auth) {
                            Some(SmtpAuth::XOAuth2 { oauth, .. })
                                if oauth.client_id == client_id =>
                            {
                                oauth
                            }
                            _ => {
                                return Err(ContentError::new(
                                    "oauth_client_secret",
                                    "required when setting (or changing) the OAuth client",
                                ));
                            }
                        };
                        if stored.token_url != token_url || !same_relay {
                            return Err(ContentError::new(
                                "oauth_client_secret",
                                "must be given again when the OAuth token URL, host, port or \
                                 TLS mode change: the stored client secret is sent only to the \
                                 token endpoint it was given for, and its tokens only to the \
                                 relay they were for",
                            ));
                        }
                        stored.client_secret.clone()
                    }
                };
                Ok(SmtpAuth::XOAuth2 {
                    username,
                    oauth: OAuthClientCredentials {
                        token_url,
                        client_id,
                        client_secret,
                        scope,
                    },
                })
            }
        }
    }
}

/// Whether `host` (an SMTP relay's host setting) is this machine: a loopback address
/// (127.0.0.0/8, ::1) or `localhost`.
pub fn is_loopback_host(host: &str) -> bool {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => bare.eq_ignore_ascii_case("localhost"),
    }
}

/// An OAuth2 client-credentials grant (RFC 6749 §4.4) at `token_url`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OAuthClientCredentials {
    pub token_url: String,
    pub client_id: String,
    pub client_secret: Secret,
    /// Space-separated scopes; empty for none.
    pub scope: String,
}

/// The bounds of every channel setting, with why. A value outside them is refused with the
/// field named, by [`DeliveryPolicy::check`], [`SmtpSettings::check`] and
/// [`WebhookSettings::check`], which the config file, the admin API (and through it the console
/// and `outboxctl`) all go through. A value stored before a bound existed is brought inside it
/// when read ([`RateLimit::stored`], [`super::retry::RetryPolicy::clamped`]), so no stored value
/// can stop a channel.
pub mod bounds {
    use std::time::Duration;

    /// The slowest rate limit: one delivery every 1,000 s (about 17 minutes). Slower than
    /// that is not a rate limit but a channel switched off, which would leave its rows waiting
    /// with nobody told; and the wait for the next token must stay a plain number of seconds.
    pub const MIN_RATE_PER_SECOND: f64 = 0.001;
    /// The fastest: far above what one relay or endpoint takes, and below what the token
    /// bucket's arithmetic keeps exact.
    pub const MAX_RATE_PER_SECOND: f64 = 100_000.0;
    /// The largest burst: a bucket is a short allowance above the rate, not a backlog.
    pub const MAX_BURST: u32 = 100_000;
    /// Most retries after the first attempt. With the longest delay that is months of trying;
    /// more would only hide a notification that can never be delivered from the parked count.
    pub const MAX_RETRIES: i64 = 1_000;
    /// The longest wait before a retry (and the longest exponential cap, and the longest wait a
    /// server's Retry-After can impose): a day. Longer waits keep an alarm out of sight for
    /// more than a day without it being parked, and far-future times overflow the stores'
    /// timestamps (MS SQL's `datetime2` ends at year 9999).
    pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(24 * 3600);
    /// The longest SMTP command timeout and webhook POST timeout: a relay or endpoint slower
    /// than this is better retried.
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);
    /// The longest whole SMTP delivery (an attempt is also cut at half the claim timeout).
    pub const MAX_OVERALL_TIMEOUT: Duration = Duration::from_secs(3600);
    /// Every duration setting is a whole number of these: both stores keep milliseconds, so a
    /// finer value would be stored as something else than what was accepted (a timeout of a
    /// microsecond would read back as zero).
    pub const DURATION_RESOLUTION: Duration = Duration::from_millis(1);
}

/// A token bucket: `per_second` deliveries on average, up to `burst` at once. Built only
/// through [`RateLimit::parse`] (new values, checked) or [`RateLimit::stored`] (values read
/// back, brought within [`bounds`]), so every bucket's numbers are within the bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    per_second: f64,
    burst: u32,
}

impl Eq for RateLimit {}

impl RateLimit {
    /// The one parse path of a rate limit, for the config file and the admin API alike: no
    /// rate is no limit (and a burst without a rate is refused: it is an allowance above a
    /// rate); a rate within [`bounds`]; a burst of 1 to [`bounds::MAX_BURST`], or one
    /// second's worth (at least one) when none is given. Errors name the field.
    pub fn parse(
        per_second: Option<f64>,
        burst: Option<u32>,
    ) -> Result<Option<Self>, ContentError> {
        let Some(per_second) = per_second else {
            return match burst {
                None => Ok(None),
                Some(_) => Err(ContentError::new(
                    "rate_limit_burst",
                    "needs rate_limit_per_second too (the burst is an allowance above a rate)",
                )),
            };
        };
        if !(bounds::MIN_RATE_PER_SECOND..=bounds::MAX_RATE_PER_SECOND).contains(&per_second) {
            return Err(ContentError::new(
                "rate_limit_per_second",
                format!(
                    "must be between {} and {} (leave it unset for no limit)",
                    bounds::MIN_RATE_PER_SECOND,
                    bounds::MAX_RATE_PER_SECOND
                ),
            ));
        }
        let burst = match burst {
            Some(burst) if !(1..=bounds::MAX_BURST).contains(&burst) => {
                return Err(ContentError::new(
                    "rate_limit_burst",
                    format!("must be between 1 and {}", bounds::MAX_BURST),
                ));
            }
            Some(burst) => burst,
            None => Self::one_seconds_worth(per_second),
        };
        Ok(Some(Self { per_second, burst }))
    }

    /// A rate limit as stored, brought within [`bounds`] (a value stored before the bounds
    /// existed, or written around the admin API), so that it paces instead of stopping the
    /// channel. Returns whether it had to be changed, for the caller to warn.
    pub fn stored(per_second: f64, burst: Option<u32>) -> (Self, bool) {
        let rate = if per_second.is_nan() {
            bounds::MIN_RATE_PER_SECOND
        } else {
            per_second.clamp(bounds::MIN_RATE_PER_SECOND, bounds::MAX_RATE_PER_SECOND)
        };
        let changed =
            rate != per_second || burst.is_some_and(|b| !(1..=bounds::MAX_BURST).contains(&b));
        let burst = burst.filter(|&b| b > 0).map_or_else(
            || Self::one_seconds_worth(rate),
            |b| b.min(bounds::MAX_BURST),
        );
        (
            Self {
                per_second: rate,
                burst,
            },
            changed,
        )
    }

    pub fn per_second(&self) -> f64 {
        self.per_second
    }

    pub fn burst(&self) -> u32 {
        self.burst
    }

    fn one_seconds_worth(per_second: f64) -> u32 {
        // Within the bounds, so the cast cannot saturate.
        per_second.ceil().clamp(1.0, f64::from(bounds::MAX_BURST)) as u32
    }
}

/// How a channel paces and retries its deliveries (one per channel).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryPolicy {
    /// Raw configured values; [`super::retry::RetryPolicy::clamped`] makes them safe.
    pub max_retries: i64,
    pub retry_delay: Duration,
    pub backoff: super::retry::Backoff,
    /// Most deliveries in flight at once (for email: SMTP sessions).
    pub max_concurrent_connections: u32,
    pub rate_limit: Option<RateLimit>,
}

/// Most deliveries one channel may have in flight.
pub const MAX_CONCURRENT_DELIVERIES: u32 = 256;

impl DeliveryPolicy {
    /// The retry policy these settings describe, and a warning per clamped value.
    pub fn retry_policy(&self) -> (super::retry::RetryPolicy, Vec<String>) {
        super::retry::RetryPolicy::clamped(self.max_retries, self.retry_delay, self.backoff)
    }

    fn check(&self) -> Result<(), ContentError> {
        if self.max_concurrent_connections == 0
            || self.max_concurrent_connections > MAX_CONCURRENT_DELIVERIES
        {
            return Err(ContentError::new(
                "max_concurrent_connections",
                format!("must be between 1 and {MAX_CONCURRENT_DELIVERIES}"),
            ));
        }
        // Non-positive retry settings are clamped with a warning (a typo still retries); too
        // large ones are refused.
        if self.max_retries > bounds::MAX_RETRIES {
            return Err(ContentError::new(
                "max_retries",
                format!("must be at most {}", bounds::MAX_RETRIES),
            ));
        }
        check_at_most("retry_delay", self.retry_delay, bounds::MAX_RETRY_DELAY)?;
        if let Some(cap) = self.backoff.cap() {
            check_at_most("max_retry_delay", cap, bounds::MAX_RETRY_DELAY)?;
        }
        // A rate limit is built by `RateLimit::parse` (checked) or `RateLimit::stored`
        // (clamped): within the bounds by construction.
        Ok(())
    }
}

/// Everything the email adapter needs to reach the relay, plus the channel's delivery policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmtpSettings {
    pub host: String,
    pub port: u16,
    pub tls: TlsMode,
    pub auth: SmtpAuth,
    pub from_address: EmailAddress,
    /// Connect and per-command timeout.
    pub timeout: Duration,
    /// Longest one whole delivery (connect, auth, the transaction) may take.
    pub overall_timeout: Duration,
    pub policy: DeliveryPolicy,
    /// Where mail goes while the relay above is down, in order, reached without authentication
    /// (see [`super::smtp_relay`]); empty: nowhere else.
    pub fallback_relays: Vec<SmtpRelay>,
}

impl SmtpSettings {
    /// The relays this channel can use: the settings' own, then each fallback.
    pub fn relays(&self) -> usize {
        1 + self.fallback_relays.len()
    }

    /// How attempts and logs name relay `index` (0: the settings' own): `host:port`
    /// (`[addr]:port` for an IPv6 address).
    pub fn relay_name(&self, index: usize) -> String {
        match index
            .checked_sub(1)
            .and_then(|i| self.fallback_relays.get(i))
        {
            Some(relay) => super::smtp_relay::address(relay.host(), relay.port()),
            None => super::smtp_relay::address(&self.host, self.port),
        }
    }

    /// The settings an attempt at relay `index` uses: these for the first (or an index past the
    /// end), else the fallback's host, port and TLS mode with no authentication.
    pub fn via(&self, index: usize) -> Self {
        match index
            .checked_sub(1)
            .and_then(|i| self.fallback_relays.get(i))
        {
            Some(relay) => Self {
                host: relay.host().to_owned(),
                port: relay.port(),
                tls: relay.tls(),
                auth: SmtpAuth::None,
                ..self.clone()
            },
            None => self.clone(),
        }
    }

    /// Checks the values no delivery could work without; errors name the field. Retry settings
    /// are not refused: [`super::retry::RetryPolicy::clamped`] turns non-positive ones into
    /// 10 retries / 1 min with a warning, so a typo still retries instead of parking at once.
    pub fn check(self) -> Result<Self, ContentError> {
        if self.host.trim().is_empty() {
            return Err(ContentError::new("host", "must not be empty"));
        }
        if self.host.len() > 253
            || self
                .host
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(ContentError::new("host", "is not a host name or address"));
        }
        if self.port == 0 {
            return Err(ContentError::new("port", "must be between 1 and 65535"));
        }
        // Credentials in clear are readable on every hop to the relay; on this host there is
        // no hop (a local MTA, or a test's sink).
        if self.tls == TlsMode::None && self.auth != SmtpAuth::None && !is_loopback_host(&self.host)
        {
            return Err(ContentError::new(
                "tls",
                format!(
                    "none would send the {} in clear to {:?}: authentication without TLS is \
                     allowed only to a loopback host (127.0.0.1, ::1 or localhost); use \
                     starttls or tls",
                    match self.auth {
                        SmtpAuth::XOAuth2 { .. } => "OAuth access token",
                        _ => "password",
                    },
                    self.host
                ),
            ));
        }
        match &self.auth {
            SmtpAuth::None => {}
            SmtpAuth::Password { username, password } => {
                check_username(username)?;
                if password.expose().is_empty() {
                    return Err(ContentError::new("password", "must not be empty"));
                }
            }
            SmtpAuth::XOAuth2 { username, oauth } => {
                check_username(username)?;
                let url = url::Url::parse(&oauth.token_url).map_err(|e| {
                    ContentError::new("oauth_token_url", format!("is not a URL: {e}"))
                })?;
                if !matches!(url.scheme(), "https" | "http") {
                    return Err(ContentError::new(
                        "oauth_token_url",
                        "must be an https:// (or http:// on loopback) URL",
                    ));
                }
                if url.scheme() == "http" && !super::webhook::is_loopback(&url) {
                    return Err(ContentError::new(
                        "oauth_token_url",
                        "plain http:// is only allowed to a loopback address",
                    ));
                }
                if oauth.client_id.is_empty() {
                    return Err(ContentError::new("oauth_client_id", "must not be empty"));
                }
                if oauth.client_secret.expose().is_empty() {
                    return Err(ContentError::new(
                        "oauth_client_secret",
                        "must not be empty",
                    ));
                }
            }
        }
        if self.timeout.is_zero() {
            return Err(ContentError::new("timeout", "must be positive"));
        }
        check_at_most("timeout", self.timeout, bounds::MAX_TIMEOUT)?;
        check_at_most(
            "overall_timeout",
            self.overall_timeout,
            bounds::MAX_OVERALL_TIMEOUT,
        )?;
        if self.overall_timeout < self.timeout {
            return Err(ContentError::new(
                "overall_timeout",
                "must be at least the per-command timeout",
            ));
        }
        self.policy.check()?;
        super::smtp_relay::check_count(self.fallback_relays.len())?;
        Ok(self)
    }
}

/// Refuses a duration above its bound, naming the field and the bound in seconds, or finer than
/// a millisecond ([`bounds::DURATION_RESOLUTION`]).
fn check_at_most(field: &'static str, value: Duration, max: Duration) -> Result<(), ContentError> {
    if value > max {
        return Err(ContentError::new(
            field,
            format!("must be at most {}s", max.as_secs()),
        ));
    }
    if !value
        .subsec_nanos()
        .is_multiple_of(bounds::DURATION_RESOLUTION.subsec_nanos())
    {
        return Err(ContentError::new(
            field,
            format!(
                "must be a whole number of milliseconds (the settings are stored in \
                 milliseconds), not {value:?}"
            ),
        ));
    }
    Ok(())
}

fn check_username(username: &str) -> Result<(), ContentError> {
    if username.trim().is_empty() || username.len() > 256 {
        return Err(ContentError::new("username", "must be 1 to 256 characters"));
    }
    Ok(())
}

/// The webhook channel's settings: stored in the database (the `webhook` channel row), seeded
/// from the config file's `[webhook]` section, changed through the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSettings {
    /// Longest one POST (connect to last byte) may take.
    pub timeout: Duration,
    pub policy: DeliveryPolicy,
}

impl Default for WebhookSettings {
    /// What the webhook channel delivers with while nothing is stored.
    fn default() -> Self {
        Self {
            timeout: defaults::WEBHOOK_TIMEOUT,
            policy: DeliveryPolicy {
                max_retries: i64::from(defaults::MAX_RETRIES),
                retry_delay: defaults::RETRY_DELAY,
                backoff: defaults::WEBHOOK_BACKOFF,
                max_concurrent_connections: defaults::WEBHOOK_MAX_CONNECTIONS,
                rate_limit: None,
            },
        }
    }
}

impl WebhookSettings {
    pub fn check(self) -> Result<Self, ContentError> {
        if self.timeout.is_zero() {
            return Err(ContentError::new("timeout", "must be positive"));
        }
        check_at_most("timeout", self.timeout, bounds::MAX_TIMEOUT)?;
        self.policy.check()?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_checked_and_name_the_field() {
        assert!(EmailAddress::parse("ops@example.test", "recipients").is_ok());
        for bad in [
            "",
            "no-at",
            "@x.test",
            "a@",
            "a b@x.test",
            "a@x..test",
            "a@x.test\r\nBcc: y",
        ] {
            let err = EmailAddress::parse(bad, "recipients").unwrap_err();
            assert_eq!(err.field, "recipients", "{bad:?}");
        }
        assert_eq!(
            EmailAddress::parse("ops@plant.example.test", "f")
                .unwrap()
                .domain(),
            "plant.example.test"
        );
    }

    fn password_settings(host: &str, tls: TlsMode) -> SmtpSettings {
        SmtpSettings {
            host: host.into(),
            port: 587,
            tls,
            auth: SmtpAuth::Password {
                username: "outbox".into(),
                password: Secret::new("stored-password".into()),
            },
            from_address: EmailAddress::parse("outbox@plant.test", "from_address").unwrap(),
            timeout: defaults::SMTP_TIMEOUT,
            overall_timeout: defaults::SMTP_OVERALL_TIMEOUT,
            policy: WebhookSettings::default().policy,
            fallback_relays: vec![],
        }
    }

    #[test]
    fn a_fallback_relay_gets_the_settings_but_never_the_credentials() {
        let mut settings = password_settings("relay.plant.test", TlsMode::StartTls);
        settings.fallback_relays =
            super::super::smtp_relay::SmtpRelay::parse_list("relay2.plant.test:25 none").unwrap();
        assert_eq!(settings.relays(), 2);
        assert_eq!(settings.relay_name(0), "relay.plant.test:587");
        assert_eq!(settings.relay_name(1), "relay2.plant.test:25");
        assert_eq!(settings.via(0), settings);
        let fallback = settings.via(1);
        assert_eq!(
            (fallback.host.as_str(), fallback.port, fallback.tls),
            ("relay2.plant.test", 25, TlsMode::None)
        );
        assert_eq!(fallback.auth, SmtpAuth::None);
        assert_eq!(fallback.from_address, settings.from_address);
        assert_eq!(fallback.policy, settings.policy);
        // Past the end: the first relay's settings, never a panic.
        assert_eq!(settings.via(7), settings);
    }

    #[test]
    fn a_left_out_password_is_kept_only_for_the_same_user_and_relay() {
        let stored = password_settings("Relay.Plant.Test", TlsMode::StartTls);
        let keep = SmtpAuthChange::Password {
            username: "outbox".into(),
            password: None,
        };
        let relay = Relay {
            host: "relay.plant.test",
            port: 587,
            tls: TlsMode::StartTls,
        };
        assert_eq!(
            keep.clone().resolve(relay, Some(&stored)).unwrap(),
            stored.auth
        );
        for moved in [
            Relay {
                host: "relay.elsewhere.test",
                ..relay
            },
            Relay { port: 25, ..relay },
            Relay {
                tls: TlsMode::Implicit,
                ..relay
            },
        ] {
            let err = keep.clone().resolve(moved, Some(&stored)).unwrap_err();
            assert_eq!(err.field, "password", "{moved:?}");
            assert!(err.problem.contains("must be given again"), "{err}");
        }
        let other_user = SmtpAuthChange::Password {
            username: "someone-else".into(),
            password: None,
        };
        assert_eq!(
            other_user.resolve(relay, Some(&stored)).unwrap_err().field,
            "password"
        );
        assert_eq!(keep.resolve(relay, None).unwrap_err().field, "password");
        // Given again, it may go anywhere.
        let given = SmtpAuthChange::Password {
            username: "outbox".into(),
            password: Some(Secret::new("new".into())),
        };
        let moved = Relay {
            host: "relay.elsewhere.test",
            ..relay
        };
        assert!(given.resolve(moved, Some(&stored)).is_ok());
    }

    #[test]
    fn a_left_out_client_secret_is_kept_only_for_the_same_client_endpoint_and_relay() {
        let mut stored = password_settings("relay.plant.test", TlsMode::StartTls);
        stored.auth = SmtpAuth::XOAuth2 {
            username: "outbox".into(),
            oauth: OAuthClientCredentials {
                token_url: "https://login.plant.test/token".into(),
                client_id: "client".into(),
                client_secret: Secret::new("client-secret".into()),
                scope: String::new(),
            },
        };
        let keep = |token_url: &str, client_id: &str| SmtpAuthChange::XOAuth2 {
            username: "outbox".into(),
            token_url: token_url.into(),
            client_id: client_id.into(),
            client_secret: None,
            scope: "more".into(),
        };
        let relay = Relay {
            host: "relay.plant.test",
            port: 587,
            tls: TlsMode::StartTls,
        };
        let kept = keep("https://login.plant.test/token", "client")
            .resolve(relay, Some(&stored))
            .unwrap();
        let SmtpAuth::XOAuth2 { oauth, .. } = kept else {
            panic!("{kept:?}")
        };
        assert_eq!(oauth.client_secret.expose(), "client-secret");
        assert_eq!(oauth.scope, "more");
        for (change, relay) in [
            (keep("https://login.elsewhere.test/token", "client"), relay),
            (keep("https://login.plant.test/token", "other"), relay),
            (
                keep("https://login.plant.test/token", "client"),
                Relay { port: 25, ..relay },
            ),
        ] {
            let err = change.resolve(relay, Some(&stored)).unwrap_err();
            assert_eq!(err.field, "oauth_client_secret", "{err}");
        }
    }

    #[test]
    fn credentials_go_in_clear_only_to_a_loopback_host() {
        for host in [
            "127.0.0.1",
            "127.0.0.2",
            "::1",
            "[::1]",
            "localhost",
            "LOCALHOST",
        ] {
            assert!(
                password_settings(host, TlsMode::None).check().is_ok(),
                "{host}"
            );
        }
        for host in [
            "relay.plant.test",
            "10.0.0.5",
            "localhost.evil.test",
            "::ffff:10.0.0.1",
        ] {
            let err = password_settings(host, TlsMode::None).check().unwrap_err();
            assert_eq!(err.field, "tls", "{host}");
            assert!(err.problem.contains("loopback"), "{err}");
        }
        // With TLS, or without credentials, any host.
        assert!(
            password_settings("relay.plant.test", TlsMode::StartTls)
                .check()
                .is_ok()
        );
        let mut anonymous = password_settings("relay.plant.test", TlsMode::None);
        anonymous.auth = SmtpAuth::None;
        assert!(anonymous.check().is_ok());
    }

    fn hooks(endpoints: &[&str], fallbacks: &[&str]) -> ListInput {
        ListInput {
            name: "hooks".into(),
            kind: Some(NotificationType::Webhook),
            endpoints: endpoints.iter().map(|e| (*e).to_owned()).collect(),
            fallback_urls: fallbacks.iter().map(|e| (*e).to_owned()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn fallback_urls_follow_the_endpoint_rules_and_stand_in_for_one_endpoint() {
        let list = NotificationList::parse(hooks(
            &["https://h.test/a"],
            &["https://backup.test/a", "http://127.0.0.1:9/b"],
        ))
        .unwrap();
        let ListTargets::Webhook(target) = &list.targets else {
            panic!("{list:?}");
        };
        assert_eq!(target.fallbacks.len(), 2);
        assert_eq!(
            list.target_names(),
            ["https://h.test/a"],
            "fallbacks are not targets"
        );
        let fails = |input: ListInput, needle: &str| {
            let err = NotificationList::parse(input).unwrap_err();
            assert_eq!(err.field, "fallback_urls", "{err}");
            assert!(err.problem.contains(needle), "{err}");
        };
        fails(
            hooks(&["https://h.test/a"], &["http://backup.test/a"]),
            "entry 1: ",
        );
        fails(
            hooks(
                &["https://h.test/a"],
                &["https://b.test/", "https://u:p@c.test/"],
            ),
            "entry 2: must not carry credentials",
        );
        fails(
            hooks(
                &["https://h.test/a", "https://i.test/"],
                &["https://b.test/"],
            ),
            "exactly one endpoint",
        );
        fails(
            hooks(&["https://h.test/a"], &["https://h.test/a"]),
            "already the endpoint",
        );
        fails(
            hooks(
                &["https://h.test/a"],
                &["https://b.test/"; MAX_FALLBACK_URLS + 1],
            ),
            "at most 4",
        );
        // At the limits: four URLs of the longest length an endpoint may have are taken, one
        // byte more is refused naming the entry, and so is what no endpoint may be; a control
        // character is taken exactly when an endpoint would take it.
        let longest = |c: char| format!("https://{c}.test/{}", "p".repeat(2048 - 15));
        let four: Vec<String> = ['a', 'b', 'c', 'd'].map(longest).to_vec();
        assert_eq!(four[0].len(), 2048);
        let four: Vec<&str> = four.iter().map(String::as_str).collect();
        assert!(NotificationList::parse(hooks(&["https://h.test/a"], &four)).is_ok());
        let over = format!("{}p", longest('e'));
        fails(
            hooks(&["https://h.test/a"], &["https://b.test/", &over]),
            "entry 2: longer than 2048 bytes",
        );
        for bad in ["https://b .test/", "", "https://b.test:99999/"] {
            fails(hooks(&["https://h.test/a"], &[bad]), "entry 1: ");
        }
        for control in [
            "https://b.test/\u{0}",
            "https://b.test/\t",
            "https://b.test/\u{7f}",
        ] {
            assert_eq!(
                NotificationList::parse(hooks(&["https://h.test/a"], &[control])).is_ok(),
                WebhookUrl::parse(control).is_ok(),
                "{control:?}"
            );
        }
        let mut email = hooks(&[], &["https://b.test/"]);
        email.kind = Some(NotificationType::Email);
        email.recipients = vec!["ops@plant.test".into()];
        assert_eq!(
            NotificationList::parse(email).unwrap_err().field,
            "endpoints"
        );
    }

    #[test]
    fn a_kept_secret_never_signs_for_a_fallback_on_a_new_receiver() {
        let mut stored = hooks(&["https://h.test/a"], &["https://backup.test/a"]);
        stored.webhook_secret = Some("hook-secret-0123456789".into());
        let stored = NotificationList::parse(stored).unwrap();
        let kept =
            NotificationList::parse(hooks(&["https://h.test/b"], &["https://backup.test/c"]))
                .unwrap()
                .keeping_secret_of(Some(&stored))
                .unwrap();
        let ListTargets::Webhook(target) = &kept.targets else {
            panic!("{kept:?}");
        };
        assert!(target.secret.is_some());
        let moved = NotificationList::parse(hooks(&["https://h.test/a"], &["https://evil.test/"]))
            .unwrap()
            .keeping_secret_of(Some(&stored))
            .unwrap_err();
        assert_eq!(moved.field, "webhook_secret");
    }

    #[test]
    fn secrets_do_not_leak_through_debug() {
        let auth = SmtpAuth::Password {
            username: "u".into(),
            password: Secret::new("hunter2".into()),
        };
        assert!(!format!("{auth:?}").contains("hunter2"));
        let oauth = SmtpAuth::XOAuth2 {
            username: "u".into(),
            oauth: OAuthClientCredentials {
                token_url: "https://login.test/t".into(),
                client_id: "c".into(),
                client_secret: Secret::new("client-s3cret".into()),
                scope: String::new(),
            },
        };
        assert!(!format!("{oauth:?}").contains("client-s3cret"));
        let input = ListInput {
            name: "hooks".into(),
            kind: Some(NotificationType::Webhook),
            endpoints: vec!["https://h.test/a".into()],
            webhook_secret: Some("hook-secret-0123456789".into()),
            ..Default::default()
        };
        let shown = format!("{input:?}");
        assert!(!shown.contains("hook-secret"), "{shown}");
        let list = NotificationList::parse(input).unwrap();
        assert!(!format!("{list:?}").contains("hook-secret"));
    }
}
