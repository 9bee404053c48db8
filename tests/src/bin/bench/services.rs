//! The components under test as real processes: `central-outbox` and `site-forwarder serve` from
//! the release build, each with a TOML file written for the run, its log in the run directory,
//! and readiness taken from `grpc.health.v1` (a bound port is not a ready service).
//!
//! Invariants: a [`Service`] is always stopped (SIGTERM, then SIGKILL after a grace period) or
//! killed when dropped, so a failed figure never leaves a process behind to skew the next one;
//! durability settings are never written into the configs, so the services run with their
//! defaults (WAL + `synchronous=FULL`).
//!
//! With `--tls` ([`enable_tls`], before any service starts) every config this module writes
//! turns TLS on: central serves mutual TLS with a throwaway CA's certificate, the site forwards
//! over `https://` presenting a client certificate for [`SITE_ID`], and the bench's own clients
//! of central present the same one. The site's `SiteNotify` port stays plaintext on loopback, as
//! deployed. A second client certificate, for [`OTHER_SITE_ID`], lets the bench submit as another
//! site ([`Service::connect_as`]): central accepts a `source_site_id` only from a caller whose
//! certificate names that site.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use outbox_tests::binaries::{self, BuiltBy};
use outbox_tests::pki::{CertFiles, Pki};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::proc_stats;

/// How long a service may take to report SERVING. Generous: central opening a database of a
/// million rows on a busy disk still takes well under a second.
const START_DEADLINE: Duration = Duration::from_secs(60);
/// How long a SIGTERM'd service gets to drain and exit before it is killed. Above the 5 s
/// `shutdown_timeout` the configs set.
const STOP_GRACE: Duration = Duration::from_secs(20);
/// Health is polled this often while starting; short, because start-up time counts in the
/// forwarding figure.
const HEALTH_POLL: Duration = Duration::from_millis(10);

/// The list every benchmark notification goes to, with two recipients as a small real list has.
pub(crate) const LIST: &str = "ops";
pub(crate) const RECIPIENTS: [&str; 2] = ["alice@plant.example.test", "bob@plant.example.test"];
/// Domain of central's From address, and so of every Message-ID (`<id@FROM_DOMAIN>`).
pub(crate) const FROM_DOMAIN: &str = "bench.example.test";
pub(crate) const SITE_ID: &str = "site-bench";
/// A second site the bench submits as, directly to central (the `fresh` figure's site B).
pub(crate) const OTHER_SITE_ID: &str = "site-b";

/// The certificates of `bench --tls`; unset without it. Set once, before the first service
/// starts, and read by every config and client this module makes.
static TLS: OnceLock<BenchTls> = OnceLock::new();

#[derive(Debug)]
struct BenchTls {
    ca: PathBuf,
    central: CertFiles,
    site: CertFiles,
    /// What the bench's clients of central use: the CA, and the site's certificate (central
    /// requires one on every connection, health checks included).
    client: ClientTlsConfig,
    /// The same with a certificate for [`OTHER_SITE_ID`].
    other_site_client: ClientTlsConfig,
}

/// Turns TLS on for every service started from now on, with a new CA and certificates written
/// to `dir` (which must outlive the services).
pub(crate) fn enable_tls(dir: &Path) -> Result<()> {
    let pki = Pki::new(dir, "bench").context("making the bench CA")?;
    let central = pki.server_cert()?;
    let site = pki.client_cert(SITE_ID)?;
    let client = pki.client_tls(Some(&site))?;
    let other_site_client = pki.client_tls(Some(&pki.client_cert(OTHER_SITE_ID)?))?;
    TLS.set(BenchTls {
        ca: pki.ca_cert().to_path_buf(),
        central,
        site,
        client,
        other_site_client,
    })
    .map_err(|_| anyhow!("TLS is set up already"))
}

/// Whether `--tls` is in force.
pub(crate) fn tls_enabled() -> bool {
    TLS.get().is_some()
}

