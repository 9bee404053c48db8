//! Central's configuration: a TOML file, overridden by `OUTBOX_CENTRAL_*` environment variables
//! (nested keys joined by `__`, e.g. `OUTBOX_CENTRAL_SMTP__HOST`), overridden by command-line
//! flags. Unknown keys are errors, and every validation message names the key, so a typo fails
//! start-up instead of silently running with a default. Defaults are documented in
//! `deploy/central-outbox.toml`.
//!
//! Keys with a fixed set of values (`smtp.tls`, `*.backoff`, `lists[].type`,
//! `lists[].webhook_format`, `log.format`) are serde enums: a value outside the set is refused
//! while the file is read, by a message that names the key and lists the values it accepts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::ack_link::{AckLinkSettings, AcknowledgementConfig};
use crate::auth::{AuthConfig, Authenticator};
use crate::dispatcher::DispatcherSettings;
use crate::domain::ListName;
use crate::domain::channel::{
    DeliveryPolicy, EmailAddress, ListInput, NotificationList, OAuthClientCredentials, RateLimit,
    Secret, SmtpAuth, SmtpSettings, TlsMode, WebhookSettings, defaults,
};
use crate::domain::consolidation::Consolidation;
use crate::domain::escalation::{EscalationPolicy, PolicyInput};
use crate::domain::failover::FailoverPolicy;
use crate::domain::kpi::KpiSettings;
use crate::domain::retry::Backoff;
use crate::domain::self_alert::Routes;
use crate::domain::smtp_relay::SmtpRelay;
use crate::domain::webhook::WebhookFormat;
use crate::domain::{ContentError, NotificationType, Priority};
use crate::grpc::ingest::DEFAULT_MAX_INGEST_STREAMS;
use crate::purge::PurgeSettings;
use crate::secrets::{Keyring, SecretsConfig};
use crate::self_alerts::SelfAlertSettings;
use crate::self_alerts::heartbeat::HeartbeatSettings;
use crate::status_callbacks::settings::{StatusCallbackSettings, StatusCallbacksConfig};
use crate::store::mssql::MsSqlOptions;
use crate::tls::{TlsConfig, TlsSettings};
use task_supervisor::FaultPlan;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// gRPC listen address.
    pub listen_addr: SocketAddr,
    /// Prometheus `/metrics` HTTP address; unset (the default) serves no metrics.
    pub metrics_listen: Option<SocketAddr>,
    /// `sqlite://PATH` (the embedded default), `mssql://USER:PASSWORD@HOST:PORT/DATABASE?...` or
    /// an ADO.NET-style `server=HOST,PORT;database=...;user id=...;password=...`.
    pub database: String,
    /// Lease holder name; defaults to a random id per process.
    pub node_id: Option<String>,
    pub dispatcher: DispatcherConfig,
    /// The email channel. Seeds the database at start-up when it holds no SMTP settings (and
    /// replaces them with `--apply-config`); see `bootstrap`.
    pub smtp: Option<SmtpConfig>,
    /// The webhook channel's pacing and retries; seeded (or replaced) like `smtp`. Until any
    /// are stored, the webhook channel runs on the domain's defaults.
    pub webhook: Option<WebhookConfig>,
    /// Notification lists; each seeds the database at start-up if no list of its name is
    /// stored (and replaces it with `--apply-config`). Lists not named here are left as they
    /// are.
    pub lists: Vec<ListConfig>,
    /// The key the SMTP, OAuth and webhook secrets are encrypted with in the database; see
    /// `secrets`.
    pub secrets: SecretsConfig,
    pub kpis: KpiConfig,
    pub retention: RetentionConfig,
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// How often the store is probed for the health service.
    #[serde(with = "humantime_serde")]
    pub health_check_interval: Duration,
    /// A site-forwarder node whose latest health report is this old is offline (ListSiteHealth,
    /// `outbox_site_health_online` in /metrics, `outboxctl sites`). Nodes report every few
    /// seconds, so the default (the source system's 180 s) rides out dozens of lost reports.
    #[serde(with = "humantime_serde")]
    pub site_offline_after: Duration,
    /// TLS on the gRPC port, client certificates, and whether a non-loopback `listen_addr` may
    /// serve plaintext; see `tls`.
    pub tls: TlsConfig,
    pub log: LogConfig,
    /// Who may call the admin API; see `auth`.
    pub auth: AuthConfig,
    /// How the gRPC server notices connections that went silent; see [`ServerConfig`].
    pub server: ServerConfig,
    /// The web console; off unless `console.listen` is set. See [`ConsoleConfig`].
    pub console: ConsoleConfig,
    /// Central's alerts about itself; off unless the section names a list or a heartbeat URL.
    /// See [`SelfAlertsConfig`].
    pub self_alerts: Option<SelfAlertsConfig>,
    /// Acknowledgement links in the messages of escalating incidents; off unless
    /// `acknowledgement.link_base_url` is set. See [`AcknowledgementConfig`].
    pub acknowledgement: AcknowledgementConfig,
    /// The signing key and retry bounds of the lists' status callbacks.
    pub status_callbacks: StatusCallbacksConfig,
    /// Debug builds only, for the tests: supervised task starts that fail on purpose
    /// (`TASK=N` or `TASK=always`, comma-separated; `task_supervisor::FaultPlan`). Release
    /// builds refuse it. Set through `OUTBOX_CENTRAL_TEST_FAULTS`.
    pub test_faults: Option<String>,
}

/// `[console]`: the operators' web console (HTML over HTTP, served by central itself). Off
/// unless `listen` is set. Its sessions live in this process's memory: behind a load balancer
/// with several central replicas, pin each operator to one replica (or log in again after a
/// switch). It is served over TLS with `[tls]`'s certificate when one is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// Address of the console's HTTP port, e.g. "127.0.0.1:8080"; unset (the default): no
    /// console.
    pub listen: Option<SocketAddr>,
    /// A session unused this long ends (default 30 minutes). The pages' own refreshes do not
    /// count as use.
    #[serde(with = "humantime_serde")]
    pub session_idle_timeout: Duration,
    /// A session ends this long after its login, used or not (default 12 hours: a working day
    /// and then some).
    #[serde(with = "humantime_serde")]
    pub session_lifetime: Duration,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            listen: None,
            session_idle_timeout: Duration::from_secs(30 * 60),
            session_lifetime: Duration::from_secs(12 * 3600),
        }
    }
}

/// `[console]` checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsoleSettings {
    pub listen: SocketAddr,
    pub idle_timeout: Duration,
    pub lifetime: Duration,
}

impl ConsoleConfig {
    /// `None` when the console is off.
    fn validate(&self) -> anyhow::Result<Option<ConsoleSettings>> {
        let (idle_timeout, lifetime) = (self.session_idle_timeout, self.session_lifetime);
        if idle_timeout < Duration::from_secs(1) {
            bail!("console.session_idle_timeout: must be at least 1s");
        }
        if lifetime < idle_timeout {
            bail!("console.session_lifetime: must be at least console.session_idle_timeout");
        }
        Ok(self.listen.map(|listen| ConsoleSettings {
            listen,
            idle_timeout,
            lifetime,
        }))
    }
}

/// `[server]`: how central's gRPC port treats the connections it accepts.
///
/// HTTP/2 keepalive on every connection. A site's submit stream over a link that stopped
/// passing packets without closing anything would otherwise stay open (holding its batches and a
/// task) until TCP gives up, which can take many minutes; with pings it ends at most
/// `http2_keepalive_interval + http2_keepalive_timeout` after the site was last heard. The site
/// runs its own, shorter pings (`[central]` in its config) and is the one that reconnects;
/// central's are longer so that a congested site uplink, where a ping answer waits behind data,
/// is not cut from this side first.
///
/// Bounds on what clients can make central hold in memory (see `grpc::ingest` for what one
/// submit stream holds at most): calls open per connection, calls running per connection, and
/// submit streams open across the whole node. Past `max_ingest_streams` a new stream is refused
/// with RESOURCE_EXHAUSTED naming the key, and counted in `outbox_ingest_streams_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// A PING goes to a client after this long without a byte from it.
    #[serde(with = "humantime_serde")]
    pub http2_keepalive_interval: Duration,
    /// How long a PING may go unanswered before the connection is closed.
    #[serde(with = "humantime_serde")]
    pub http2_keepalive_timeout: Duration,
    /// Calls (HTTP/2 streams) one connection may have open at once, announced to the client as
    /// SETTINGS_MAX_CONCURRENT_STREAMS: a client wanting more waits for one to end. A site node
    /// has one call open per connection, `outboxctl` and grpcurl one.
    pub max_concurrent_streams: u32,
    /// Calls one connection may have running at once; further ones wait, their requests held
    /// back by HTTP/2 flow control. Each running call may be decoding a request of up to
    /// `MAX_GRPC_MESSAGE_BYTES` (4 MiB), so this bounds one connection's requests in memory. A
    /// submit stream counts only while it opens.
    pub concurrency_limit_per_connection: usize,
    /// Submit streams (SubmitNotifications) open at once on this node, from all connections.
    pub max_ingest_streams: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            http2_keepalive_interval: Duration::from_secs(10),
            http2_keepalive_timeout: Duration::from_secs(20),
            // RFC 9113 suggests no less than 100, so as not to limit a client's parallelism
            // needlessly; our own clients use one per connection. (hyper's own default is 200,
            // which tonic replaces with "no limit" unless it is set.)
            max_concurrent_streams: 100,
            // 16 × 4 MiB = 64 MiB of requests from one connection at most; a client making more
            // calls than that at once on one connection is queueing, not waiting on central.
            concurrency_limit_per_connection: 16,
            max_ingest_streams: DEFAULT_MAX_INGEST_STREAMS,
        }
    }
}

/// Upper bounds of the `[server]` limits: past them a limit bounds nothing a machine has.
/// A thousand calls per connection is ten times RFC 9113's suggestion; 256 running calls are
/// 1 GiB of requests from one connection; 4096 submit streams at `STREAM_MEMORY_BOUND` (16 MiB)
/// each are 64 GiB.
const MAX_CONCURRENT_STREAMS_LIMIT: usize = 1000;
const CONCURRENCY_LIMIT_PER_CONNECTION_LIMIT: usize = 256;
const MAX_INGEST_STREAMS_LIMIT: usize = 4096;

