//! Who may call the admin API (`NotificationOutbox`), and as whom.
//!
//! Three roles, each including the one before: `viewer` reads (queries, status, detail, KPIs,
//! lists, SMTP settings without their secrets, site health), `operator` also retries and
//! discards, `admin` also changes lists and the SMTP settings. A viewer reads webhook URLs cut
//! to scheme, host and port ([`Role::sees_webhook_urls`]). A caller proves a role with a
//! bearer token (`authorization: Bearer <token>`; the config holds only each token's SHA-256) or
//! with a client certificate whose Common Name the config maps to a role (mTLS, see `tls`). The
//! recorded actor of every change is that identity: the token's name or the certificate's CN,
//! never a header the caller writes.
//!
//! The web console (`console`) calls the same service in-process for a logged-in operator: it
//! attaches a [`ConsoleCaller`] to the request, an identity the console verified at login with
//! [`Authenticator::login`] or [`Authenticator::certificate_login`]. Request extensions of a
//! network call are filled by tonic from the connection, never from what the client sends, so
//! only code in this process can present one; its role is checked here like any other.
//!
//! Failed logins (a bearer token not accepted, on the API or the console's login) are counted
//! per client address and, past a few, refused for a while ([`throttle`]), a good token too.
//!
//! Unauthenticated mode (`mode = "none"`) must be chosen explicitly and is logged loudly at
//! start; only then does `x-outbox-actor` name the actor, as a display name. The health and
//! reflection services and site ingest are not covered here: sites are identified by their
//! certificates at the TLS layer.

mod throttle;

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tonic::{Request, Status};

use crate::domain::history::Actor;

pub use throttle::{BLOCK, FailedLogins, MAX_CLIENTS, MAX_FAILURES, Throttled, Via, WINDOW};

/// The header naming the actor in unauthenticated mode.
pub const ACTOR_HEADER: &str = "x-outbox-actor";

/// What a caller may do; each role includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Operator,
    Admin,
}

impl Role {
    /// Whether this role reads webhook endpoint URLs whole (in lists, in a notification's
    /// "Delivered to", in LastError and attempt errors). Slack, Teams and Discord keep a
    /// webhook's secret in its path, so reading the URL is being able to post to the channel:
    /// operators, who act on failed deliveries, and admins, who edit the lists, see it; a viewer
    /// (a wall display, an auditor) sees scheme, host and port
    /// (`domain::webhook::cut_urls`).
    pub fn sees_webhook_urls(self) -> bool {
        self >= Self::Operator
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Viewer => "viewer",
            Self::Operator => "operator",
            Self::Admin => "admin",
        })
    }
}

/// `required` (the default): every admin call needs a token or a mapped certificate. `none`:
/// anyone who can connect may do anything (a loud warning at start).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    #[default]
    Required,
    None,
}

/// `[auth]` in the config file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub mode: AuthMode,
    pub tokens: Vec<TokenConfig>,
    pub certificates: Vec<CertificateConfig>,
}

/// `[[auth.tokens]]`: one bearer token, by the hex SHA-256 of its text (the token itself is
/// never stored; tokens are long random strings, so a plain hash is enough).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Who holds it: recorded as the actor of what it does.
    pub name: String,
    pub role: Role,
    pub sha256: String,
}

/// `[[auth.certificates]]`: a client certificate Common Name and its role.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateConfig {
    pub common_name: String,
    pub role: Role,
}

/// Every admin RPC, with the role it needs: the one table the handlers and the tests share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminRpc {
    QueryNotifications,
    GetNotificationStatus,
    GetNotificationDetail,
    GetKpis,
    ListNotificationLists,
    GetNotificationList,
    RetryNotification,
    DiscardNotification,
    RetryNotifications,
    DiscardNotifications,
    UpsertNotificationList,
    DeleteNotificationList,
    GetSmtpConfig,
    UpsertSmtpConfig,
    DeleteSmtpConfig,
    GetWebhookConfig,
    UpsertWebhookConfig,
    ListSiteHealth,
    ListIncidents,
    GetIncident,
    AcknowledgeIncident,
}