/// Where the service binaries are.
#[derive(Debug, Clone)]
pub(crate) struct Binaries {
    pub central: PathBuf,
    pub site: PathBuf,
    /// Central takes `--apply-config`: its stored channel settings and lists are the
    /// database's unless told otherwise, and a run's central must deliver to that run's sink
    /// even when its database was copied from a fixture another central wrote. Older binaries
    /// (measured with `--bin-dir`) have no such flag: they wrote the file over the database at
    /// every start anyway.
    pub central_applies_config: bool,
}

impl Binaries {
    /// The binaries in `dir`, as they are; without one, built from the current sources next to
    /// this executable (target/release when run by `make bench`, whose own build first makes
    /// that a no-op), so a bench started with `cargo run` never measures an older service.
    pub(crate) fn locate(dir: Option<&Path>) -> Result<Self> {
        let dir = match dir {
            Some(dir) => dir.to_path_buf(),
            None => {
                let exe =
                    std::env::current_exe().context("cannot find the bench executable's path")?;
                // The bench is `<target dir>/<profile>/bench`.
                let profile_dir = exe
                    .parent()
                    .ok_or_else(|| anyhow!("the bench executable has no parent directory"))?;
                let target_dir = profile_dir
                    .parent()
                    .ok_or_else(|| anyhow!("{} is not in a target directory", exe.display()))?;
                binaries::build(target_dir, profile_dir, BuiltBy::CargoBuild)?
            }
        };
        let central = dir.join("central-outbox");
        let site = dir.join("site-forwarder");
        for bin in [&central, &site] {
            if !bin.exists() {
                bail!("{} is missing", bin.display());
            }
        }
        let help = std::process::Command::new(&central)
            .arg("--help")
            .output()
            .with_context(|| format!("cannot run {} --help", central.display()))?;
        let central_applies_config =
            String::from_utf8_lossy(&help.stdout).contains("--apply-config");
        Ok(Self {
            central,
            site,
            central_applies_config,
        })
    }
}

/// A loopback address that was free a moment ago. The services bind their configured address
/// themselves, and central must come back on a known port for the forwarding figure.
pub(crate) fn free_addr() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind a loopback port")?;
    Ok(listener.local_addr()?)
}

/// The TOML central runs with: its database at `database` (a `sqlite://` URL or an MS SQL
/// connection string, see [`crate::backend::CentralDb::url`]), email to the bench's SMTP sink at
/// `smtp`, the benchmark list, logs at warn. Every dispatcher and SMTP pacing key is left at
/// the service's default.
pub(crate) fn central_toml(addr: SocketAddr, database: &str, smtp: SocketAddr) -> String {
    central_toml_with_smtp(addr, database, smtp, "")
}

/// The `[smtp]` keys of a relay that takes at most `per_second` messages a second, in bursts of
/// up to `burst` (central's token bucket).
pub(crate) fn smtp_rate_limit(per_second: f64, burst: u32) -> String {
    format!("rate_limit_per_second = {per_second:?}\nrate_limit_burst = {burst}\n")
}

/// A `[retention]` section keeping terminal rows for `terminal` (whole seconds), appended to a
/// central config: its purge runs on becoming leader, so it starts with the figure.
pub(crate) fn retention_toml(terminal: Duration) -> String {
    format!(
        "\n[retention]\nterminal_retention = \"{}s\"\n",
        terminal.as_secs().max(1)
    )
}