impl ServerConfig {
    fn validate(&self) -> anyhow::Result<()> {
        for (key, value) in [
            (
                "server.http2_keepalive_interval",
                self.http2_keepalive_interval,
            ),
            (
                "server.http2_keepalive_timeout",
                self.http2_keepalive_timeout,
            ),
        ] {
            if value < Duration::from_millis(100) {
                bail!("{key}: must be at least 100ms");
            }
        }
        for (key, value, limit) in [
            (
                "server.max_concurrent_streams",
                usize::try_from(self.max_concurrent_streams).unwrap_or(usize::MAX),
                MAX_CONCURRENT_STREAMS_LIMIT,
            ),
            (
                "server.concurrency_limit_per_connection",
                self.concurrency_limit_per_connection,
                CONCURRENCY_LIMIT_PER_CONNECTION_LIMIT,
            ),
            (
                "server.max_ingest_streams",
                self.max_ingest_streams,
                MAX_INGEST_STREAMS_LIMIT,
            ),
        ] {
            if !(1..=limit).contains(&value) {
                bail!("{key}: must be between 1 and {limit}, not {value}");
            }
        }
        Ok(())
    }
}

/// `[self_alerts]`: central sends notifications about itself (a site node offline, a channel
/// failing, parked rising, held rows past their window, a task restarting repeatedly, no
/// dispatcher leader, a certificate expiring) to the lists named here, and, with
/// `heartbeat_url`, calls an outside watchdog while it dispatches; see `self_alerts`. Each
/// number and duration has the bounds of [`SELF_ALERT_BOUNDS`]' entries and is refused naming
/// the key outside them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SelfAlertsConfig {
    /// An email list that receives every alert (but one about the email channel failing).
    pub email_list: Option<String>,
    /// A webhook list that receives every alert (but one about the webhook channel failing).
    pub webhook_list: Option<String>,
    /// How often central checks itself.
    #[serde(with = "humantime_serde")]
    pub check_interval: Duration,
    /// How long a raised condition must stay clear before "recovered" is sent (a condition
    /// that flickers sends nothing meanwhile).
    #[serde(with = "humantime_serde")]
    pub recover_after: Duration,
    /// A channel is failing after this many transient failures in a row ...
    pub channel_failures: u32,
    /// ... or once one of its notifications has waited this long (Pending or Retrying).
    #[serde(with = "humantime_serde")]
    pub channel_max_wait: Duration,
    /// Parked notifications rising by this many within `parked_window`.
    pub parked_rise: u32,
    #[serde(with = "humantime_serde")]
    pub parked_window: Duration,
    /// Notifications held by flood consolidation still Held this long after their window.
    #[serde(with = "humantime_serde")]
    pub held_grace: Duration,
    /// A supervised task restarting this many times within `task_restart_window`.
    pub task_restarts: u32,
    #[serde(with = "humantime_serde")]
    pub task_restart_window: Duration,
    /// No node holding the dispatcher lease for this long (noticed by every replica).
    #[serde(with = "humantime_serde")]
    pub no_leader_after: Duration,
    /// A certificate of `[tls]` expiring within this many days.
    pub certificate_expiry_days: u32,
    /// Called (an empty POST) every `heartbeat_interval` while this node dispatches and is
    /// healthy: https, or http to a loopback address.
    pub heartbeat_url: Option<String>,
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
}

impl Default for SelfAlertsConfig {
    fn default() -> Self {
        Self {
            email_list: None,
            webhook_list: None,
            check_interval: Duration::from_secs(15),
            recover_after: Duration::from_secs(60),
            channel_failures: 5,
            channel_max_wait: Duration::from_secs(10 * 60),
            parked_rise: 10,
            parked_window: Duration::from_secs(15 * 60),
            held_grace: Duration::from_secs(5 * 60),
            task_restarts: 3,
            task_restart_window: Duration::from_secs(10 * 60),
            no_leader_after: Duration::from_secs(60),
            certificate_expiry_days: 14,
            heartbeat_url: None,
            heartbeat_interval: Duration::from_secs(60),
        }
    }
}

const DAY: Duration = Duration::from_secs(24 * 3600);

/// The bounds of `[self_alerts]`' durations: (key, least, most). Checks more often than every
/// 100 ms would load the store for nothing; more than an hour between checks, or thresholds
/// beyond a day (a week for a notification's wait), would make an alert too late to matter.
pub const SELF_ALERT_BOUNDS: [(&str, Duration, Duration); 9] = [
    (
        "check_interval",
        Duration::from_millis(100),
        Duration::from_secs(3600),
    ),
    ("recover_after", Duration::ZERO, Duration::from_secs(3600)),
    (
        "channel_max_wait",
        Duration::from_secs(1),
        Duration::from_secs(7 * 24 * 3600),
    ),
    ("parked_window", Duration::from_secs(1), DAY),
    ("held_grace", Duration::ZERO, DAY),
    ("task_restart_window", Duration::from_secs(1), DAY),
    ("no_leader_after", Duration::from_secs(1), DAY),
    (
        "heartbeat_interval",
        Duration::from_secs(1),
        Duration::from_secs(3600),
    ),
    // Not a key: certificate_expiry_days, as a duration (1 to 365 days).
    (
        "certificate_expiry",
        DAY,
        Duration::from_secs(365 * 24 * 3600),
    ),
];

/// The bounds of `[self_alerts]`' counts: (key, least, most).
pub const SELF_ALERT_COUNT_BOUNDS: [(&str, u32, u32); 4] = [
    ("channel_failures", 1, 1000),
    ("parked_rise", 1, 1_000_000),
    ("task_restarts", 1, 1000),
    ("certificate_expiry_days", 1, 365),
];

impl SelfAlertsConfig {
    /// Checks every key; `lists` are the file's lists (a named one must be of its channel),
    /// `renew_interval` the dispatcher's (no leader can only be told after two of them).
    fn validate(
        &self,
        lists: &[NotificationList],
        renew_interval: Duration,
    ) -> anyhow::Result<SelfAlertSettings> {
        let in_bounds = |key: &str, value: Duration| -> anyhow::Result<()> {
            if let Some((_, least, most)) = SELF_ALERT_BOUNDS.iter().find(|(k, _, _)| *k == key)
                && !(*least..=*most).contains(&value)
            {
                bail!(
                    "self_alerts.{key}: must be between {} and {}, not {}",
                    humantime::format_duration(*least),
                    humantime::format_duration(*most),
                    humantime::format_duration(value)
                );
            }
            Ok(())
        };
        for (key, value) in [
            ("check_interval", self.check_interval),
            ("recover_after", self.recover_after),
            ("channel_max_wait", self.channel_max_wait),
            ("parked_window", self.parked_window),
            ("held_grace", self.held_grace),
            ("task_restart_window", self.task_restart_window),
            ("no_leader_after", self.no_leader_after),
            ("heartbeat_interval", self.heartbeat_interval),
        ] {
            in_bounds(key, value)?;
        }
        for (key, value) in [
            ("channel_failures", self.channel_failures),
            ("parked_rise", self.parked_rise),
            ("task_restarts", self.task_restarts),
            ("certificate_expiry_days", self.certificate_expiry_days),
        ] {
            if let Some((_, least, most)) =
                SELF_ALERT_COUNT_BOUNDS.iter().find(|(k, _, _)| *k == key)
                && !(*least..=*most).contains(&value)
            {
                bail!("self_alerts.{key}: must be between {least} and {most}, not {value}");
            }
        }
        if self.no_leader_after < renew_interval.saturating_mul(2) {
            bail!(
                "self_alerts.no_leader_after: must be at least twice dispatcher.renew_interval \
                 ({}): a lease can be free that long between two nodes' attempts to take it",
                humantime::format_duration(renew_interval.saturating_mul(2))
            );
        }
        let list = |key: &str, name: &Option<String>, kind: NotificationType| {
            let Some(name) = name else {
                return Ok(None);
            };
            let name = ListName::parse(name.clone())
                .map_err(|e| anyhow::anyhow!("self_alerts.{key}: {}", e.problem))?;
            if let Some(other) = lists.iter().find(|l| l.name == name && l.kind() != kind) {
                bail!(
                    "self_alerts.{key}: list {:?} is a {} list; name a{} {kind} list",
                    name.as_str(),
                    other.kind(),
                    if kind == NotificationType::Email {
                        "n"
                    } else {
                        ""
                    }
                );
            }
            Ok(Some(name))
        };
        let routes = Routes {
            email: list("email_list", &self.email_list, NotificationType::Email)?,
            webhook: list(
                "webhook_list",
                &self.webhook_list,
                NotificationType::Webhook,
            )?,
        };
        let heartbeat = self
            .heartbeat_url
            .as_deref()
            .map(|url| {
                heartbeat_url(url).map(|url| HeartbeatSettings {
                    url,
                    interval: self.heartbeat_interval,
                })
            })
            .transpose()?;
        if routes.is_empty() && heartbeat.is_none() {
            bail!(
                "self_alerts: name email_list, webhook_list or heartbeat_url (or leave the \
                 section out: self-alerts are off without it)"
            );
        }
        Ok(SelfAlertSettings {
            routes,
            check_interval: self.check_interval,
            recover_after: self.recover_after,
            channel_failures: self.channel_failures,
            channel_max_wait: self.channel_max_wait,
            parked_rise: self.parked_rise,
            parked_window: self.parked_window,
            held_grace: self.held_grace,
            task_restarts: self.task_restarts,
            task_restart_window: self.task_restart_window,
            no_leader_after: self.no_leader_after,
            certificate_expiry: DAY.saturating_mul(self.certificate_expiry_days),
            heartbeat,
        })
    }
}

/// `self_alerts.heartbeat_url`: https, or http to a loopback address (as webhook endpoints),
/// without credentials in it (a watchdog's secret goes in its path).
fn heartbeat_url(text: &str) -> anyhow::Result<String> {
    const KEY: &str = "self_alerts.heartbeat_url";
    if text.len() > 2048 {
        bail!("{KEY}: longer than 2048 bytes");
    }
    let url = url::Url::parse(text).map_err(|e| anyhow::anyhow!("{KEY}: not a URL: {e}"))?;
    match url.scheme() {
        "https" => {}
        "http" if crate::domain::webhook::is_loopback(&url) => {}
        "http" => bail!("{KEY}: plain http:// is only allowed to a loopback address; use https"),
        other => bail!("{KEY}: scheme {other:?} is not https"),
    }
    if url.host_str().is_none_or(str::is_empty) {
        bail!("{KEY}: has no host");
    }
    if !url.username().is_empty() || url.password().is_some() {
        bail!("{KEY}: must not carry credentials (user:password@)");
    }
    Ok(url.into())
}

/// `site_offline_after` when not configured: three minutes, as the source system's 180 s.
pub const DEFAULT_SITE_OFFLINE_AFTER: Duration = Duration::from_secs(180);