impl AdminRpc {
    pub const ALL: [Self; 21] = [
        Self::QueryNotifications,
        Self::GetNotificationStatus,
        Self::GetNotificationDetail,
        Self::GetKpis,
        Self::ListNotificationLists,
        Self::GetNotificationList,
        Self::RetryNotification,
        Self::DiscardNotification,
        Self::RetryNotifications,
        Self::DiscardNotifications,
        Self::UpsertNotificationList,
        Self::DeleteNotificationList,
        Self::GetSmtpConfig,
        Self::UpsertSmtpConfig,
        Self::DeleteSmtpConfig,
        Self::GetWebhookConfig,
        Self::UpsertWebhookConfig,
        Self::ListSiteHealth,
        Self::ListIncidents,
        Self::GetIncident,
        Self::AcknowledgeIncident,
    ];

    pub fn role(self) -> Role {
        match self {
            Self::QueryNotifications
            | Self::GetNotificationStatus
            | Self::GetNotificationDetail
            | Self::GetKpis
            | Self::ListNotificationLists
            | Self::GetNotificationList
            // The relay, its account name and the retry settings; never a secret (those are
            // write-only), so every operator may see where mail goes.
            | Self::GetSmtpConfig
            // Pacing and retries only: webhook endpoints and secrets are the lists'.
            | Self::GetWebhookConfig
            | Self::ListSiteHealth
            | Self::ListIncidents
            | Self::GetIncident => Role::Viewer,
            Self::RetryNotification
            | Self::DiscardNotification
            | Self::RetryNotifications
            | Self::DiscardNotifications
            // Taking an alarm is an operator's job, as retrying one is.
            | Self::AcknowledgeIncident => Role::Operator,
            Self::UpsertNotificationList
            | Self::DeleteNotificationList
            | Self::UpsertSmtpConfig
            | Self::DeleteSmtpConfig
            | Self::UpsertWebhookConfig => Role::Admin,
        }
    }
}

/// An operator the web console has verified (by token or client certificate at login), as
/// whom it calls the admin service in-process. Carried as a `tonic::Request` extension; built
/// only by this module, so holding one means the [`Authenticator`] accepted the credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleCaller {
    name: String,
    role: Role,
}

impl ConsoleCaller {
    /// The recorded actor of what this caller does.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// The console's own identity when authentication is off: it may do anything, as
    /// `console`.
    fn open() -> Self {
        Self {
            name: "console".into(),
            role: Role::Admin,
        }
    }
}

/// Whose notifications a status reader may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusReader {
    /// An operator credential with this role: any notification.
    Anyone(Role),
    /// Only notifications this site submitted.
    Site(String),
}

impl StatusReader {
    /// Whether this reader sees webhook URLs whole: a site, like a viewer, does not.
    pub fn sees_webhook_urls(&self) -> bool {
        match self {
            Self::Anyone(role) => role.sees_webhook_urls(),
            Self::Site(_) => false,
        }
    }
}

/// A configured token: who, which role, and the digest presented tokens are compared with.
#[derive(Clone)]
struct Token {
    name: String,
    role: Role,
    digest: [u8; 32],
}

/// Decides each admin call from the config; cheap to share. Clones share one count of failed
/// logins, so the admin API and the console (each holds a clone) count together.
#[derive(Clone)]
pub struct Authenticator {
    mode: AuthMode,
    tokens: Vec<Token>,
    certificates: HashMap<String, Role>,
    failed_logins: Arc<FailedLogins>,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("mode", &self.mode)
            .field("tokens", &self.tokens.len())
            .field("certificates", &self.certificates.len())
            .finish()
    }
}

