//! The forwarder's configuration: a TOML file, then environment variables `OUTBOX_SITE_*`
//! (nested keys with `__`, e.g. `OUTBOX_SITE_LOG__FORMAT=json`), then command-line flags, each
//! layer overriding the one before. Every key has a default except `site_id`; unknown keys are
//! errors, and every error names the key, so a typo never silently falls back to a default.
//! `deploy/site-forwarder.toml` documents each key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::domain::Role;
use crate::domain::SiteId;
use crate::tls::TlsConfig;

/// Prefix of the environment variables read by [`Config::load`].
pub const ENV_PREFIX: &str = "OUTBOX_SITE_";

/// Largest allowed `forward_window`. Each unacked submit pins only its id locally, but central
/// holds up to this many decoded submits for the stream; 65536 maximal ones would already be
/// far beyond what central's per-stream batching admits at once.
pub const MAX_FORWARD_WINDOW: usize = 65_536;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This site's id, stamped on every notification (`source_site_id`). Required.
    pub site_id: String,
    /// Debug builds only, for the tests: supervised task starts that fail on purpose
    /// (`TASK=N` or `TASK=always`, comma-separated; `task_supervisor::FaultPlan`). Release
    /// builds refuse it. Set through `OUTBOX_SITE_TEST_FAULTS`.
    #[serde(default)]
    pub test_faults: Option<String>,
    /// Where the local `SiteNotify` API listens. Loopback by default: only local scripts send.
    #[serde(default = "default_listen_addr")]
    pub listen_addr: SocketAddr,
    /// The SQLite buffer file (created with its directory if missing).
    #[serde(default = "default_buffer_path")]
    pub buffer_path: PathBuf,
    // -- Room to drain (issue 25): see `buffer::room` for why and how it is counted. --
    /// Bytes the buffer's filesystem must keep free after a Send is stored; a Send that would
    /// eat into them is refused (RESOURCE_EXHAUSTED), so the deletes of what central acks
    /// always fit. 64 MiB: far more than a batch of deletes and a checkpoint need, and little
    /// on any disk a site node has.
    #[serde(default = "default_min_free_disk_bytes")]
    pub min_free_disk_bytes: u64,
    /// Most data the buffer may hold (bytes of its file in use); a Send past it is refused.
    /// Checked against an estimate of the row's size, so the file may pass it by a few pages.
    /// Absent: bounded by the disk (and `min_free_disk_bytes`) only.
    #[serde(default)]
    pub max_buffer_bytes: Option<u64>,
    /// Central's gRPC endpoint: `https://host:port` (TLS, see `[tls]`) or `http://host:port`.
    #[serde(default = "default_central_url")]
    pub central_url: String,
    /// Least time between the starts of two connection attempts while central is unreachable
    /// (a stream that was open longer reconnects at once when it breaks). Fixed rather than
    /// exponential: one forwarder per site makes one attempt per interval, which central easily
    /// absorbs, and a returning link is noticed within one interval.
    #[serde(default = "default_five_seconds", with = "humantime_serde")]
    pub forward_retry_interval: Duration,
    /// Submits sent on the stream and not yet acked. 512 keeps a high-latency link busy (at
    /// 100 ms round trip that is ~5000 notifications/s) while bounding what is resent after a
    /// broken stream and what central must hold for this site at once.
    #[serde(default = "default_forward_window")]
    pub forward_window: usize,
    /// Limit on establishing a connection to central.
    #[serde(default = "default_five_seconds", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Limit on one request/response round trip to central (`GetStatus` pass-through).
    #[serde(default = "default_request_timeout", with = "humantime_serde")]
    pub request_timeout: Duration,
    /// How often this node reports its health (buffer depth, oldest age, last forward, role,
    /// standby lag) to central (`ReportSiteHealth`), busy or idle. 5 s: central declares a node
    /// offline after `site_offline_after` (3 min by default) without a report, so dozens may be
    /// lost before it does, and one small upsert per node every 5 s is nothing to its database.
    #[serde(default = "default_five_seconds", with = "humantime_serde")]
    pub health_report_interval: Duration,
    /// At shutdown, how long open client connections may take to finish before they are dropped.
    #[serde(default = "default_shutdown_timeout", with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// Where to serve Prometheus metrics over HTTP (`GET /metrics`). Off when absent.
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    /// TLS to central (CA, client certificate) and the plaintext rule for `listen_addr`; also
    /// the identity of the pair link when `[pair]` is set.
    #[serde(default)]
    pub tls: TlsConfig,
    /// This node's active/standby pair. Absent: a single node, always active.
    #[serde(default)]
    pub pair: Option<PairConfig>,
    /// How a dead link to central is noticed: HTTP/2 pings and the ack deadline.
    #[serde(default)]
    pub central: CentralLinkConfig,
    #[serde(default)]
    pub log: LogConfig,
    /// How many of the final statuses central sends back are kept, and for how long.
    #[serde(default)]
    pub statuses: StatusesConfig,
}