impl Default for Config {
    fn default() -> Self {
        Self {
            listen_addr: SocketAddr::from(([127, 0, 0, 1], 50051)),
            metrics_listen: None,
            database: "sqlite://var/central.db".into(),
            node_id: None,
            dispatcher: DispatcherConfig::default(),
            smtp: None,
            webhook: None,
            lists: Vec::new(),
            secrets: SecretsConfig::default(),
            kpis: KpiConfig::default(),
            retention: RetentionConfig::default(),
            shutdown_timeout: Duration::from_secs(10),
            health_check_interval: Duration::from_secs(5),
            site_offline_after: DEFAULT_SITE_OFFLINE_AFTER,
            tls: TlsConfig::default(),
            log: LogConfig::default(),
            auth: AuthConfig::default(),
            server: ServerConfig::default(),
            console: ConsoleConfig::default(),
            self_alerts: None,
            acknowledgement: AcknowledgementConfig::default(),
            status_callbacks: StatusCallbacksConfig::default(),
            test_faults: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DispatcherConfig {
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// Unset: a third of `lease_ttl`.
    #[serde(default, with = "humantime_serde")]
    pub renew_interval: Option<Duration>,
    #[serde(with = "humantime_serde")]
    pub claim_timeout: Duration,
    /// Removed: the dispatcher always wakes on events. Still read so that a file written for
    /// an older version that says `true` keeps working; `false` (the timer-only loop) is
    /// refused with a message saying so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wake_on_events: Option<bool>,
    /// Rows claimed per claim and channel; unset: the free delivery slots, two per connection
    /// and what the connections start during one claim's latency, queued locally.
    pub claim_batch: Option<usize>,
    /// Transient failures in a row at a relay that move the email channel to its next fallback
    /// relay (`domain::failover`).
    pub failover_after_failures: u32,
    /// Failing this long (every attempt transient) moves the channel on even before
    /// `failover_after_failures`.
    #[serde(with = "humantime_serde")]
    pub failover_after: Duration,
    /// How often the first relay is probed while the channel is on a fallback.
    #[serde(with = "humantime_serde")]
    pub failover_probe_interval: Duration,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(1),
            lease_ttl: Duration::from_secs(15),
            renew_interval: None,
            wake_on_events: None,
            claim_batch: None,
            claim_timeout: Duration::from_secs(120),
            failover_after_failures: FailoverPolicy::default().after_failures,
            failover_after: FailoverPolicy::default().after_failing_for,
            failover_probe_interval: FailoverPolicy::default().probe_every,
        }
    }
}

/// How the KPIs (GetKpis and `/metrics`) are computed. Display only: nothing here changes what
/// the dispatcher does.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KpiConfig {
    /// A Pending/Retrying notification older than this counts as stuck.
    #[serde(with = "humantime_serde")]
    pub stuck_age_threshold: Duration,
    /// The trailing window of the "delivered recently" figure.
    #[serde(with = "humantime_serde")]
    pub delivered_kpi_window: Duration,
}

impl Default for KpiConfig {
    fn default() -> Self {
        Self {
            stuck_age_threshold: Duration::from_secs(10 * 60),
            delivered_kpi_window: Duration::from_secs(60),
        }
    }
}

/// The purge of old terminal notifications.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Delivered, Parked and Discarded rows resolved longer ago than this are deleted.
    #[serde(with = "humantime_serde")]
    pub terminal_retention: Duration,
    /// How often the purge runs (on the dispatcher lease holder only).
    #[serde(with = "humantime_serde")]
    pub purge_interval: Duration,
    /// Rows deleted per transaction, so a large purge never holds the write lock for long.
    pub purge_batch_size: u32,
    /// A site node whose latest health report is this old is forgotten (by the purge): it no
    /// longer shows in ListSiteHealth or `/metrics` and frees its place among its site's 16.
    #[serde(with = "humantime_serde")]
    pub site_health_retention: Duration,
    /// A final status no site took (WatchSiteStatus) within this is dropped, as is the watch
    /// of a site not heard from for as long; the site then asks central when GetStatus is
    /// called.
    #[serde(with = "humantime_serde")]
    pub site_status_keep: Duration,
}

/// `retention.site_status_keep` when not configured: 7 days, a long outage of a site's link.
pub const DEFAULT_SITE_STATUS_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);
/// The shortest `retention.site_status_keep`: an hour (a stream renews its watch every ten
/// minutes), and the longest: a year, the terminal rows' default retention.
pub const SITE_STATUS_KEEP_RANGE: (Duration, Duration) = (
    Duration::from_secs(3600),
    Duration::from_secs(365 * 24 * 3600),
);

/// `retention.site_health_retention` when not configured: 30 days. Long enough that a site down
/// for a long outage stays on screen (offline) and keeps its alert firing well past any holiday;
/// short enough that a renamed or retired node leaves within a month.
pub const DEFAULT_SITE_HEALTH_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// The longest `retention.site_health_retention`: ten years (the MS SQL statement binds it in
/// seconds as an int, which holds 68 years).
pub const MAX_SITE_HEALTH_RETENTION: Duration = Duration::from_secs(3650 * 24 * 3600);

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            terminal_retention: Duration::from_secs(365 * 24 * 3600),
            purge_interval: Duration::from_secs(24 * 3600),
            purge_batch_size: 1000,
            site_health_retention: DEFAULT_SITE_HEALTH_RETENTION,
            site_status_keep: DEFAULT_SITE_STATUS_KEEP,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmtpConfig {
    pub host: String,
    #[serde(default = "default_smtp_port")]
    pub port: u16,
    #[serde(default = "default_tls")]
    pub tls: SmtpTls,
    #[serde(default)]
    pub username: Option<String>,
    /// PLAIN/LOGIN password; leave unset when `oauth` is set (XOAUTH2).
    #[serde(default)]
    pub password: Option<String>,
    /// XOAUTH2 through an OAuth2 client-credentials grant, instead of a password.
    #[serde(default)]
    pub oauth: Option<OAuthConfig>,
    pub from_address: String,
    /// Retries after the first attempt; the failure of the last parks (so N + 1 attempts).
    #[serde(default = "default_max_retries")]
    pub max_retries: i64,
    #[serde(default = "default_retry_delay", with = "humantime_serde")]
    pub retry_delay: Duration,
    #[serde(default = "default_backoff")]
    pub backoff: BackoffKind,
    #[serde(default = "default_max_retry_delay", with = "humantime_serde")]
    pub max_retry_delay: Duration,
    #[serde(default = "default_max_connections")]
    pub max_concurrent_connections: u32,
    /// Deliveries per second on average; unset means no limit.
    #[serde(default)]
    pub rate_limit_per_second: Option<f64>,
    /// Deliveries allowed at once above the average; default: one second's worth.
    #[serde(default)]
    pub rate_limit_burst: Option<u32>,
    /// Connect and per-command timeout.
    #[serde(default = "default_smtp_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Longest one whole delivery may take.
    #[serde(default = "default_overall_timeout", with = "humantime_serde")]
    pub overall_timeout: Duration,
    /// Relays to fail over to, in order, each `host:port tls`, reached without authentication
    /// (`domain::smtp_relay`).
    #[serde(default)]
    pub fallback_relays: Vec<String>,
}