/// [`central_toml`] with `smtp_keys` (whole `key = value` lines) added to its `[smtp]` section.
pub(crate) fn central_toml_with_smtp(
    addr: SocketAddr,
    database: &str,
    smtp: SocketAddr,
    smtp_keys: &str,
) -> String {
    let recipients = RECIPIENTS
        .iter()
        .map(|r| format!("\"{r}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "listen_addr = \"{addr}\"\n\
         database = {database}\n\
         node_id = \"bench-central\"\n\
         shutdown_timeout = \"5s\"\n\
         \n[log]\nfilter = \"warn\"\n\
         \n[smtp]\nhost = \"{host}\"\nport = {port}\ntls = \"none\"\n\
         from_address = \"outbox@{FROM_DOMAIN}\"\n{smtp_keys}\
         \n[[lists]]\nname = \"{LIST}\"\ntype = \"email\"\nrecipients = [{recipients}]\n{tls}",
        database = toml_string(database),
        host = smtp.ip(),
        port = smtp.port(),
        tls = match TLS.get() {
            Some(tls) => format!(
                "\n[tls]\ncert = {}\nkey = {}\nclient_ca = {}\n",
                toml_path(&tls.central.cert),
                toml_path(&tls.central.key),
                toml_path(&tls.ca),
            ),
            None => String::new(),
        },
    )
}

fn toml_path(path: &Path) -> String {
    toml_string(&path.display().to_string())
}

/// `value` as a TOML basic string. An MS SQL connection string may hold any character in its
/// password, and a `"` or `\` left unescaped would make central refuse (or misread) its config.
fn toml_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The TOML the site-forwarder runs with. `forward_retry_interval` is short so the forwarder
/// notices a central that just started within 100 ms (the forwarding figure times from
/// central's start); every other key is the default.
pub(crate) fn site_toml(addr: SocketAddr, buffer: &Path, central: SocketAddr) -> String {
    let (scheme, tls) = match TLS.get() {
        Some(tls) => (
            "https",
            format!(
                "\n[tls]\nca = {}\ncert = {}\nkey = {}\n",
                toml_path(&tls.ca),
                toml_path(&tls.site.cert),
                toml_path(&tls.site.key),
            ),
        ),
        None => ("http", String::new()),
    };
    format!(
        "site_id = \"{SITE_ID}\"\n\
         listen_addr = \"{addr}\"\n\
         buffer_path = \"{buffer}\"\n\
         central_url = \"{scheme}://{central}\"\n\
         forward_retry_interval = \"100ms\"\n\
         shutdown_timeout = \"5s\"\n\
         \n[log]\nfilter = \"warn\"\n{tls}",
        buffer = buffer.display(),
    )
}

/// One running service process.
#[derive(Debug)]
pub(crate) struct Service {
    name: String,
    child: tokio::process::Child,
    pid: u32,
    pub addr: SocketAddr,
    log: PathBuf,
    /// Whether its gRPC port serves TLS (central under `--tls`).
    tls: bool,
}

impl Service {
    /// Writes `toml` to `dir/<name>.toml`, starts central on it and waits for SERVING.
    pub(crate) async fn central(
        bins: &Binaries,
        dir: &Path,
        name: &str,
        toml: &str,
    ) -> Result<Self> {
        let addr = listen_addr_of(toml)?;
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, toml).with_context(|| format!("writing {}", config.display()))?;
        let mut args = vec!["--config".to_string(), config.display().to_string()];
        if bins.central_applies_config {
            args.push("--apply-config".to_string());
        }
        Self::start(name, &bins.central, &args, addr, dir, tls_enabled()).await
    }

    /// Writes `toml` to `dir/<name>.toml`, starts `site-forwarder serve` on it and waits for
    /// SERVING.
    pub(crate) async fn site(bins: &Binaries, dir: &Path, name: &str, toml: &str) -> Result<Self> {
        let addr = listen_addr_of(toml)?;
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, toml).with_context(|| format!("writing {}", config.display()))?;
        let args = vec![
            "serve".to_string(),
            "--config".to_string(),
            config.display().to_string(),
        ];
        Self::start(name, &bins.site, &args, addr, dir, false).await
    }

    async fn start(
        name: &str,
        program: &Path,
        args: &[String],
        addr: SocketAddr,
        dir: &Path,
        tls: bool,
    ) -> Result<Self> {
        let log = dir.join(format!("{name}.log"));
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = tokio::process::Command::new(program)
            .args(args)
            // The config's log filter must win: RUST_LOG would override it.
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow!("{name} exited before its pid could be read"))?;
        let mut service = Self {
            name: name.to_string(),
            child,
            pid,
            addr,
            log,
            tls,
        };
        service.wait_until_serving().await?;
        Ok(service)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// A fresh HTTP/2 connection to the service (over TLS when it serves TLS).
    pub(crate) async fn connect(&self) -> Result<Channel> {
        dial(self.addr, self.tls, SITE_ID).await
    }

    /// A fresh connection as site `site` ([`SITE_ID`] or [`OTHER_SITE_ID`]): over TLS, with
    /// that site's client certificate, so central lets it submit as that site.
    pub(crate) async fn connect_as(&self, site: &str) -> Result<Channel> {
        dial(self.addr, self.tls, site).await
    }

    /// `count` separate connections to the service, as [`connections`] makes them.
    pub(crate) async fn connections(&self, count: usize) -> Result<Vec<Channel>> {
        let mut channels = Vec::with_capacity(count);
        for _ in 0..count {
            channels.push(self.connect().await?);
        }
        Ok(channels)
    }

    /// Fails if the process has exited (a crash mid-figure), naming it and quoting its log.
    pub(crate) fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited unexpectedly ({status}); end of its log:\n{}",
                self.name,
                self.log_tail()
            );
        }
        Ok(())
    }

    async fn wait_until_serving(&mut self) -> Result<()> {
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
        let started = Instant::now();
        loop {
            self.check_alive()
                .with_context(|| format!("{} did not start", self.name))?;
            if let Ok(channel) = self.connect().await {
                let reply = HealthClient::new(channel)
                    .check(HealthCheckRequest {
                        service: String::new(),
                    })
                    .await;
                if let Ok(reply) = reply
                    && reply.into_inner().status() == ServingStatus::Serving
                {
                    return Ok(());
                }
            }
            if started.elapsed() > START_DEADLINE {
                bail!(
                    "{} did not report SERVING within {START_DEADLINE:?}; end of its log:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            tokio::time::sleep(HEALTH_POLL).await;
        }
    }

    /// Memory figures of the process now.
    pub(crate) fn memory(&self) -> Result<proc_stats::Memory> {
        proc_stats::memory(self.pid).with_context(|| format!("reading {}'s memory", self.name))
    }

    /// SIGTERM, then wait for a clean exit (SIGKILL after [`STOP_GRACE`]). A clean exit matters
    /// when the database file is reused afterwards (templates): SQLite checkpoints on close.
    ///
    /// Returns the warnings and errors in the service's log (a lease that could not be renewed,
    /// a failed store call, a panic), without colours and without the [`EXPECTED_WARNINGS`].
    /// They are counted on stderr here, because the log goes with the run directory unless
    /// `--keep`, and a figure measured while the service was complaining needs a second look.
    pub(crate) async fn stop(mut self) -> Result<Vec<String>> {
        if self.child.try_wait()?.is_none() {
            self.terminate().await?;
        }
        let lines: Vec<String> = self
            .log_lines()
            .iter()
            .map(|line| without_colours(line))
            .filter(|line| is_problem(line))
            .collect();
        if let Some(first) = lines.first() {
            eprintln!(
                "bench: {} logged {} warning(s) or error(s); the first: {first}",
                self.name,
                lines.len()
            );
        }
        Ok(lines)
    }

    async fn terminate(&mut self) -> Result<()> {
        let sent = tokio::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .await
            .context("running kill -TERM")?;
        if !sent.success() {
            bail!("kill -TERM {} failed ({sent})", self.pid);
        }
        match tokio::time::timeout(STOP_GRACE, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    bail!(
                        "{} exited with {status} after SIGTERM; end of its log:\n{}",
                        self.name,
                        self.log_tail()
                    );
                }
                Ok(())
            }
            Err(_) => {
                self.child.kill().await?;
                bail!(
                    "{} did not exit within {STOP_GRACE:?} of SIGTERM",
                    self.name
                )
            }
        }
    }

    /// Every line of the service's log (none if it cannot be read).
    fn log_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The last lines of the service's log, for error messages.
    pub(crate) fn log_tail(&self) -> String {
        let lines = self.log_lines();
        let from = lines.len().saturating_sub(15);
        let tail = lines[from..].join("\n");
        if tail.is_empty() {
            format!("(empty: {})", self.log.display())
        } else {
            tail
        }
    }
}