/// `[statuses]`: the final statuses central sends back (Delivered, Parked with its reason...),
/// kept in the buffer file so `GetStatus` and `WatchStatus` answer from them, also while
/// central is away. The oldest go first once either bound is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusesConfig {
    /// How long a status is kept after it arrived. 7 days by default; `GetStatus` of an older
    /// notification asks central.
    #[serde(default = "default_status_retention", with = "humantime_serde")]
    pub retention: Duration,
    /// At most this many statuses are kept (about 1 KiB each on disk). 1,000,000 by default.
    #[serde(default = "default_status_max_rows")]
    pub max_rows: u64,
}

impl Default for StatusesConfig {
    fn default() -> Self {
        Self {
            retention: default_status_retention(),
            max_rows: default_status_max_rows(),
        }
    }
}

fn default_status_retention() -> Duration {
    Duration::from_secs(7 * 24 * 3600)
}
fn default_status_max_rows() -> u64 {
    1_000_000
}

/// `[central]`: how quickly a link to central that went silent (a proxy or firewall that stops
/// passing packets without closing anything) is declared dead. Until it is, `GetBufferStats`
/// says central is reachable and the in-flight submits wait; once it is, the forwarder
/// reconnects at once and resends them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CentralLinkConfig {
    /// An HTTP/2 PING goes to central after this long without a byte from it (also while
    /// nothing is being forwarded). 2 s: a ping costs a few bytes, and a quiet link is probed
    /// often enough that a dead one is found within seconds.
    #[serde(default = "default_keepalive_interval", with = "humantime_serde")]
    pub keepalive_interval: Duration,
    /// How long a PING may go unanswered before the connection counts as dead. A dead link is
    /// therefore declared at most `keepalive_interval + keepalive_timeout` (5 s by default)
    /// after central was last heard. 3 s is many round trips on any working link; raise it on
    /// a slow uplink with deep queues, where the ping waits behind data already sent.
    #[serde(default = "default_keepalive_timeout", with = "humantime_serde")]
    pub keepalive_timeout: Duration,
    /// Longest time submits may be outstanding without a single ack before the stream is
    /// abandoned and reopened. Catches what pings cannot: a central (or an HTTP/2 proxy) that
    /// answers pings but stopped answering the stream. Central acks each batch right after its
    /// commit, normally within milliseconds; 60 s leaves room for a database slow under load
    /// (on Babelfish at load 15, 15 s was too short: each timeout resent the whole window, and
    /// the resends kept central busier still) or a large window crossing a slow link.
    #[serde(default = "default_ack_timeout", with = "humantime_serde")]
    pub ack_timeout: Duration,
}

impl Default for CentralLinkConfig {
    fn default() -> Self {
        Self {
            keepalive_interval: default_keepalive_interval(),
            keepalive_timeout: default_keepalive_timeout(),
            ack_timeout: default_ack_timeout(),
        }
    }
}

fn default_keepalive_interval() -> Duration {
    Duration::from_secs(2)
}
fn default_keepalive_timeout() -> Duration {
    Duration::from_secs(3)
}
fn default_ack_timeout() -> Duration {
    // Long: a dead link is the keepalive's to notice within seconds; this only catches a
    // central that answers pings but not the stream, and a central whose database is slow
    // under load must not be mistaken for one (each timeout resends the whole window).
    Duration::from_secs(60)
}

