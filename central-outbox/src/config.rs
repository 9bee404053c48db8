//! Central's configuration: a TOML file, overridden by `OUTBOX_CENTRAL_*` environment variables
//! (nested keys joined by `__`, e.g. `OUTBOX_CENTRAL_SMTP__HOST`), overridden by command-line
//! flags. Unknown keys are errors, and every validation message names the key, so a typo fails
//! start-up instead of silently running with a default. Defaults are documented in
//! `deploy/central-outbox.toml`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::dispatcher::DispatcherSettings;
use crate::domain::NotificationType;
use crate::domain::channel::{
    EmailAddress, NotificationList, Secret, SmtpAuth, SmtpSettings, TlsMode,
};
use crate::domain::kpi::KpiSettings;
use crate::purge::PurgeSettings;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// gRPC listen address.
    pub listen_addr: SocketAddr,
    /// Prometheus `/metrics` HTTP address; unset (the default) serves no metrics.
    pub metrics_listen: Option<SocketAddr>,
    /// `sqlite://PATH` (the embedded default).
    pub database: String,
    /// Lease holder name; defaults to a random id per process.
    pub node_id: Option<String>,
    pub dispatcher: DispatcherConfig,
    /// The email channel; written to the database at start-up when present.
    pub smtp: Option<SmtpConfig>,
    /// Notification lists; each is written to the database at start-up (replacing one of the
    /// same name). Lists not named here are left as they are.
    pub lists: Vec<ListConfig>,
    pub kpis: KpiConfig,
    pub retention: RetentionConfig,
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    pub log: LogConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen_addr: SocketAddr::from(([127, 0, 0, 1], 50051)),
            metrics_listen: None,
            database: "sqlite://var/central.db".into(),
            node_id: None,
            dispatcher: DispatcherConfig::default(),
            smtp: None,
            lists: Vec::new(),
            kpis: KpiConfig::default(),
            retention: RetentionConfig::default(),
            shutdown_timeout: Duration::from_secs(10),
            log: LogConfig::default(),
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
    #[serde(with = "humantime_serde")]
    pub claim_timeout: Duration,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(1),
            lease_ttl: Duration::from_secs(15),
            claim_timeout: Duration::from_secs(120),
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
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            terminal_retention: Duration::from_secs(365 * 24 * 3600),
            purge_interval: Duration::from_secs(24 * 3600),
            purge_batch_size: 1000,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmtpConfig {
    pub host: String,
    #[serde(default = "default_smtp_port")]
    pub port: u16,
    /// `none`, `starttls` or `tls`.
    #[serde(default = "default_tls")]
    pub tls: String,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
    pub from_address: String,
    #[serde(default = "default_max_retries")]
    pub max_retries: i64,
    #[serde(default = "default_retry_delay", with = "humantime_serde")]
    pub retry_delay: Duration,
    #[serde(default = "default_max_connections")]
    pub max_concurrent_connections: u32,
    #[serde(default = "default_smtp_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

fn default_smtp_port() -> u16 {
    25
}
fn default_tls() -> String {
    "starttls".into()
}
fn default_max_retries() -> i64 {
    10
}
fn default_retry_delay() -> Duration {
    Duration::from_secs(60)
}
fn default_max_connections() -> u32 {
    4
}
fn default_smtp_timeout() -> Duration {
    Duration::from_secs(30)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListConfig {
    pub name: String,
    /// `email` (the default) or `webhook`.
    #[serde(default = "default_list_type", rename = "type")]
    pub kind: String,
    pub recipients: Vec<String>,
}

fn default_list_type() -> String {
    "email".into()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: String,
    /// A tracing `EnvFilter` directive; `RUST_LOG` wins when set.
    pub filter: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: "text".into(),
            filter: "info".into(),
        }
    }
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
}