impl SmtpConfig {
    /// A relay at `host:port` sending as `from_address`, every other key at its default.
    pub fn new(host: impl Into<String>, port: u16, from_address: impl Into<String>) -> Self {
        Self {
            host: host.into(),
            port,
            tls: default_tls(),
            username: None,
            password: None,
            oauth: None,
            from_address: from_address.into(),
            max_retries: default_max_retries(),
            retry_delay: default_retry_delay(),
            backoff: default_backoff(),
            max_retry_delay: default_max_retry_delay(),
            max_concurrent_connections: default_max_connections(),
            rate_limit_per_second: None,
            rate_limit_burst: None,
            timeout: default_smtp_timeout(),
            overall_timeout: default_overall_timeout(),
            fallback_relays: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    pub token_url: String,
    pub client_id: String,
    /// Better given as OUTBOX_CENTRAL_SMTP__OAUTH__CLIENT_SECRET.
    pub client_secret: String,
    #[serde(default)]
    pub scope: String,
}

// The serde defaults of `[smtp]`: each is the domain's (`domain::channel::defaults`), so the
// file, the admin API and the dispatcher agree on what an unset key means.
fn default_smtp_port() -> u16 {
    defaults::SMTP_PORT
}
fn default_tls() -> SmtpTls {
    SmtpTls::from(defaults::SMTP_TLS)
}
fn default_max_retries() -> i64 {
    i64::from(defaults::MAX_RETRIES)
}
fn default_retry_delay() -> Duration {
    defaults::RETRY_DELAY
}
fn default_backoff() -> BackoffKind {
    BackoffKind::from(defaults::SMTP_BACKOFF)
}
fn default_max_retry_delay() -> Duration {
    defaults::MAX_RETRY_DELAY
}
fn default_max_connections() -> u32 {
    defaults::SMTP_MAX_CONNECTIONS
}
fn default_smtp_timeout() -> Duration {
    defaults::SMTP_TIMEOUT
}
fn default_overall_timeout() -> Duration {
    defaults::SMTP_OVERALL_TIMEOUT
}

/// The webhook channel. Lists (with their endpoints) are configured like email lists.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookConfig {
    /// Longest one POST may take.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    pub max_retries: i64,
    #[serde(with = "humantime_serde")]
    pub retry_delay: Duration,
    pub backoff: BackoffKind,
    #[serde(with = "humantime_serde")]
    pub max_retry_delay: Duration,
    pub max_concurrent_connections: u32,
    pub rate_limit_per_second: Option<f64>,
    pub rate_limit_burst: Option<u32>,
}

impl Default for WebhookConfig {
    /// The domain's defaults (`WebhookSettings::default`), as file keys.
    fn default() -> Self {
        let d = WebhookSettings::default();
        let max_retry_delay = match d.policy.backoff {
            Backoff::Exponential { cap } => cap,
            Backoff::Fixed => defaults::MAX_RETRY_DELAY,
        };
        Self {
            timeout: d.timeout,
            max_retries: d.policy.max_retries,
            retry_delay: d.policy.retry_delay,
            backoff: BackoffKind::from(d.policy.backoff),
            max_retry_delay,
            max_concurrent_connections: d.policy.max_concurrent_connections,
            rate_limit_per_second: d.policy.rate_limit.map(|r| r.per_second()),
            rate_limit_burst: d.policy.rate_limit.map(|r| r.burst()),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListConfig {
    pub name: String,
    #[serde(default, rename = "type")]
    pub kind: ListType,
    /// Email lists: the addresses.
    #[serde(default)]
    pub recipients: Vec<String>,
    /// Webhook lists: the endpoint URLs (https, or http to loopback).
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Webhook lists with one endpoint: where attempts go while it fails (transient failures
    /// only), in order; at most 4, each checked as an endpoint is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback_urls: Vec<String>,
    /// Webhook lists; unset: `generic`.
    #[serde(default)]
    pub webhook_format: Option<WebhookFormatKind>,
    /// Webhook lists: HMAC-SHA256 signing key (at least 16 characters).
    #[serde(default)]
    pub webhook_secret: Option<String>,
    /// Flood consolidation; unset: every notification goes out on its own.
    #[serde(default)]
    pub consolidation: Option<ConsolidationConfig>,
    /// Escalation until acknowledged; unset: the list's alarms open no incident.
    #[serde(default)]
    pub escalation: Option<EscalationConfig>,
    /// Any list: the endpoint told every final status of its notifications (signed with
    /// `status_callbacks.key`); unset: none.
    #[serde(default)]
    pub status_callback_url: Option<String>,
}

/// `lists[].escalation`: the list's alarms (at `priorities`) open an incident, and while nobody
/// acknowledges it each step pages its lists after the previous page waited; the rules and
/// limits are `domain::escalation`, checked where the lists are converted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EscalationConfig {
    /// `critical`, `high`, `normal`; unset: critical and high.
    #[serde(default)]
    pub priorities: Vec<String>,
    /// How long the alarm itself (step 1) waits for an acknowledgement.
    #[serde(with = "humantime_serde")]
    pub acknowledge_within: Duration,
    /// Steps 2, 3, ...: the lists each pages, and how long it waits.
    #[serde(default)]
    pub steps: Vec<EscalationStepConfig>,
    /// Rounds after the first, 0 to 9.
    #[serde(default)]
    pub repeat: u32,
    /// The step a repeat starts from; unset: 1 (the alarm's own list again).
    #[serde(default)]
    pub repeat_from_step: Option<u32>,
    /// Page the next step at once when a page's delivery parks; unset: true.
    #[serde(default)]
    pub escalate_on_park: Option<bool>,
    /// Page again from step 1 this long after an acknowledgement while the condition is not
    /// cleared; unset: never.
    #[serde(default, with = "humantime_serde")]
    pub acknowledgement_reminder: Option<Duration>,
    /// Tell every list the incident reached, once, who acknowledged it; unset: false.
    #[serde(default)]
    pub notify_acknowledgement: Option<bool>,
}

/// One step of `lists[].escalation.steps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EscalationStepConfig {
    pub notify: Vec<String>,
    #[serde(with = "humantime_serde")]
    pub wait: Duration,
}

/// `lists[].consolidation`: more than `threshold` notifications for the list within one
/// `window` are held and go out at the window's end as digests of at most `max_per_digest`.
/// All three keys are required: a half-set table is a typo, not a request for defaults. The
/// limits are `domain::consolidation::limits`, checked where the lists are converted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsolidationConfig {
    pub threshold: u32,
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    pub max_per_digest: u32,
}

impl ListConfig {
    /// An email list.
    pub fn email(name: impl Into<String>, recipients: Vec<String>) -> Self {
        Self {
            name: name.into(),
            kind: ListType::Email,
            recipients,
            endpoints: Vec::new(),
            fallback_urls: Vec::new(),
            webhook_format: None,
            webhook_secret: None,
            consolidation: None,
            escalation: None,
            status_callback_url: None,
        }
    }

    /// A webhook list posting in `format`.
    pub fn webhook(
        name: impl Into<String>,
        endpoints: Vec<String>,
        format: WebhookFormatKind,
    ) -> Self {
        Self {
            name: name.into(),
            kind: ListType::Webhook,
            recipients: Vec::new(),
            endpoints,
            fallback_urls: Vec::new(),
            webhook_format: Some(format),
            webhook_secret: None,
            consolidation: None,
            escalation: None,
            status_callback_url: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A tracing `EnvFilter` directive; `RUST_LOG` wins when set.
    pub filter: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            filter: "info".into(),
        }
    }
}

/// `smtp.tls`: how the SMTP connection is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmtpTls {
    /// Plain text.
    None,
    /// Plain text upgraded by STARTTLS, which the server must offer.
    StartTls,
    /// TLS from the first byte (usually port 465).
    Tls,
}

impl From<TlsMode> for SmtpTls {
    fn from(tls: TlsMode) -> Self {
        match tls {
            TlsMode::None => Self::None,
            TlsMode::StartTls => Self::StartTls,
            TlsMode::Implicit => Self::Tls,
        }
    }
}

impl From<SmtpTls> for TlsMode {
    fn from(tls: SmtpTls) -> Self {
        match tls {
            SmtpTls::None => Self::None,
            SmtpTls::StartTls => Self::StartTls,
            SmtpTls::Tls => Self::Implicit,
        }
    }
}

/// `smtp.backoff` and `webhook.backoff`: how the delay grows between retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackoffKind {
    /// `retry_delay` every time.
    Fixed,
    /// Doubling from `retry_delay` with full jitter, capped at `max_retry_delay`.
    Exponential,
}

impl From<Backoff> for BackoffKind {
    fn from(backoff: Backoff) -> Self {
        match backoff {
            Backoff::Fixed => Self::Fixed,
            Backoff::Exponential { .. } => Self::Exponential,
        }
    }
}

/// `lists[].type`: the channel a list delivers on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListType {
    #[default]
    Email,
    Webhook,
}

impl From<ListType> for NotificationType {
    fn from(kind: ListType) -> Self {
        match kind {
            ListType::Email => Self::Email,
            ListType::Webhook => Self::Webhook,
        }
    }
}

/// `lists[].webhook_format`: the body shape a webhook list's endpoints expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebhookFormatKind {
    Generic,
    Teams,
    Slack,
}

impl From<WebhookFormatKind> for WebhookFormat {
    fn from(format: WebhookFormatKind) -> Self {
        match format {
            WebhookFormatKind::Generic => Self::Generic,
            WebhookFormatKind::Teams => Self::Teams,
            WebhookFormatKind::Slack => Self::Slack,
        }
    }
}

/// `log.format`: the shape of log lines on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Command-line values that override the file and the environment.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Overrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen_addr: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
}

/// Where the central store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    Sqlite(PathBuf),
    /// `mssql://...` or an ADO.NET-style `server=...;database=...` string (its `Debug` hides
    /// the password).
    MsSql(MsSqlOptions),
}

/// What start-up does with the file's `[smtp]`, `[webhook]` and `[[lists]]` (see `bootstrap`).
/// The database is the authority for channel settings and lists; the file only fills it in,
/// unless an operator asks for the file to win, once, with `--apply-config`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ApplyChannels {
    /// Store what the file names and the database lacks; keep everything stored.
    #[default]
    SeedMissing,
    /// Write what the file names over what is stored (`central-outbox --apply-config`).
    /// Settings and lists the file does not name are kept.
    ReplaceStored,
}

/// A checked configuration, in domain types.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen_addr: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub database: DatabaseUrl,
    pub dispatcher: DispatcherSettings,
    pub smtp: Option<SmtpSettings>,
    pub webhook: Option<WebhookSettings>,
    pub lists: Vec<NotificationList>,
    /// What the file's channel settings and lists do to the stored ones at start-up: seed
    /// what is missing (the default), or replace (`central-outbox --apply-config`).
    pub apply_channels: ApplyChannels,
    pub secrets: Keyring,
    pub kpis: KpiSettings,
    pub purge: PurgeSettings,
    pub shutdown_timeout: Duration,
    pub health_check_interval: Duration,
    pub site_offline_after: Duration,
    pub tls: TlsSettings,
    pub auth: Authenticator,
    pub server: ServerConfig,
    /// The web console, when `console.listen` is set.
    pub console: Option<ConsoleSettings>,
    /// Central's alerts about itself, when `[self_alerts]` is set.
    pub self_alerts: Option<SelfAlertSettings>,
    /// Acknowledgement links, when `acknowledgement.link_base_url` is set.
    pub ack_links: Option<AckLinkSettings>,
    /// The status callbacks' key and bounds.
    pub status_callbacks: StatusCallbackSettings,
    /// Supervised task starts that fail on purpose (debug builds' tests only).
    pub faults: FaultPlan,
}