impl Authenticator {
    /// Checks `[auth]`; errors name the key. Warns about a configuration nobody can use.
    pub fn from_config(config: &AuthConfig) -> anyhow::Result<Self> {
        let mut tokens = Vec::with_capacity(config.tokens.len());
        for (i, token) in config.tokens.iter().enumerate() {
            let key = format!("auth.tokens[{i}]");
            if token.name.trim().is_empty() {
                anyhow::bail!("{key}.name: must not be empty");
            }
            let digest = parse_digest(&token.sha256)
                .map_err(|problem| anyhow::anyhow!("{key}.sha256: {problem}"))?;
            if tokens.iter().any(|t: &Token| t.digest == digest) {
                anyhow::bail!("{key}.sha256: the same token is configured twice");
            }
            tokens.push(Token {
                name: token.name.trim().to_owned(),
                role: token.role,
                digest,
            });
        }
        let mut certificates = HashMap::new();
        for (i, cert) in config.certificates.iter().enumerate() {
            let name = cert.common_name.trim();
            if name.is_empty() {
                anyhow::bail!("auth.certificates[{i}].common_name: must not be empty");
            }
            if certificates.insert(name.to_owned(), cert.role).is_some() {
                anyhow::bail!("auth.certificates[{i}].common_name: {name:?} is mapped twice");
            }
        }
        let auth = Self {
            mode: config.mode,
            tokens,
            certificates,
            failed_logins: Arc::new(FailedLogins::new()),
        };
        auth.warn_at_start();
        Ok(auth)
    }

    fn warn_at_start(&self) {
        match self.mode {
            AuthMode::None => tracing::warn!(
                "AUTHENTICATION IS OFF ([auth] mode = \"none\"): anyone who can reach this port \
                 can read every notification, retry and discard them and change lists and SMTP \
                 settings; x-outbox-actor is trusted as the actor. Use it only on a closed \
                 development machine."
            ),
            AuthMode::Required if self.tokens.is_empty() && self.certificates.is_empty() => {
                tracing::warn!(
                    "no operator credentials are configured ([[auth.tokens]] or \
                     [[auth.certificates]]): every admin API call will be refused"
                );
            }
            AuthMode::Required => {}
        }
    }

    /// Whether the admin API is open to anyone (`mode = "none"`).
    pub fn is_open(&self) -> bool {
        self.mode == AuthMode::None
    }

    /// The count of failed logins, for `/metrics`.
    pub fn failed_logins(&self) -> &FailedLogins {
        &self.failed_logins
    }

    /// The web console's login with a bearer token from the client at `from`: the same tokens,
    /// rules and failed-login count as the API (a throttled client gets UNAVAILABLE with
    /// `retry-after`, see [`retry_after`]). With authentication off, anyone is the console's
    /// open identity.
    pub fn login(&self, token: &str, from: Option<IpAddr>) -> Result<ConsoleCaller, Status> {
        if self.is_open() {
            return Ok(ConsoleCaller::open());
        }
        let now = Instant::now();
        self.failed_logins
            .check(from, Via::Console, now)
            .map_err(throttled)?;
        let token = token.trim();
        if token.is_empty() {
            return Err(Status::unauthenticated("paste a bearer token to log in"));
        }
        match self.find_token(token) {
            Some(t) => Ok(ConsoleCaller {
                name: t.name.clone(),
                role: t.role,
            }),
            None => {
                self.failed_logins
                    .failed(from, Via::Console, "token not accepted", now);
                Err(Status::unauthenticated("the bearer token is not accepted"))
            }
        }
    }

    /// The web console's login with a verified client certificate whose Common Name
    /// `[[auth.certificates]]` maps to a role.
    pub fn certificate_login(&self, common_name: &str) -> Result<ConsoleCaller, Status> {
        if self.is_open() {
            return Ok(ConsoleCaller::open());
        }
        self.identify(&Request::new(()), Some(common_name))
            .map(|(name, role)| ConsoleCaller { name, role })
    }