/// A checked configuration, in domain types.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen_addr: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub database: DatabaseUrl,
    pub dispatcher: DispatcherSettings,
    pub smtp: Option<SmtpSettings>,
    pub lists: Vec<NotificationList>,
    pub kpis: KpiSettings,
    pub purge: PurgeSettings,
    pub shutdown_timeout: Duration,
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
        if d.claim_timeout < Duration::from_secs(2) {
            bail!("dispatcher.claim_timeout: must be at least 2s");
        }
        let node_id = match &self.node_id {
            Some(id) if id.trim().is_empty() => bail!("node_id: must not be empty"),
            Some(id) => id.clone(),
            None => format!("central-{}", uuid::Uuid::new_v4().simple()),
        };
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
        let smtp = self.smtp.as_ref().map(smtp_settings).transpose()?;
        let lists = self
            .lists
            .iter()
            .enumerate()
            .map(|(i, list)| list_settings(i, list))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Settings {
            listen_addr: self.listen_addr,
            metrics_listen: self.metrics_listen,
            database,
            dispatcher: DispatcherSettings {
                node_id,
                poll_interval: d.poll_interval,
                lease_ttl: d.lease_ttl,
                claim_timeout: d.claim_timeout,
                drain_timeout: self.shutdown_timeout,
            },
            smtp,
            lists,
            kpis: KpiSettings {
                stuck_age_threshold: k.stuck_age_threshold,
                delivered_window: k.delivered_kpi_window,
            },
            purge: PurgeSettings {
                terminal_retention: r.terminal_retention,
                interval: r.purge_interval,
                batch_size: r.purge_batch_size,
            },
            shutdown_timeout: self.shutdown_timeout,
        })
    }
}

fn parse_database(url: &str) -> anyhow::Result<DatabaseUrl> {
    match url.split_once("://") {
        Some(("sqlite", path)) if !path.is_empty() => Ok(DatabaseUrl::Sqlite(PathBuf::from(path))),
        Some(("sqlite", _)) => {
            bail!("database: sqlite:// needs a file path, e.g. sqlite://var/central.db")
        }
        Some((scheme, _)) => bail!(
            "database: the {scheme:?} backend is not available in this build; use sqlite://PATH"
        ),
        None => bail!("database: {url:?} is not a URL; use sqlite://PATH"),
    }
}

fn smtp_settings(c: &SmtpConfig) -> anyhow::Result<SmtpSettings> {
    let tls = TlsMode::parse(&c.tls)
        .with_context(|| format!("smtp.tls: {:?} is not one of none, starttls, tls", c.tls))?;
    let auth = match (&c.username, &c.password) {
        (None, None) => SmtpAuth::None,
        (Some(username), Some(password)) => SmtpAuth::Password {
            username: username.clone(),
            password: Secret::new(password.clone()),
        },
        _ => bail!("smtp.username and smtp.password: set both or neither"),
    };
    let from_address = EmailAddress::parse(&c.from_address, "from_address")
        .map_err(|e| anyhow::anyhow!("smtp.{e}"))?;
    SmtpSettings {
        host: c.host.clone(),
        port: c.port,
        tls,
        auth,
        from_address,
        max_retries: c.max_retries,
        retry_delay: c.retry_delay,
        max_concurrent_connections: c.max_concurrent_connections,
        timeout: c.timeout,
    }
    .check()
    .map_err(|e| anyhow::anyhow!("smtp.{e}"))
}

fn list_settings(index: usize, c: &ListConfig) -> anyhow::Result<NotificationList> {
    let kind = match c.kind.as_str() {
        "email" => NotificationType::Email,
        "webhook" => NotificationType::Webhook,
        other => bail!("lists[{index}].type: {other:?} is not one of email, webhook"),
    };
    NotificationList::parse(c.name.clone(), kind, &c.recipients)
        .map_err(|e| anyhow::anyhow!("lists[{index}].{e}"))
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
    fn defaults_are_valid() {
        let settings = from_toml("").unwrap();
        assert_eq!(
            settings.database,
            DatabaseUrl::Sqlite(PathBuf::from("var/central.db"))
        );
        assert_eq!(settings.dispatcher.poll_interval, Duration::from_secs(1));
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
        let err = from_toml("[dispatcher]\npoll_interval = '0s'").unwrap_err();
        assert!(
            err.to_string().starts_with("dispatcher.poll_interval"),
            "{err}"
        );
        let err =
            from_toml("[smtp]\nhost = 'h'\nfrom_address = 'a@x.test'\ntls = 'ssl'").unwrap_err();
        assert!(err.to_string().starts_with("smtp.tls"), "{err}");
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
        assert_eq!(example.purge.batch_size, defaults.purge.batch_size);
        assert_eq!(example.dispatcher.lease_ttl, defaults.dispatcher.lease_ttl);
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
}