impl Config {
    /// Reads the file (if any), then the environment, then `overrides`.
    pub fn load(path: Option<&Path>, overrides: Overrides) -> anyhow::Result<Self> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = path {
            if !path.exists() {
                bail!("config file {} does not exist", path.display());
            }
            figment = figment.merge(Toml::file(path));
        }
        figment
            .merge(Env::prefixed("OUTBOX_CENTRAL_").split("__"))
            .merge(Serialized::defaults(overrides))
            .extract()
            .context("invalid configuration")
    }

    /// Checks every value and converts to domain types; errors name the key.
    pub fn validate(&self) -> anyhow::Result<Settings> {
        let database = parse_database(&self.database)?;
        let d = &self.dispatcher;
        if d.poll_interval.is_zero() {
            bail!("dispatcher.poll_interval: must be positive");
        }
        if d.lease_ttl < Duration::from_secs(1) {
            bail!("dispatcher.lease_ttl: must be at least 1s");
        }
        let renew_interval = d.renew_interval.unwrap_or(d.lease_ttl / 3);
        if renew_interval.is_zero() || renew_interval * 2 > d.lease_ttl {
            bail!("dispatcher.renew_interval: must be positive and at most half of lease_ttl");
        }
        if d.wake_on_events == Some(false) {
            bail!(
                "dispatcher.wake_on_events: the timer-only dispatcher was removed (the dispatcher \
                 always wakes on ingest and finished deliveries); remove the key"
            );
        }
        if d.claim_batch == Some(0) || d.claim_batch.is_some_and(|n| n > 10_000) {
            bail!("dispatcher.claim_batch: must be between 1 and 10000");
        }
        if d.claim_timeout < Duration::from_secs(2) {
            bail!("dispatcher.claim_timeout: must be at least 2s");
        }
        let failover = failover_policy(d)?;
        let node_id = match &self.node_id {
            Some(id) if id.trim().is_empty() => bail!("node_id: must not be empty"),
            Some(id) => id.clone(),
            None => format!("central-{}", uuid::Uuid::new_v4().simple()),
        };
        if self.health_check_interval < Duration::from_millis(100) {
            bail!("health_check_interval: must be at least 100ms");
        }
        if self.site_offline_after < Duration::from_secs(1) {
            bail!("site_offline_after: must be at least 1s");
        }
        let k = &self.kpis;
        if k.stuck_age_threshold.is_zero() {
            bail!("kpis.stuck_age_threshold: must be positive");
        }
        if k.delivered_kpi_window.is_zero() {
            bail!("kpis.delivered_kpi_window: must be positive");
        }
        let r = &self.retention;
        if r.terminal_retention.is_zero() {
            bail!("retention.terminal_retention: must be positive");
        }
        if r.purge_interval < Duration::from_secs(1) {
            bail!("retention.purge_interval: must be at least 1s");
        }
        if !(1..=100_000).contains(&r.purge_batch_size) {
            bail!("retention.purge_batch_size: must be between 1 and 100000");
        }
        // Longer than the offline threshold, so a silent node is shown offline (and alerted
        // on) before it is forgotten.
        if r.site_health_retention <= self.site_offline_after
            || r.site_health_retention > MAX_SITE_HEALTH_RETENTION
        {
            bail!(
                "retention.site_health_retention: must be longer than site_offline_after ({}) \
                 and at most {}, so a silent node is shown offline before it is forgotten",
                humantime::format_duration(self.site_offline_after),
                humantime::format_duration(MAX_SITE_HEALTH_RETENTION)
            );
        }
        let (shortest, longest) = SITE_STATUS_KEEP_RANGE;
        if !(shortest..=longest).contains(&r.site_status_keep) {
            bail!(
                "retention.site_status_keep: must be between {} and {}",
                humantime::format_duration(shortest),
                humantime::format_duration(longest)
            );
        }
        let tls = self.tls.load()?;
        tls.plaintext_exposure(self.listen_addr)?;
        let smtp = self.smtp.as_ref().map(smtp_settings).transpose()?;
        let webhook = self.webhook.as_ref().map(webhook_settings).transpose()?;
        let lists = self
            .lists
            .iter()
            .enumerate()
            .map(|(i, list)| list_settings(i, list))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let secrets = Keyring::load(&self.secrets)?;
        let status_callbacks = self.status_callbacks.validate()?;
        if status_callbacks.key.is_none()
            && let Some(i) = lists.iter().position(|l| l.status_callback.is_some())
        {
            bail!(
                "lists[{i}].status_callback_url: the calls are signed and no \
                 status_callbacks.key is configured; set status_callbacks.key_file (or \
                 OUTBOX_CENTRAL_STATUS_CALLBACKS__KEY) to a key of at least 16 characters"
            );
        }
        // A secret in this file is stored encrypted; without a key it would be stored in clear.
        let file_secret = match &self.smtp {
            Some(smtp) if smtp.password.is_some() => Some("smtp.password".to_owned()),
            Some(smtp) if smtp.oauth.is_some() => Some("smtp.oauth.client_secret".to_owned()),
            _ => self
                .lists
                .iter()
                .position(|l| l.webhook_secret.is_some())
                .map(|i| format!("lists[{i}].webhook_secret")),
        };
        if let Some(key) = file_secret.filter(|_| !secrets.can_seal()) {
            bail!(
                "{key}: secrets are stored encrypted and no [secrets] key is configured; set \
                 secrets.key_file (or OUTBOX_CENTRAL_SECRETS__KEY) to a 32-byte key in base64, \
                 e.g. from `openssl rand -base64 32`"
            );
        }
        let auth = Authenticator::from_config(&self.auth)?;
        self.server.validate()?;
        let console = self.console.validate()?;
        if let Some(console) = &console {
            // The console's port carries tokens at login and session cookies: the same rule
            // as the gRPC port, under its own key.
            if !tls.serves_tls() && !console.listen.ip().is_loopback() && !tls.allows_plaintext() {
                bail!(
                    "console.listen: {} is not a loopback address and tls is not configured; \
                     set tls.cert and tls.key to serve the console over TLS, or \
                     tls.allow_plaintext = true",
                    console.listen
                );
            }
        }
        let ack_links = self
            .acknowledgement
            .validate(console.map(|c| c.listen), &secrets)?;
        if let Some(listen) = ack_links.as_ref().and_then(|a| a.listen)
            && !tls.serves_tls()
            && !listen.ip().is_loopback()
            && !tls.allows_plaintext()
        {
            bail!(
                "acknowledgement.listen: {listen} is not a loopback address and tls is not \
                 configured; set tls.cert and tls.key to serve the links over TLS, or \
                 tls.allow_plaintext = true (behind a TLS-terminating proxy)"
            );
        }
        let faults = FaultPlan::from_setting(self.test_faults.as_deref())
            .map_err(|e| anyhow::anyhow!("test_faults: {e}"))?;
        let self_alerts = self
            .self_alerts
            .as_ref()
            .map(|s| s.validate(&lists, renew_interval))
            .transpose()?;
        Ok(Settings {
            faults,
            self_alerts,
            ack_links,
            status_callbacks,
            console,
            auth,
            server: self.server,
            listen_addr: self.listen_addr,
            metrics_listen: self.metrics_listen,
            database,
            dispatcher: DispatcherSettings {
                node_id,
                poll_interval: d.poll_interval,
                lease_ttl: d.lease_ttl,
                renew_interval,
                claim_timeout: d.claim_timeout,
                claim_batch: d.claim_batch,
                drain_timeout: self.shutdown_timeout,
                failover,
            },
            smtp,
            webhook,
            lists,
            apply_channels: ApplyChannels::SeedMissing,
            secrets,
            kpis: KpiSettings {
                stuck_age_threshold: k.stuck_age_threshold,
                delivered_window: k.delivered_kpi_window,
            },
            purge: PurgeSettings {
                terminal_retention: r.terminal_retention,
                site_health_retention: r.site_health_retention,
                site_status_keep: r.site_status_keep,
                interval: r.purge_interval,
                batch_size: r.purge_batch_size,
            },
            shutdown_timeout: self.shutdown_timeout,
            health_check_interval: self.health_check_interval,
            site_offline_after: self.site_offline_after,
            tls,
        })
    }
}

/// The failover rule's numbers, within [`failover_bounds`].
fn failover_policy(d: &DispatcherConfig) -> anyhow::Result<FailoverPolicy> {
    use failover_bounds::{MAX_AFTER_FAILURES, MAX_INTERVAL, MIN_INTERVAL};
    if !(1..=MAX_AFTER_FAILURES).contains(&d.failover_after_failures) {
        bail!("dispatcher.failover_after_failures: must be between 1 and {MAX_AFTER_FAILURES}");
    }
    for (key, value) in [
        ("failover_after", d.failover_after),
        ("failover_probe_interval", d.failover_probe_interval),
    ] {
        if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&value) {
            bail!(
                "dispatcher.{key}: must be between {} and {}",
                humantime::format_duration(MIN_INTERVAL),
                humantime::format_duration(MAX_INTERVAL)
            );
        }
    }
    Ok(FailoverPolicy {
        after_failures: d.failover_after_failures,
        after_failing_for: d.failover_after,
        probe_every: d.failover_probe_interval,
    })
}

/// The bounds of the failover settings.
pub mod failover_bounds {
    use std::time::Duration;

    /// More failures in a row than this would keep a channel on a dead relay for longer than
    /// any alarm should wait.
    pub const MAX_AFTER_FAILURES: u32 = 100;
    /// A probe more often than once a second would be load on a relay that is trying to
    /// recover; the same floor keeps a failing-for time meaningful.
    pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
    /// Longer than an hour on a fallback before the first relay is looked at again, or of
    /// failing before moving, is an outage nobody would accept.
    pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);
}

fn parse_database(url: &str) -> anyhow::Result<DatabaseUrl> {
    if MsSqlOptions::recognises(url) {
        // The error names the connection-string key; it never repeats the string, which
        // holds the password.
        return MsSqlOptions::parse(url)
            .map(DatabaseUrl::MsSql)
            .map_err(|e| anyhow::anyhow!("database: MS SQL connection string: {e}"));
    }
    match url.split_once("://") {
        Some(("sqlite", path)) if !path.is_empty() => Ok(DatabaseUrl::Sqlite(PathBuf::from(path))),
        Some(("sqlite", _)) => {
            bail!("database: sqlite:// needs a file path, e.g. sqlite://var/central.db")
        }
        Some((scheme, _)) => bail!(
            "database: the {scheme:?} backend is not available in this build; use sqlite://PATH \
             or mssql://USER:PASSWORD@HOST:PORT/DATABASE"
        ),
        // Not echoed: a mistyped connection string may hold a password.
        None => bail!(
            "database: not a URL; use sqlite://PATH, mssql://USER:PASSWORD@HOST:PORT/DATABASE \
             or server=HOST,PORT;database=NAME;user id=USER;password=PASSWORD"
        ),
    }
}

/// The pacing and retry keys both channels share, as one struct for one conversion.
struct PolicyKeys {
    section: &'static str,
    max_retries: i64,
    retry_delay: Duration,
    backoff: BackoffKind,
    max_retry_delay: Duration,
    max_concurrent_connections: u32,
    rate_limit_per_second: Option<f64>,
    rate_limit_burst: Option<u32>,
}

fn delivery_policy(k: PolicyKeys) -> anyhow::Result<DeliveryPolicy> {
    let section = k.section;
    let backoff = match k.backoff {
        BackoffKind::Fixed => Backoff::Fixed,
        BackoffKind::Exponential => Backoff::Exponential {
            cap: k.max_retry_delay,
        },
    };
    let rate_limit = RateLimit::parse(k.rate_limit_per_second, k.rate_limit_burst)
        .map_err(|e| anyhow::anyhow!("{section}.{e}"))?;
    Ok(DeliveryPolicy {
        // Non-positive retry settings are not refused here: the retry policy clamps them to
        // 10 retries / 1 min with a warning, so a typo still retries instead of parking at once.
        max_retries: k.max_retries,
        retry_delay: k.retry_delay,
        backoff,
        max_concurrent_connections: k.max_concurrent_connections,
        rate_limit,
    })
}