    /// The actor of a call to `rpc`, if the caller may make it. `client_cn` is the Common Name
    /// of the verified client certificate, if the connection has one.
    pub fn authorize<T>(
        &self,
        request: &Request<T>,
        client_cn: Option<&str>,
        rpc: AdminRpc,
    ) -> Result<Actor, Status> {
        self.authorize_as(request, client_cn, rpc)
            .map(|(actor, _)| actor)
    }

    /// [`Self::authorize`], with the caller's role (for what the answer shows it). With
    /// authentication off, everyone is an admin.
    pub fn authorize_as<T>(
        &self,
        request: &Request<T>,
        client_cn: Option<&str>,
        rpc: AdminRpc,
    ) -> Result<(Actor, Role), Status> {
        if self.mode == AuthMode::None {
            return Ok((display_name(request), Role::Admin));
        }
        let needed = rpc.role();
        let (who, role) = self.identify(request, client_cn)?;
        if role < needed {
            return Err(Status::permission_denied(format!(
                "{rpc:?} needs the {needed} role; {who} has {role}"
            )));
        }
        Ok((Actor::new(&who), role))
    }

    /// Who may read a notification's status: anyone with the viewer role, or a site (a verified
    /// client certificate no operator role is mapped to) for its own notifications only, so a
    /// site script's `Status(id)` works through its forwarder without an operator credential.
    pub fn authorize_status_read<T>(
        &self,
        request: &Request<T>,
        client_cn: Option<&str>,
    ) -> Result<StatusReader, Status> {
        let unmapped_site = client_cn.filter(|cn| {
            !self.certificates.contains_key(*cn)
                && request.metadata().get("authorization").is_none()
        });
        match unmapped_site {
            Some(site) if self.mode == AuthMode::Required => {
                Ok(StatusReader::Site(site.to_owned()))
            }
            _ => self
                .authorize_as(request, client_cn, AdminRpc::GetNotificationStatus)
                .map(|(_, role)| StatusReader::Anyone(role)),
        }
    }

    /// Who the caller is and their role: the console's verified operator, else a bearer token,
    /// else a mapped certificate.
    fn identify<T>(
        &self,
        request: &Request<T>,
        client_cn: Option<&str>,
    ) -> Result<(String, Role), Status> {
        if let Some(caller) = request.extensions().get::<ConsoleCaller>() {
            return Ok((caller.name.clone(), caller.role));
        }
        if let Some(value) = request.metadata().get("authorization") {
            let from = request.remote_addr().map(|addr| addr.ip());
            let now = Instant::now();
            self.failed_logins
                .check(from, Via::Api, now)
                .map_err(throttled)?;
            let token = value
                .to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim);
            let Some(token) = token else {
                self.failed_logins
                    .failed(from, Via::Api, "malformed authorization header", now);
                return Err(Status::unauthenticated(
                    "authorization: expected \"Bearer <token>\"",
                ));
            };
            return match self.find_token(token) {
                Some(t) => Ok((t.name.clone(), t.role)),
                None => {
                    self.failed_logins
                        .failed(from, Via::Api, "bearer token not accepted", now);
                    Err(Status::unauthenticated("the bearer token is not accepted"))
                }
            };
        }
        match client_cn {
            Some(cn) => match self.certificates.get(cn) {
                Some(role) => Ok((cn.to_owned(), *role)),
                None => Err(Status::permission_denied(format!(
                    "the client certificate {cn:?} has no operator role \
                     ([[auth.certificates]]); send a bearer token instead"
                ))),
            },
            None => Err(Status::unauthenticated(
                "the admin API needs a bearer token (authorization: Bearer <token>) or a client \
                 certificate mapped to a role",
            )),
        }
    }

    /// The configured token whose digest `token`'s is.
    fn find_token(&self, token: &str) -> Option<&Token> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        // Every configured digest is compared in full, so the time taken says nothing about
        // which one (or how much of one) matched.
        self.tokens
            .iter()
            .fold(None, |found, t| match (found, equal(&t.digest, &digest)) {
                (None, true) => Some(t),
                (found, _) => found,
            })
    }
}