/// `[pair]`: one node of an active/standby pair (see `deploy/site-forwarder.toml`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairConfig {
    /// This node's name, different from its peer's: a standby's refusals name the active by
    /// it, and it breaks the tie between two nodes active in the same term.
    pub node_name: String,
    /// The role on the very first start. Afterwards the node keeps the role it last had (it is
    /// persisted in the buffer file), because a promotion may have happened since.
    pub initial_role: Role,
    /// Where this node serves its peer (`SitePair`): TLS when `tls.cert` and `tls.key` are set.
    pub listen: SocketAddr,
    /// The peer's `SitePair` endpoint: `https://host:port` (TLS with `[tls]`) or `http://`.
    pub peer_url: String,
    /// The name the peer's certificate must carry, when it is not `peer_url`'s host.
    #[serde(default)]
    pub peer_domain: Option<String>,
    /// This node's `SiteNotify` address as site scripts reach it, named in the standby's
    /// refusals. Default: `listen_addr`.
    #[serde(default)]
    pub send_addr: Option<String>,
    /// How long the standby waits without hearing from the active (the active sends a
    /// heartbeat five times per timeout) before it promotes itself.
    #[serde(default = "default_failover_timeout", with = "humantime_serde")]
    pub failover_timeout: Duration,
}

/// Shortest `failover_timeout`: a heartbeat every fifth of it must stay well above a busy
/// machine's scheduling hiccups.
pub const MIN_FAILOVER_TIMEOUT: Duration = Duration::from_millis(250);

impl PairConfig {
    /// Interval of the active's heartbeats and of each node's look at its peer's role.
    pub fn heartbeat_interval(&self) -> Duration {
        self.failover_timeout / 5
    }