/// Warnings that say only what the bench set up: tiberius warns on every MS SQL connection
/// whose server certificate is trusted without validation, which a `--database` with
/// `TrustServerCertificate=true` (a local test server's self-signed certificate) asks for; and
/// a site retries a central that is down, as the Send figures, the templates and the forwarding
/// backlog have it on purpose.
const EXPECTED_WARNINGS: [&str; 2] = [
    "Trusting the server certificate without validation",
    "cannot forward to central; will reconnect",
];

/// Whether a log line is a warning or an error worth reporting. The services log with
/// tracing's text format (`<time>  WARN <target>: ...`); the site also prints where it listens,
/// which is not a problem, and a panic is one whatever its format.
fn is_problem(line: &str) -> bool {
    let level = line.contains(" WARN ") || line.contains(" ERROR ");
    (level && !EXPECTED_WARNINGS.iter().any(|w| line.contains(w))) || line.contains("panicked")
}

/// `line` without ANSI colour sequences (the services colour their log even into a file).
fn without_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// An HTTP/2 connection to `addr`, failing fast when nothing listens.
pub(crate) async fn connect(addr: SocketAddr) -> Result<Channel> {
    dial(addr, false, SITE_ID).await
}

/// An HTTP/2 connection to `addr`, over TLS with the bench's certificate for `site` when `tls`.
async fn dial(addr: SocketAddr, tls: bool, site: &str) -> Result<Channel> {
    let endpoint = match (tls, TLS.get()) {
        (true, Some(config)) => {
            let client = match site {
                SITE_ID => &config.client,
                OTHER_SITE_ID => &config.other_site_client,
                other => bail!("the bench has no client certificate for site {other:?}"),
            };
            Endpoint::from_shared(format!("https://{addr}"))?.tls_config(client.clone())?
        }
        (true, None) => bail!("{addr} serves TLS, but the bench has no certificates"),
        (false, _) => Endpoint::from_shared(format!("http://{addr}"))?,
    };
    Ok(endpoint
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .connect()
        .await?)
}