/// The refusal of a throttled client's attempt: UNAVAILABLE (HTTP's 429 maps to it), with the
/// wait in `retry-after` (whole seconds) and in the message.
fn throttled(refusal: Throttled) -> Status {
    let mut status = Status::unavailable(refusal.to_string());
    status
        .metadata_mut()
        .insert("retry-after", refusal.retry_after_secs().into());
    status
}

/// The seconds to wait that a throttled attempt's refusal carries, if it is one.
pub fn retry_after(status: &Status) -> Option<u64> {
    status
        .metadata()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// The actor a caller names itself in unauthenticated mode: the console's caller when the call
/// comes from the console, else the `x-outbox-actor` header.
fn display_name<T>(request: &Request<T>) -> Actor {
    if let Some(caller) = request.extensions().get::<ConsoleCaller>() {
        return Actor::new(&caller.name);
    }
    request
        .metadata()
        .get(ACTOR_HEADER)
        .and_then(|v| v.to_str().ok())
        .map_or_else(Actor::unknown, Actor::new)
}

fn parse_digest(hex: &str) -> Result<[u8; 32], String> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(
            "must be 64 hex digits (the SHA-256 of the token, e.g. from `sha256sum`)".into(),
        );
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(digest)
}

/// Equal in time independent of where the inputs differ.
fn equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The hex SHA-256 of a token, as `[[auth.tokens]] sha256` wants it.
pub fn token_digest(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn auth() -> Authenticator {
        Authenticator::from_config(&AuthConfig {
            mode: AuthMode::Required,
            tokens: vec![TokenConfig {
                name: "ann".into(),
                role: Role::Operator,
                sha256: token_digest("ann-secret"),
            }],
            certificates: vec![CertificateConfig {
                common_name: "ops-console".into(),
                role: Role::Admin,
            }],
        })
        .unwrap()
    }

    fn bearer(token: &str) -> Request<()> {
        let mut request = Request::new(());
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        request
    }

    #[test]
    fn a_token_acts_as_its_name_within_its_role() {
        let auth = auth();
        let actor = auth
            .authorize(&bearer("ann-secret"), None, AdminRpc::RetryNotification)
            .unwrap();
        assert_eq!(actor.as_str(), "ann");
        let denied = auth
            .authorize(&bearer("ann-secret"), None, AdminRpc::UpsertSmtpConfig)
            .unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        let unknown = auth
            .authorize(&bearer("guess"), None, AdminRpc::GetKpis)
            .unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn bad_tokens_block_their_client_on_the_api_and_the_console_together() {
        let auth = auth();
        // Requests built here have no connection: they all count as one unknown client.
        for i in 0..MAX_FAILURES - 1 {
            let refused = auth
                .authorize(&bearer(&format!("guess-{i}")), None, AdminRpc::GetKpis)
                .unwrap_err();
            assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        }
        assert_eq!(
            auth.login("guess", None).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        // Blocked now, a good token too, on both; a clone shares the count.
        let throttled = auth
            .clone()
            .authorize(&bearer("ann-secret"), None, AdminRpc::GetKpis)
            .unwrap_err();
        assert_eq!(throttled.code(), tonic::Code::Unavailable);
        assert_eq!(retry_after(&throttled), Some(BLOCK.as_secs()));
        let throttled = auth.login("ann-secret", None).unwrap_err();
        assert_eq!(retry_after(&throttled), Some(BLOCK.as_secs()));
        // A certificate is not a guess: not counted, not refused.
        assert!(
            auth.authorize(&Request::new(()), Some("ops-console"), AdminRpc::GetKpis)
                .is_ok()
        );
        // Another client is not held back.
        let mut elsewhere = bearer("ann-secret");
        elsewhere
            .extensions_mut()
            .insert(tonic::transport::server::TcpConnectInfo {
                local_addr: None,
                remote_addr: Some(([10, 0, 0, 9], 4000).into()),
            });
        assert!(auth.authorize(&elsewhere, None, AdminRpc::GetKpis).is_ok());
    }

    #[test]
    fn a_header_names_nobody_unless_authentication_is_off() {
        let mut request = Request::new(());
        request
            .metadata_mut()
            .insert(ACTOR_HEADER, "mallory".parse().unwrap());
        let refused = auth()
            .authorize(&request, None, AdminRpc::GetKpis)
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        let open = Authenticator::from_config(&AuthConfig {
            mode: AuthMode::None,
            ..Default::default()
        })
        .unwrap();
        let actor = open
            .authorize(&request, None, AdminRpc::DeleteSmtpConfig)
            .unwrap();
        assert_eq!(actor.as_str(), "mallory");
    }

    #[test]
    fn a_mapped_certificate_has_its_role_and_others_have_none() {
        let auth = auth();
        let actor = auth
            .authorize(
                &Request::new(()),
                Some("ops-console"),
                AdminRpc::UpsertSmtpConfig,
            )
            .unwrap();
        assert_eq!(actor.as_str(), "ops-console");
        let site = auth
            .authorize(&Request::new(()), Some("site-a"), AdminRpc::GetKpis)
            .unwrap_err();
        assert_eq!(site.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            auth.authorize_status_read(&Request::new(()), Some("site-a"))
                .unwrap(),
            StatusReader::Site("site-a".into())
        );
        assert_eq!(
            auth.authorize_status_read(&Request::new(()), None)
                .unwrap_err()
                .code(),
            tonic::Code::Unauthenticated
        );
    }

    fn as_console(caller: ConsoleCaller) -> Request<()> {
        let mut request = Request::new(());
        request.extensions_mut().insert(caller);
        request
    }

    #[test]
    fn a_console_login_is_checked_like_the_api_and_acts_as_its_name() {
        let auth = auth();
        let ann = auth.login(" ann-secret ", None).unwrap();
        assert_eq!((ann.name(), ann.role()), ("ann", Role::Operator));
        assert_eq!(
            auth.login("guess", None).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            auth.login("", None).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );

        let actor = auth
            .authorize(&as_console(ann.clone()), None, AdminRpc::RetryNotification)
            .unwrap();
        assert_eq!(actor.as_str(), "ann");
        // The role check is the API's own, message included.
        let denied = auth
            .authorize(&as_console(ann), None, AdminRpc::UpsertSmtpConfig)
            .unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(
            denied.message().contains("needs the admin role"),
            "{denied:?}"
        );
    }

    #[test]
    fn a_console_certificate_login_needs_a_mapped_common_name() {
        let auth = auth();
        let ops = auth.certificate_login("ops-console").unwrap();
        assert_eq!((ops.name(), ops.role()), ("ops-console", Role::Admin));
        let actor = auth
            .authorize(&as_console(ops), None, AdminRpc::UpsertSmtpConfig)
            .unwrap();
        assert_eq!(actor.as_str(), "ops-console");
        assert_eq!(
            auth.certificate_login("site-a").unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
    }

    #[test]
    fn with_authentication_off_the_console_acts_as_console() {
        let open = Authenticator::from_config(&AuthConfig {
            mode: AuthMode::None,
            ..Default::default()
        })
        .unwrap();
        let caller = open.login("anything", None).unwrap();
        assert_eq!((caller.name(), caller.role()), ("console", Role::Admin));
        let actor = open
            .authorize(&as_console(caller), None, AdminRpc::DeleteSmtpConfig)
            .unwrap();
        assert_eq!(actor.as_str(), "console");
    }

    #[test]
    fn bad_token_digests_are_refused_naming_the_key() {
        let error = Authenticator::from_config(&AuthConfig {
            tokens: vec![TokenConfig {
                name: "ann".into(),
                role: Role::Viewer,
                sha256: "not-hex".into(),
            }],
            ..Default::default()
        })
        .unwrap_err();
        assert!(
            error.to_string().starts_with("auth.tokens[0].sha256:"),
            "{error}"
        );
    }
}