    /// How long the pair link may stay silent past a heartbeat before a replication connection
    /// counts as dead: an HTTP/2 PING (sent after a heartbeat interval without a byte) may go
    /// unanswered this long, and the standby waits this long past a heartbeat interval for the
    /// next batch. Two heartbeats: a dead connection
    /// is dropped at 3/5 of `failover_timeout`, so the standby still has time to reconnect
    /// before it would promote itself, and one late heartbeat on a busy machine is no alarm.
    pub fn link_timeout(&self) -> Duration {
        self.heartbeat_interval() * 2
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// `text` (human-readable) or `json` (one object per line).
    #[serde(default)]
    pub format: LogFormat,
    /// A `tracing_subscriber::EnvFilter` directive, e.g. `info` or `site_forwarder=debug,info`.
    #[serde(default = "default_log_filter")]
    pub filter: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::default(),
            filter: default_log_filter(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Values from command-line flags; each one set overrides the file and the environment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Overrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen_addr: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buffer_path: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub central_url: Option<String>,
}

fn default_listen_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 50052))
}
fn default_buffer_path() -> PathBuf {
    PathBuf::from("var/site-buffer.db")
}
fn default_central_url() -> String {
    "http://127.0.0.1:50051".into()
}
fn default_five_seconds() -> Duration {
    Duration::from_secs(5)
}
fn default_forward_window() -> usize {
    512
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_shutdown_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_failover_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_min_free_disk_bytes() -> u64 {
    64 << 20
}
/// Least `min_free_disk_bytes` and `max_buffer_bytes`: below 1 MiB of reserve a single batch of
/// deletes (or one maximal notification) may not fit.
pub const MIN_ROOM_BYTES: u64 = 1 << 20;

impl Config {
    /// The buffer's space limits, from `min_free_disk_bytes` and `max_buffer_bytes`.
    pub fn space_limits(&self) -> crate::buffer::SpaceLimits {
        crate::buffer::SpaceLimits {
            min_free_disk_bytes: self.min_free_disk_bytes,
            max_buffer_bytes: self.max_buffer_bytes,
        }
    }
}

fn default_log_filter() -> String {
    "info".into()
}

impl Config {
    /// Every default, for tests and embedding.
    pub fn new(site_id: impl Into<String>) -> Config {
        Config {
            site_id: site_id.into(),
            test_faults: None,
            listen_addr: default_listen_addr(),
            buffer_path: default_buffer_path(),
            min_free_disk_bytes: default_min_free_disk_bytes(),
            max_buffer_bytes: None,
            central_url: default_central_url(),
            forward_retry_interval: default_five_seconds(),
            forward_window: default_forward_window(),
            connect_timeout: default_five_seconds(),
            request_timeout: default_request_timeout(),
            health_report_interval: default_five_seconds(),
            shutdown_timeout: default_shutdown_timeout(),
            metrics_listen: None,
            tls: TlsConfig::default(),
            pair: None,
            central: CentralLinkConfig::default(),
            log: LogConfig::default(),
            statuses: StatusesConfig::default(),
        }
    }

    /// Reads the file at `path` (if given; it must exist), then `OUTBOX_SITE_*` variables, then
    /// `overrides`, and validates the result.
    pub fn load(path: Option<&Path>, overrides: Overrides) -> anyhow::Result<Config> {
        Self::load_from(path, Env::prefixed(ENV_PREFIX).split("__"), overrides)
    }

    fn load_from(path: Option<&Path>, env: Env, overrides: Overrides) -> anyhow::Result<Config> {
        let mut figment = Figment::new();
        if let Some(path) = path {
            // figment skips a missing file silently; a named file that is missing is a mistake.
            if !path.is_file() {
                bail!("config file {} does not exist", path.display());
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        let config: Config = figment
            .merge(env)
            .merge(Serialized::defaults(overrides))
            .extract()
            .map_err(|e| anyhow::anyhow!(describe_figment_error(e)))
            .context("invalid configuration")?;
        config.validate()?;
        Ok(config)
    }

    /// The supervised task starts that are to fail (`test_faults`; debug builds only).
    pub fn faults(&self) -> anyhow::Result<task_supervisor::FaultPlan> {
        task_supervisor::FaultPlan::from_setting(self.test_faults.as_deref())
            .map_err(|e| anyhow::anyhow!("test_faults: {e}"))
    }

    /// Checks what serde cannot; each message starts with the key.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.faults()?;
        SiteId::parse(self.site_id.clone())
            .map_err(|e| anyhow::anyhow!("site_id: {}", e.problem))?;
        if !(1..=MAX_FORWARD_WINDOW).contains(&self.forward_window) {
            bail!("forward_window: must be between 1 and {MAX_FORWARD_WINDOW}");
        }
        if self.statuses.max_rows == 0 {
            bail!("statuses.max_rows: must be at least 1");
        }
        check_central_url(&self.central_url)?;
        self.tls.check(&self.central_url, self.listen_addr)?;
        if self.metrics_listen == Some(self.listen_addr) {
            bail!(
                "metrics_listen: must differ from listen_addr ({})",
                self.listen_addr
            );
        }
        for (key, value) in [
            ("forward_retry_interval", self.forward_retry_interval),
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
            ("health_report_interval", self.health_report_interval),
            (
                "central.keepalive_interval",
                self.central.keepalive_interval,
            ),
            ("central.keepalive_timeout", self.central.keepalive_timeout),
            ("central.ack_timeout", self.central.ack_timeout),
            ("statuses.retention", self.statuses.retention),
        ] {
            if value.is_zero() {
                bail!("{key}: must be greater than zero");
            }
        }
        if self.min_free_disk_bytes < MIN_ROOM_BYTES {
            bail!("min_free_disk_bytes: must be at least {MIN_ROOM_BYTES} (1 MiB)");
        }
        if let Some(max) = self.max_buffer_bytes
            && max < MIN_ROOM_BYTES
        {
            bail!("max_buffer_bytes: must be at least {MIN_ROOM_BYTES} (1 MiB)");
        }
        tracing_subscriber::EnvFilter::try_new(&self.log.filter)
            .map_err(|e| anyhow::anyhow!("log.filter: {e}"))?;
        if let Some(pair) = &self.pair {
            pair.validate(self)?;
        }
        Ok(())
    }
}

impl PairConfig {
    fn validate(&self, config: &Config) -> anyhow::Result<()> {
        SiteId::parse(self.node_name.clone())
            .map_err(|e| anyhow::anyhow!("pair.node_name: {}", e.problem))?;
        check_url("pair.peer_url", &self.peer_url)?;
        if self.peer_domain.as_deref().is_some_and(str::is_empty) {
            bail!("pair.peer_domain: must not be empty");
        }
        if self.failover_timeout < MIN_FAILOVER_TIMEOUT {
            bail!("pair.failover_timeout: must be at least {MIN_FAILOVER_TIMEOUT:?}");
        }
        for (key, addr) in [
            ("listen_addr", Some(config.listen_addr)),
            ("metrics_listen", config.metrics_listen),
        ] {
            if addr == Some(self.listen) {
                bail!("pair.listen: must differ from {key} ({})", self.listen);
            }
        }
        config
            .tls
            .check_pair(&self.peer_url, self.listen)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(())
    }
}

fn check_central_url(url: &str) -> anyhow::Result<()> {
    check_url("central_url", url)
}

fn check_url(key: &str, url: &str) -> anyhow::Result<()> {
    let uri: tonic::transport::Uri = url
        .parse()
        .map_err(|e| anyhow::anyhow!("{key}: {url:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.host().is_some() => Ok(()),
        _ => bail!("{key}: {url:?} must be an https:// or http:// URL with a host and port"),
    }
}

/// Figment's messages already name the key and where its value came from; join them into one.
fn describe_figment_error(error: figment::Error) -> String {
    error
        .into_iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env() -> Env {
        Env::prefixed("OUTBOX_SITE_TEST_UNUSED_PREFIX_")
    }

    fn write(dir: &tempfile::TempDir, text: &str) -> PathBuf {
        let path = dir.path().join("site.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn defaults_fill_everything_but_site_id() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "site_id = \"site-a\"\n");
        let config = Config::load_from(Some(&path), no_env(), Overrides::default()).unwrap();
        assert_eq!(config.site_id, "site-a");
        assert_eq!(config.listen_addr, "127.0.0.1:50052".parse().unwrap());
        assert_eq!(config.buffer_path, PathBuf::from("var/site-buffer.db"));
        assert_eq!(config.central_url, "http://127.0.0.1:50051");
        assert_eq!(config.forward_retry_interval, Duration::from_secs(5));
        assert_eq!(config.forward_window, 512);
        assert_eq!(config.request_timeout, Duration::from_secs(10));
        assert_eq!(config.health_report_interval, Duration::from_secs(5));
        assert_eq!(config.log.format, LogFormat::Text);
        assert_eq!(config.log.filter, "info");
        assert_eq!(config.metrics_listen, None, "metrics are off by default");
        assert_eq!(config.min_free_disk_bytes, 64 << 20);
        assert_eq!(config.max_buffer_bytes, None);
    }

    #[test]
    fn metrics_listen_turns_metrics_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            &dir,
            "site_id = \"a\"\nmetrics_listen = \"127.0.0.1:9102\"\n",
        );
        let config = Config::load_from(Some(&path), no_env(), Overrides::default()).unwrap();
        assert_eq!(
            config.metrics_listen,
            Some("127.0.0.1:9102".parse().unwrap())
        );
    }

    #[test]
    fn file_values_and_overrides_apply_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            &dir,
            "site_id = \"site-a\"\nforward_retry_interval = \"250ms\"\n\
             central_url = \"http://central:1\"\n[log]\nformat = \"json\"\n",
        );
        let overrides = Overrides {
            central_url: Some("http://central.example:50051".into()),
            ..Overrides::default()
        };
        let config = Config::load_from(Some(&path), no_env(), overrides).unwrap();
        assert_eq!(config.forward_retry_interval, Duration::from_millis(250));
        assert_eq!(config.central_url, "http://central.example:50051");
        assert_eq!(config.log.format, LogFormat::Json);
    }

    #[test]
    fn errors_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("site_id = \"a\"\nforward_window = 0\n", "forward_window"),
            (
                "site_id = \"a\"\nforward_window = 70000\n",
                "forward_window",
            ),
            ("site_id = \"a b\"\n", "site_id"),
            // Central's own notifications (its self-alerts) come from this id.
            (
                "site_id = \"_central\"\n",
                "site_id: \"_central\" is reserved for central's own notifications",
            ),
            (
                "site_id = \"a\"\nmin_free_disk_bytes = 1000\n",
                "min_free_disk_bytes: must be at least 1048576",
            ),
            (
                "site_id = \"a\"\nmax_buffer_bytes = 5\n",
                "max_buffer_bytes: must be at least 1048576",
            ),
            (
                "site_id = \"a\"\nmin_free_disk_bytes = \"lots\"\n",
                "min_free_disk_bytes",
            ),
            ("forward_window = 5\n", "site_id"),
            ("site_id = \"a\"\nlisten_adr = \"x\"\n", "listen_adr"),
            (
                "site_id = \"a\"\nconnect_timeout = \"soon\"\n",
                "connect_timeout",
            ),
            (
                "site_id = \"a\"\ncentral_url = \"central:1\"\n",
                "central_url",
            ),
            ("site_id = \"a\"\n[log]\nformat = \"xml\"\n", "format"),
            (
                "site_id = \"a\"\nmetrics_listen = \"9102\"\n",
                "metrics_listen",
            ),
            (
                "site_id = \"a\"\nmetrics_listen = \"127.0.0.1:50052\"\n",
                "metrics_listen",
            ),
            (
                "site_id = \"a\"\n[pair]\ninitial_role = \"active\"\nlisten = \"127.0.0.1:50053\"\n\
                 peer_url = \"http://127.0.0.1:50054\"\n",
                "node_name",
            ),
            (
                "site_id = \"a\"\n[pair]\nnode_name = \"n1\"\ninitial_role = \"leader\"\n\
                 listen = \"127.0.0.1:50053\"\npeer_url = \"http://127.0.0.1:50054\"\n",
                "initial_role",
            ),
            (
                "site_id = \"a\"\n[pair]\nnode_name = \"n1\"\ninitial_role = \"active\"\n\
                 listen = \"127.0.0.1:50053\"\npeer_url = \"http://127.0.0.1:50054\"\n\
                 failover_timeout = \"10ms\"\n",
                "pair.failover_timeout: must be at least",
            ),
            (
                "site_id = \"a\"\n[pair]\nnode_name = \"n1\"\ninitial_role = \"active\"\n\
                 listen = \"10.0.0.1:50053\"\npeer_url = \"http://10.0.0.2:50053\"\n",
                "pair.listen 10.0.0.1:50053 is not a loopback address",
            ),
            (
                "site_id = \"a\"\n[pair]\nnode_name = \"n1\"\ninitial_role = \"active\"\n\
                 listen = \"127.0.0.1:50052\"\npeer_url = \"http://127.0.0.1:50054\"\n",
                "pair.listen: must differ from listen_addr",
            ),
        ];
        for (text, key) in cases {
            let path = write(&dir, text);
            let err = Config::load_from(Some(&path), no_env(), Overrides::default()).unwrap_err();
            let full = format!("{err:#}");
            assert!(full.contains(key), "{text:?}: {full}");
        }
        let err = Config::load_from(Some(&path_of_missing(&dir)), no_env(), Overrides::default())
            .unwrap_err();
        assert!(err.to_string().contains("does not exist"));
    }

    #[test]
    fn central_link_timing_is_read_and_checked_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let defaults = Config::new("a").central;
        assert_eq!(
            (
                defaults.keepalive_interval,
                defaults.keepalive_timeout,
                defaults.ack_timeout
            ),
            (
                Duration::from_secs(2),
                Duration::from_secs(3),
                Duration::from_secs(60)
            )
        );
        let path = write(
            &dir,
            "site_id = \"a\"\n[central]\nkeepalive_interval = \"300ms\"\n\
             keepalive_timeout = \"1s\"\nack_timeout = \"2m\"\n",
        );
        let config = Config::load_from(Some(&path), no_env(), Overrides::default()).unwrap();
        assert_eq!(
            config.central,
            CentralLinkConfig {
                keepalive_interval: Duration::from_millis(300),
                keepalive_timeout: Duration::from_secs(1),
                ack_timeout: Duration::from_secs(120),
            }
        );
        for (text, message) in [
            (
                "[central]\nkeepalive_timeout = \"0s\"\n",
                "central.keepalive_timeout: must be greater than zero",
            ),
            ("[central]\nkeepalive = \"1s\"\n", "keepalive"),
        ] {
            let path = write(&dir, &format!("site_id = \"a\"\n{text}"));
            let err = Config::load_from(Some(&path), no_env(), Overrides::default()).unwrap_err();
            assert!(format!("{err:#}").contains(message), "{text:?}: {err:#}");
        }
    }

    #[test]
    fn window_message_is_exact() {
        let mut config = Config::new("site-a");
        config.forward_window = 0;
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "forward_window: must be between 1 and 65536"
        );
        assert!(Config::new("site-a").validate().is_ok());
    }

    fn path_of_missing(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join("missing.toml")
    }
}