/// `count` separate connections to `addr`: one per simulated script, as separate scripts would
/// each have their own.
pub(crate) async fn connections(addr: SocketAddr, count: usize) -> Result<Vec<Channel>> {
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count {
        channels.push(connect(addr).await?);
    }
    Ok(channels)
}

/// The `listen_addr` line of a config this module wrote.
fn listen_addr_of(toml: &str) -> Result<SocketAddr> {
    toml.lines()
        .find_map(|line| line.strip_prefix("listen_addr = "))
        .map(|value| value.trim_matches('"'))
        .ok_or_else(|| anyhow!("config has no listen_addr"))?
        .parse()
        .context("config's listen_addr")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_are_removed() {
        assert_eq!(
            without_colours("\u{1b}[2m2026-11-23T19:18:22Z\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m x"),
            "2026-11-23T19:18:22Z  WARN x"
        );
    }

    #[test]
    fn only_warnings_errors_and_panics_are_problems() {
        assert!(is_problem(
            "2026-11-23T19:18:22Z  WARN central_outbox::lease: renewal failed"
        ));
        assert!(is_problem(
            "2026-11-23T19:18:22Z ERROR central_outbox: store unavailable"
        ));
        assert!(is_problem("thread 'main' panicked at src/main.rs:1:1"));
        assert!(!is_problem("site-forwarder listening on 127.0.0.1:46819"));
        assert!(!is_problem(
            "2026-11-23T19:18:22Z  WARN tiberius::client::tls_stream::rustls_tls_stream: \
             Trusting the server certificate without validation."
        ));
    }

    #[test]
    fn database_strings_are_quoted_for_toml() {
        assert_eq!(
            toml_string(r#"server=h;password=a"b\c"#),
            r#""server=h;password=a\"b\\c""#
        );
    }
}