fn smtp_settings(c: &SmtpConfig) -> anyhow::Result<SmtpSettings> {
    let tls = TlsMode::from(c.tls);
    let auth = match (&c.username, &c.password, &c.oauth) {
        (None, None, None) => SmtpAuth::None,
        (Some(username), Some(password), None) => SmtpAuth::Password {
            username: username.clone(),
            password: Secret::new(password.clone()),
        },
        (Some(username), None, Some(oauth)) => SmtpAuth::XOAuth2 {
            username: username.clone(),
            oauth: OAuthClientCredentials {
                token_url: oauth.token_url.clone(),
                client_id: oauth.client_id.clone(),
                client_secret: Secret::new(oauth.client_secret.clone()),
                scope: oauth.scope.clone(),
            },
        },
        (_, Some(_), Some(_)) => bail!("smtp.password and smtp.oauth: set one, not both"),
        _ => {
            bail!("smtp.username: set it with smtp.password (PLAIN/LOGIN) or smtp.oauth (XOAUTH2)")
        }
    };
    let from_address = EmailAddress::parse(&c.from_address, "from_address")
        .map_err(|e| anyhow::anyhow!("smtp.{e}"))?;
    let policy = delivery_policy(PolicyKeys {
        section: "smtp",
        max_retries: c.max_retries,
        retry_delay: c.retry_delay,
        backoff: c.backoff,
        max_retry_delay: c.max_retry_delay,
        max_concurrent_connections: c.max_concurrent_connections,
        rate_limit_per_second: c.rate_limit_per_second,
        rate_limit_burst: c.rate_limit_burst,
    })?;
    let fallback_relays = SmtpRelay::parse_each(c.fallback_relays.iter().map(String::as_str))
        .map_err(|e| anyhow::anyhow!("smtp.{e}"))?;
    SmtpSettings {
        host: c.host.clone(),
        port: c.port,
        tls,
        auth,
        from_address,
        timeout: c.timeout,
        overall_timeout: c.overall_timeout,
        policy,
        fallback_relays,
    }
    .check()
    // The domain names the OAuth settings as the admin API's fields; the file nests them.
    .map_err(|e| {
        let key = match e.field {
            "oauth_token_url" => "oauth.token_url",
            "oauth_client_id" => "oauth.client_id",
            "oauth_client_secret" => "oauth.client_secret",
            other => other,
        };
        anyhow::anyhow!("smtp.{key}: {}", e.problem)
    })
}

fn webhook_settings(c: &WebhookConfig) -> anyhow::Result<WebhookSettings> {
    let policy = delivery_policy(PolicyKeys {
        section: "webhook",
        max_retries: c.max_retries,
        retry_delay: c.retry_delay,
        backoff: c.backoff,
        max_retry_delay: c.max_retry_delay,
        max_concurrent_connections: c.max_concurrent_connections,
        rate_limit_per_second: c.rate_limit_per_second,
        rate_limit_burst: c.rate_limit_burst,
    })?;
    WebhookSettings {
        timeout: c.timeout,
        policy,
    }
    .check()
    .map_err(|e| anyhow::anyhow!("webhook.{e}"))
}

/// `lists[].escalation` as a checked policy; errors name the key (`escalation.steps`, ...).
fn escalation_policy(c: &EscalationConfig) -> Result<EscalationPolicy, ContentError> {
    let priorities = c
        .priorities
        .iter()
        .map(|p| {
            Priority::parse_name(p).ok_or_else(|| {
                ContentError::new(
                    "escalation.priorities",
                    format!("{p:?} is not a priority (critical, high or normal)"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    EscalationPolicy::parse(PolicyInput {
        priorities,
        acknowledge_within: c.acknowledge_within,
        steps: c.steps.iter().map(|s| (s.notify.clone(), s.wait)).collect(),
        repeat: c.repeat,
        repeat_from_step: c.repeat_from_step,
        escalate_on_park: c.escalate_on_park,
        acknowledgement_reminder: c.acknowledgement_reminder,
        notify_acknowledgement: c.notify_acknowledgement,
    })
}

fn list_settings(index: usize, c: &ListConfig) -> anyhow::Result<NotificationList> {
    let consolidation = c
        .consolidation
        .map(|k| Consolidation::parse(k.threshold, k.window, k.max_per_digest))
        .transpose()
        .map_err(|e| anyhow::anyhow!("lists[{index}].{e}"))?;
    let escalation = c
        .escalation
        .as_ref()
        .map(escalation_policy)
        .transpose()
        .map_err(|e| anyhow::anyhow!("lists[{index}].{}: {}", e.field, e.problem))?;
    NotificationList::parse(ListInput {
        name: c.name.clone(),
        kind: Some(c.kind.into()),
        recipients: c.recipients.clone(),
        endpoints: c.endpoints.clone(),
        fallback_urls: c.fallback_urls.clone(),
        webhook_format: c.webhook_format.map(WebhookFormat::from),
        webhook_secret: c.webhook_secret.clone(),
        consolidation,
        escalation,
        status_callback_url: c.status_callback_url.clone(),
    })
    // The domain names a list's name as a submit's field; the file's key is `name`.
    .map_err(|e| {
        let key = match e.field {
            "list_name" => "name",
            other => other,
        };
        anyhow::anyhow!("lists[{index}].{key}: {}", e.problem)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_toml(text: &str) -> anyhow::Result<Settings> {
        let config: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(text))
            .extract()?;
        config.validate()
    }

    #[test]
    fn self_alerts_are_off_unless_configured_and_every_key_is_checked_by_name() {
        assert!(from_toml("").unwrap().self_alerts.is_none());
        let on = from_toml("[self_alerts]\nemail_list = 'ops'\n")
            .unwrap()
            .self_alerts
            .unwrap();
        assert_eq!(on.routes.email.unwrap().as_str(), "ops");
        assert_eq!(on.routes.webhook, None);
        assert_eq!(on.check_interval, Duration::from_secs(15));
        assert_eq!(on.certificate_expiry, Duration::from_secs(14 * 24 * 3600));
        assert_eq!(on.heartbeat, None);
        let beat = from_toml(
            "[self_alerts]\nheartbeat_url = 'https://hc-ping.test/0f1e'\nheartbeat_interval = '30s'\n",
        )
        .unwrap()
        .self_alerts
        .unwrap();
        assert!(beat.routes.is_empty());
        assert_eq!(beat.heartbeat.unwrap().interval, Duration::from_secs(30));
        let hooks =
            "[[lists]]\nname = 'hooks'\ntype = 'webhook'\nendpoints = ['https://h.test/a']\n";
        for (toml, message) in [
            (
                "",
                "self_alerts: name email_list, webhook_list or heartbeat_url (or leave the \
                 section out: self-alerts are off without it)",
            ),
            (
                "email_list = 'ops'\ncheck_interval = '0s'",
                "self_alerts.check_interval: must be between 100ms and 1h, not 0s",
            ),
            (
                "email_list = 'ops'\nrecover_after = '2h'",
                "self_alerts.recover_after: must be between 0s and 1h, not 2h",
            ),
            (
                "email_list = 'ops'\nchannel_max_wait = '8days'",
                "self_alerts.channel_max_wait: must be between 1s and 7days, not 8days",
            ),
            (
                "email_list = 'ops'\nchannel_failures = 0",
                "self_alerts.channel_failures: must be between 1 and 1000, not 0",
            ),
            (
                "email_list = 'ops'\nparked_rise = 0",
                "self_alerts.parked_rise: must be between 1 and 1000000, not 0",
            ),
            (
                "email_list = 'ops'\ntask_restarts = 5000",
                "self_alerts.task_restarts: must be between 1 and 1000, not 5000",
            ),
            (
                "email_list = 'ops'\ncertificate_expiry_days = 400",
                "self_alerts.certificate_expiry_days: must be between 1 and 365, not 400",
            ),
            (
                "email_list = 'ops'\nheartbeat_url = 'https://hc.test/x'\nheartbeat_interval = '2h'",
                "self_alerts.heartbeat_interval: must be between 1s and 1h, not 2h",
            ),
            (
                "heartbeat_url = 'http://hc.test/x'",
                "self_alerts.heartbeat_url: plain http:// is only allowed to a loopback \
                 address; use https",
            ),
            (
                "heartbeat_url = 'https://user:pw@hc.test/x'",
                "self_alerts.heartbeat_url: must not carry credentials (user:password@)",
            ),
            (
                "email_list = ' ops'",
                "self_alerts.email_list: must not start or end with whitespace",
            ),
            (
                "email_list = 'hooks'",
                "self_alerts.email_list: list \"hooks\" is a Webhook list; name an Email list",
            ),
            (
                "email_list = 'ops'\nno_leader_after = '5s'",
                "self_alerts.no_leader_after: must be at least twice dispatcher.renew_interval \
                 (10s): a lease can be free that long between two nodes' attempts to take it",
            ),
        ] {
            let err = from_toml(&format!("{hooks}[self_alerts]\n{toml}")).unwrap_err();
            assert_eq!(err.to_string(), message, "{toml}");
        }
        let err = from_toml("[self_alerts]\nemail_lists = 'ops'").unwrap_err();
        assert!(format!("{err:#}").contains("email_lists"), "{err:#}");
        let err = from_toml("[self_alerts]\nemail_list = 'ops'\nparked_rise = -1").unwrap_err();
        assert!(format!("{err:#}").contains("parked_rise"), "{err:#}");
    }

    #[test]
    fn the_console_is_off_by_default_and_checked_when_on() {
        assert_eq!(from_toml("").unwrap().console, None);
        let on = from_toml("[console]\nlisten = '127.0.0.1:8080'\n").unwrap();
        assert_eq!(
            on.console,
            Some(ConsoleSettings {
                listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
                idle_timeout: Duration::from_secs(30 * 60),
                lifetime: Duration::from_secs(12 * 3600),
            })
        );
        for (text, key) in [
            ("[console]\nlisten = 'nowhere'\n", "console"),
            ("[console]\nlisten = '0.0.0.0:8080'\n", "console.listen"),
            (
                "[console]\nlisten = '127.0.0.1:8080'\nsession_idle_timeout = '0s'\n",
                "console.session_idle_timeout",
            ),
            (
                "[console]\nlisten = '127.0.0.1:8080'\nsession_lifetime = '1m'\n",
                "console.session_lifetime",
            ),
            ("[console]\nport = 8080\n", "port"),
        ] {
            let err = format!("{:#}", from_toml(text).unwrap_err());
            assert!(err.contains(key), "{text}: {err}");
        }
    }

    #[test]
    fn defaults_are_valid() {
        let settings = from_toml("").unwrap();
        assert_eq!(
            settings.database,
            DatabaseUrl::Sqlite(PathBuf::from("var/central.db"))
        );
        assert_eq!(settings.dispatcher.poll_interval, Duration::from_secs(1));
    }

    #[test]
    fn server_keepalive_is_read_and_checked_by_name() {
        let defaults = from_toml("").unwrap().server;
        assert_eq!(
            (
                defaults.http2_keepalive_interval,
                defaults.http2_keepalive_timeout
            ),
            (Duration::from_secs(10), Duration::from_secs(20))
        );
        let set = from_toml(
            "[server]\nhttp2_keepalive_interval = '2s'\nhttp2_keepalive_timeout = '500ms'",
        )
        .unwrap()
        .server;
        assert_eq!(
            (set.http2_keepalive_interval, set.http2_keepalive_timeout),
            (Duration::from_secs(2), Duration::from_millis(500))
        );
        let err = from_toml("[server]\nhttp2_keepalive_timeout = '10ms'").unwrap_err();
        assert_eq!(
            err.to_string(),
            "server.http2_keepalive_timeout: must be at least 100ms"
        );
        let err = from_toml("[server]\nhttp2_keepalive = '1s'").unwrap_err();
        assert!(format!("{err:#}").contains("http2_keepalive"), "{err:#}");
    }

    #[test]
    fn server_limits_are_read_and_checked_by_name() {
        let defaults = from_toml("").unwrap().server;
        assert_eq!(
            (
                defaults.max_concurrent_streams,
                defaults.concurrency_limit_per_connection,
                defaults.max_ingest_streams
            ),
            (100, 16, 512)
        );
        let set = from_toml(
            "[server]\nmax_concurrent_streams = 1\nconcurrency_limit_per_connection = 256\n\
             max_ingest_streams = 4096",
        )
        .unwrap()
        .server;
        assert_eq!(
            (
                set.max_concurrent_streams,
                set.concurrency_limit_per_connection,
                set.max_ingest_streams
            ),
            (1, 256, 4096)
        );
        for (toml, message) in [
            (
                "max_concurrent_streams = 0",
                "server.max_concurrent_streams: must be between 1 and 1000, not 0",
            ),
            (
                "max_concurrent_streams = 1001",
                "server.max_concurrent_streams: must be between 1 and 1000, not 1001",
            ),
            (
                "concurrency_limit_per_connection = 0",
                "server.concurrency_limit_per_connection: must be between 1 and 256, not 0",
            ),
            (
                "max_ingest_streams = 0",
                "server.max_ingest_streams: must be between 1 and 4096, not 0",
            ),
            (
                "max_ingest_streams = 100000",
                "server.max_ingest_streams: must be between 1 and 4096, not 100000",
            ),
        ] {
            let err = from_toml(&format!("[server]\n{toml}")).unwrap_err();
            assert_eq!(err.to_string(), message);
        }
        // Negative numbers are refused while the file is read, naming the key.
        let err = from_toml("[server]\nmax_ingest_streams = -1").unwrap_err();
        assert!(format!("{err:#}").contains("max_ingest_streams"), "{err:#}");
    }

    #[test]
    fn errors_name_the_key() {
        let err = from_toml("listen_adr = '1.2.3.4:5'").unwrap_err();
        assert!(format!("{err:#}").contains("listen_adr"), "{err:#}");
        let err = from_toml("[smtp]\nhost = 'h'\nfrom_address = 'nope'").unwrap_err();
        assert!(err.to_string().starts_with("smtp.from_address"), "{err}");
        let err =
            from_toml("[[lists]]\nname = 'ops'\nrecipients = ['a@x.test', 'bad']").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("lists[0].recipients: entry 2: \"bad\""),
            "{err}"
        );
        let err = from_toml("database = 'mssql://db'").unwrap_err();
        assert!(err.to_string().starts_with("database:"), "{err}");
        // The timer-only loop is gone: asking for it is refused by name; a file that still
        // says `true` (the old default) starts as before.
        let err = from_toml("[dispatcher]\nwake_on_events = false").unwrap_err();
        assert!(
            err.to_string().starts_with("dispatcher.wake_on_events"),
            "{err}"
        );
        assert!(from_toml("[dispatcher]\nwake_on_events = true").is_ok());
        let err = from_toml("[dispatcher]\npoll_interval = '0s'").unwrap_err();
        assert!(
            err.to_string().starts_with("dispatcher.poll_interval"),
            "{err}"
        );
        let err =
            from_toml("[smtp]\nhost = 'h'\nfrom_address = 'a@x.test'\ntls = 'ssl'").unwrap_err();
        assert_names_key_and_values(&err, "smtp.tls", &["none", "starttls", "tls"]);
        let err = from_toml("[log]\nformat = 'xml'").unwrap_err();
        assert_names_key_and_values(&err, "log.format", &["text", "json"]);
    }

    /// A value outside a key's set is refused by serde while the file is read: the message
    /// names the key (as figment writes it) and every value the key accepts.
    #[track_caller]
    fn assert_names_key_and_values(err: &anyhow::Error, key: &str, values: &[&str]) {
        let text = format!("{err:#}");
        assert!(text.contains(&format!("key \"default.{key}\"")), "{text}");
        for value in values {
            assert!(text.contains(&format!("`{value}`")), "{value}: {text}");
        }
    }

    #[test]
    fn mssql_connection_strings_are_parsed_and_errors_name_the_key_not_the_password() {
        let settings =
            from_toml("database = 'mssql://outbox:Pa55w0rd@db.test:1433/Outbox?encrypt=strict'")
                .unwrap();
        let DatabaseUrl::MsSql(options) = &settings.database else {
            panic!("not MS SQL: {:?}", settings.database);
        };
        assert_eq!((options.host.as_str(), options.port), ("db.test", 1433));
        assert_eq!(options.database, "Outbox");
        assert!(!format!("{:?}", settings.database).contains("Pa55w0rd"));
        let settings = from_toml(
            "database = 'Server=tcp:db.test,1433;Database=Outbox;User Id=outbox;Password=Pa55w0rd'",
        )
        .unwrap();
        assert!(matches!(settings.database, DatabaseUrl::MsSql(_)));
        for bad in [
            "database = 'mssql://outbox:Pa55w0rd@db.test:1433'",
            "database = 'server=db.test;user id=outbox;password=Pa55w0rd'",
            "database = 'mssql://outbox:Pa55w0rd@db.test/Outbox?encrypt=perhaps'",
        ] {
            let err = from_toml(bad).unwrap_err().to_string();
            assert!(err.starts_with("database:"), "{err}");
            assert!(!err.contains("Pa55w0rd"), "{err}");
        }
        let err = from_toml("database = 'mssql://outbox:Pa55w0rd@db.test:1433'")
            .unwrap_err()
            .to_string();
        assert!(err.contains("database"), "{err}");
    }

    #[test]
    fn the_example_file_is_valid_and_states_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/central-outbox.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let example = from_toml(&text).unwrap();
        let defaults = from_toml("").unwrap();
        assert_eq!(
            example.kpis.stuck_age_threshold,
            defaults.kpis.stuck_age_threshold
        );
        assert_eq!(
            example.kpis.delivered_window,
            defaults.kpis.delivered_window
        );
        assert_eq!(
            example.purge.terminal_retention,
            Duration::from_secs(365 * 24 * 3600)
        );
        assert_eq!(example.purge.interval, defaults.purge.interval);
        assert_eq!(example.site_offline_after, defaults.site_offline_after);
        assert_eq!(defaults.site_offline_after, Duration::from_secs(180));
        assert_eq!(example.purge.batch_size, defaults.purge.batch_size);
        assert_eq!(
            example.purge.site_health_retention,
            defaults.purge.site_health_retention
        );
        assert_eq!(
            example.purge.site_status_keep,
            defaults.purge.site_status_keep
        );
        assert_eq!(example.dispatcher.lease_ttl, defaults.dispatcher.lease_ttl);
        assert_eq!(example.status_callbacks, defaults.status_callbacks);
        // The example states the webhook defaults; a file without [webhook] seeds nothing.
        assert_eq!(example.webhook, Some(WebhookSettings::default()));
        assert_eq!(defaults.webhook, None);
        assert_eq!(example.server, defaults.server);
    }

    #[test]
    fn list_consolidation_is_read_and_checked_by_name() {
        let ops = "[[lists]]\nname = 'ops'\nrecipients = ['a@x.test']\n";
        let settings = from_toml(&format!(
            "{ops}consolidation = {{ threshold = 20, window = '1m', max_per_digest = 100 }}"
        ))
        .unwrap();
        let c = settings.lists[0].consolidation.unwrap();
        assert_eq!(
            (c.threshold(), c.window(), c.max_per_digest()),
            (20, Duration::from_secs(60), 100)
        );
        assert_eq!(from_toml(ops).unwrap().lists[0].consolidation, None);

        // The error names the list's index and the key, like every other list error.
        let two = format!("{ops}[[lists]]\nname = 'b'\nrecipients = ['b@x.test']\n");
        for (table, key, problem) in [
            (
                "{ threshold = 0, window = '1m', max_per_digest = 100 }",
                "threshold",
                "must be between 1 and 100000",
            ),
            (
                "{ threshold = 20, window = '1500ms', max_per_digest = 100 }",
                "window",
                "must be a whole number of seconds",
            ),
            (
                "{ threshold = 20, window = '13h', max_per_digest = 100 }",
                "window",
                "must be between 1s and 43200s",
            ),
            (
                "{ threshold = 20, window = '1m', max_per_digest = 1 }",
                "max_per_digest",
                "must be between 2 and 500",
            ),
        ] {
            let err = from_toml(&format!("{two}consolidation = {table}")).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("lists[1].consolidation.{key}: {problem}"),
                "{table}"
            );
        }
        // A half-set table or a misspelt key is refused while the file is read, by name.
        for (table, key) in [
            ("{ threshold = 20, window = '1m' }", "max_per_digest"),
            (
                "{ threshold = 20, window = '1m', max_per_digest = 100, max = 3 }",
                "max",
            ),
        ] {
            let err = from_toml(&format!("{ops}consolidation = {table}")).unwrap_err();
            let text = format!("{err:#}");
            assert!(
                text.contains("lists.0.consolidation") && text.contains(key),
                "{text}"
            );
        }
    }

    /// The commented `[self_alerts]` of `deploy/central-outbox.toml`, uncommented, is valid and
    /// states the defaults.
    #[test]
    fn the_example_self_alerts_state_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/central-outbox.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let section: String = text
            .lines()
            .skip_while(|l| *l != "# [self_alerts]")
            .take_while(|l| l.starts_with("# "))
            .filter(|l| !l.starts_with("#  "))
            .map(|l| format!("{}\n", l.trim_start_matches("# ")))
            .collect();
        assert!(section.starts_with("[self_alerts]\n"), "{section}");
        let example: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(&section))
            .extract()
            .unwrap();
        let mut example = example.self_alerts.unwrap();
        assert!(example.email_list.is_some() && example.heartbeat_url.is_some());
        (
            example.email_list,
            example.webhook_list,
            example.heartbeat_url,
        ) = (None, None, None);
        assert_eq!(example, SelfAlertsConfig::default());
        assert!(from_toml(&section).is_ok());
    }

    /// The commented example in `deploy/central-outbox.toml` is valid once uncommented.
    #[test]
    fn the_example_consolidation_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/central-outbox.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let example = text
            .lines()
            .find_map(|l| l.strip_prefix("# consolidation = "))
            .expect("an example consolidation line");
        let table = example.split("  #").next().unwrap_or(example);
        let settings = from_toml(&format!(
            "[[lists]]\nname = 'ops'\nrecipients = ['a@x.test']\nconsolidation = {table}"
        ))
        .unwrap();
        assert!(settings.lists[0].consolidation.is_some());
    }

    #[test]
    fn kpi_and_retention_keys_are_checked() {
        let err = from_toml("[kpis]\nstuck_age_threshold = '0s'").unwrap_err();
        assert!(
            err.to_string().starts_with("kpis.stuck_age_threshold"),
            "{err}"
        );
        let err = from_toml("[retention]\npurge_batch_size = 0").unwrap_err();
        assert!(
            err.to_string().starts_with("retention.purge_batch_size"),
            "{err}"
        );
        let err = from_toml("metrics_listen = 'nowhere'").unwrap_err();
        assert!(format!("{err:#}").contains("metrics_listen"), "{err:#}");
    }

    #[test]
    fn fallback_relays_and_the_failover_numbers_are_checked() {
        let smtp = "[smtp]\nhost = 'relay.test'\nfrom_address = 'o@x.test'\n";
        let settings = from_toml(&format!(
            "{smtp}fallback_relays = ['relay2.test:25 starttls', '10.0.0.5:2525 none']"
        ))
        .unwrap();
        let relays = settings.smtp.unwrap().fallback_relays;
        assert_eq!(
            SmtpRelay::list_text(&relays),
            "relay2.test:25 starttls, 10.0.0.5:2525 none"
        );
        let err = from_toml(&format!("{smtp}fallback_relays = ['relay2.test:25']")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("smtp.fallback_relays: relay 1: "),
            "{err}"
        );
        let five = ["'r.test:25 none'"; 5].join(", ");
        let err = from_toml(&format!("{smtp}fallback_relays = [{five}]")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("smtp.fallback_relays: at most 4"),
            "{err}"
        );

        let policy = from_toml("").unwrap().dispatcher.failover;
        assert_eq!(policy, FailoverPolicy::default());
        let quick = from_toml(
            "[dispatcher]\nfailover_after_failures = 1\nfailover_after = '1s'\n\
             failover_probe_interval = '1h'",
        )
        .unwrap()
        .dispatcher
        .failover;
        assert_eq!(quick.after_failures, 1);
        assert_eq!(quick.probe_every, Duration::from_secs(3600));
        for (key, bad) in [
            ("failover_after_failures", "0"),
            ("failover_after_failures", "101"),
            ("failover_after", "'999ms'"),
            ("failover_probe_interval", "'1h 1s'"),
        ] {
            let err = from_toml(&format!("[dispatcher]\n{key} = {bad}")).unwrap_err();
            assert!(
                err.to_string()
                    .starts_with(&format!("dispatcher.{key}: must be between")),
                "{key} = {bad}: {err}"
            );
        }
    }

    #[test]
    fn site_health_retention_outlasts_the_offline_threshold() {
        assert_eq!(
            from_toml("").unwrap().purge.site_health_retention,
            Duration::from_secs(30 * 24 * 3600)
        );
        let short =
            from_toml("site_offline_after = '1s'\n[retention]\nsite_health_retention = '2s'")
                .unwrap();
        assert_eq!(short.purge.site_health_retention, Duration::from_secs(2));
        for retention in ["3m", "1s", "3651days"] {
            let text = format!("[retention]\nsite_health_retention = '{retention}'");
            let err = from_toml(&text).unwrap_err().to_string();
            assert!(
                err.starts_with(
                    "retention.site_health_retention: must be longer than site_offline_after (3m)"
                ),
                "{retention}: {err}"
            );
        }
    }

    #[test]
    fn channels_lists_and_auth_are_checked() {
        let smtp = "[smtp]\nhost = 'relay.test'\nfrom_address = 'o@x.test'\n";
        let oauth = format!(
            "{smtp}username = 'o@x.test'\n[smtp.oauth]\ntoken_url = 'https://login.test/t'\n\
             client_id = 'c'\nclient_secret = 's'\n"
        );
        // A secret in the file is stored encrypted: without a key, start-up is refused.
        let err = from_toml(&oauth).unwrap_err();
        assert!(
            err.to_string().starts_with("smtp.oauth.client_secret")
                && err.to_string().contains("[secrets]"),
            "{err}"
        );
        let key = "secrets.key = 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA='\n";
        let settings = from_toml(&format!("{key}{oauth}")).unwrap();
        assert_eq!(settings.smtp.unwrap().auth.mechanism(), "xoauth2");
        let hooks_secret = "[[lists]]\nname = 'h'\ntype = 'webhook'\nendpoints = ['https://h.test/a']\n\
                            webhook_secret = '0123456789abcdef'\n";
        let err = from_toml(hooks_secret).unwrap_err();
        assert!(
            err.to_string().starts_with("lists[0].webhook_secret"),
            "{err}"
        );
        assert!(from_toml(&format!("{key}{hooks_secret}")).is_ok());
        let err = from_toml(&format!("{smtp}backoff = 'linear'")).unwrap_err();
        assert_names_key_and_values(&err, "smtp.backoff", &["fixed", "exponential"]);
        let err = from_toml("[webhook]\nbackoff = 'linear'").unwrap_err();
        assert_names_key_and_values(&err, "webhook.backoff", &["fixed", "exponential"]);
        let err = from_toml(&format!("{smtp}rate_limit_burst = 3")).unwrap_err();
        assert!(
            err.to_string().starts_with("smtp.rate_limit_burst"),
            "{err}"
        );
        // Every number and duration has its bounds, the same as the admin API's.
        for (line, key) in [
            (
                "rate_limit_per_second = 1e-30",
                "smtp.rate_limit_per_second",
            ),
            ("rate_limit_per_second = 1e9", "smtp.rate_limit_per_second"),
            (
                "rate_limit_per_second = 5.0\nrate_limit_burst = 1000000",
                "smtp.rate_limit_burst",
            ),
            ("max_retries = 1000000", "smtp.max_retries"),
            ("retry_delay = '400days'", "smtp.retry_delay"),
            (
                "backoff = 'exponential'\nmax_retry_delay = '400days'",
                "smtp.max_retry_delay",
            ),
            ("timeout = '2h'\noverall_timeout = '3h'", "smtp.timeout"),
            ("overall_timeout = '2days'", "smtp.overall_timeout"),
            // The stores keep milliseconds.
            ("timeout = '1s 500us'", "smtp.timeout"),
            ("retry_delay = '1ns'", "smtp.retry_delay"),
        ] {
            let err = from_toml(&format!("{smtp}{line}")).unwrap_err();
            assert!(err.to_string().starts_with(key), "{line}: {err}");
        }
        let err = from_toml(&format!("{smtp}username = 'u'")).unwrap_err();
        assert!(err.to_string().starts_with("smtp.username"), "{err}");
        // Errors name the file's keys: the OAuth settings are nested, a list's name is `name`.
        let bad_token_url = oauth.replace("https://login.test/t", "ftp://login.test/t");
        let err = from_toml(&format!("{key}{bad_token_url}")).unwrap_err();
        assert!(
            err.to_string().starts_with("smtp.oauth.token_url:"),
            "{err}"
        );
        let err = from_toml("[[lists]]\nname = ''\nrecipients = ['a@x.test']").unwrap_err();
        assert!(err.to_string().starts_with("lists[0].name:"), "{err}");
        let settings = from_toml(&format!("{smtp}rate_limit_per_second = 2.5")).unwrap();
        let limit = settings.smtp.unwrap().policy.rate_limit.unwrap();
        assert_eq!((limit.per_second(), limit.burst()), (2.5, 3));
        // A password goes in clear only to this host: the rule the admin API and the
        // console's form have too, so `--apply-config` cannot store what they refuse.
        let password = format!("{key}{smtp}username = 'u'\npassword = 'p'\n");
        let err = from_toml(&format!("{password}tls = 'none'\n")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("smtp.tls: none would send the password"),
            "{err}"
        );
        assert!(err.to_string().contains("loopback"), "{err}");
        assert!(
            from_toml(&format!(
                "{key}[smtp]\nhost = '127.0.0.1'\nfrom_address = 'o@x.test'\ntls = 'none'\n\
                 username = 'u'\npassword = 'p'\n"
            ))
            .is_ok()
        );

        let hooks = "[[lists]]\nname = 'hooks'\ntype = 'webhook'\n";
        let settings = from_toml(&format!(
            "{hooks}endpoints = ['https://h.test/a']\nwebhook_format = 'slack'"
        ))
        .unwrap();
        assert_eq!(settings.lists[0].kind(), NotificationType::Webhook);
        let err = from_toml(&format!("{hooks}endpoints = ['http://h.test/a']")).unwrap_err();
        assert!(err.to_string().starts_with("lists[0].endpoints"), "{err}");
        let settings = from_toml(&format!(
            "{hooks}endpoints = ['https://h.test/a']\nfallback_urls = ['https://b.test/a']"
        ))
        .unwrap();
        match &settings.lists[0].targets {
            crate::domain::channel::ListTargets::Webhook(t) => assert_eq!(t.fallbacks.len(), 1),
            other => panic!("{other:?}"),
        }
        let err = from_toml(&format!(
            "{hooks}endpoints = ['https://h.test/a']\nfallback_urls = ['http://b.test/a']"
        ))
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("lists[0].fallback_urls: entry 1"),
            "{err}"
        );
        let err = from_toml(&format!(
            "{hooks}endpoints = ['https://h.test/a']\nwebhook_format = 'x'"
        ))
        .unwrap_err();
        assert_names_key_and_values(
            &err,
            "lists.0.webhook_format",
            &["generic", "teams", "slack"],
        );
        let err = from_toml("[[lists]]\nname = 'ops'\ntype = 'sms'").unwrap_err();
        assert_names_key_and_values(&err, "lists.0.type", &["email", "webhook"]);
        let err = from_toml("[webhook]\nmax_concurrent_connections = 0").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("webhook.max_concurrent_connections"),
            "{err}"
        );
        let err = from_toml("[dispatcher]\nlease_ttl = '10s'\nrenew_interval = '6s'").unwrap_err();
        assert!(
            err.to_string().starts_with("dispatcher.renew_interval"),
            "{err}"
        );
    }
}
