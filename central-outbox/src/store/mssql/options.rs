//! How to reach the MS SQL database: the two connection-string forms central accepts, parsed into
//! [`MsSqlOptions`], and their translation into a tiberius [`Config`].
//!
//! - URL: `mssql://user:pass@host:1433/database?encrypt=true&trust_server_certificate=false&ca_file=/etc/ssl/db-ca.pem`
//! - ADO.NET style: `server=tcp:host,1433;database=outbox;user id=outbox;password=...;encrypt=true`
//!
//! Both name the same settings. Errors name the offending key and never contain the password
//! (neither does `Debug`: the password is a [`Secret`]).

use std::path::PathBuf;
use std::time::Duration;

use tiberius::{AuthMethod, Config, EncryptionLevel};

use crate::domain::channel::Secret;

/// TDS's registered port.
const DEFAULT_PORT: u16 = 1433;
/// Connections per replica, all opened before central serves (see [`MsSqlOptions::min_idle`]):
/// the dispatcher claims and records on a few at once (its lease has a connection of its own),
/// ingest commits and admin queries take the rest. More sessions than a replica runs at once
/// only add work on the server: on Babelfish (2 cores) a fixed pool of 6 dispatched 4,896/s and
/// ingested 1,066/s, one of 10 3,586/s and 445/s (BENCHMARKS.md, "A pool opened in full").
const DEFAULT_POOL_MAX_SIZE: u32 = 6;
/// As ADO.NET's `Connect Timeout` default.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// As ADO.NET's `Command Timeout` default.
const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether and how the connection is encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encrypt {
    /// TDS 8.0: TLS from the first byte (SQL Server 2022+, Azure SQL).
    Strict,
    /// TLS for the whole session, negotiated at pre-login (the default).
    Required,
    /// TLS for the login packet only (ADO.NET's `Encrypt=false`). Development only.
    LoginOnly,
}

/// Which server certificates are trusted when encrypting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// The system's root certificates.
    SystemRoots,
    /// Only certificates issued by the CA in this PEM file.
    CaFile(PathBuf),
    /// Any certificate, unchecked: development only (a self-signed container certificate).
    ServerCertificate,
}

/// Settings of the MS SQL backend, from the `database` connection string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MsSqlOptions {
    pub host: String,
    pub port: u16,
    pub database: String,
    pub user: String,
    pub password: Secret,
    pub encrypt: Encrypt,
    pub trust: Trust,
    /// Most pooled connections.
    pub pool_max_size: u32,
    /// Connections kept open, warmed, while idle, as configured; `None`: the whole pool
    /// ([`Self::min_idle`] says what is used).
    pub pool_min_idle: Option<u32>,
    /// Bounds a TCP connect plus the login handshake, and a wait for a pooled connection.
    pub connect_timeout: Duration,
    /// Bounds each wait for the server's next response within a statement batch.
    pub command_timeout: Duration,
    /// Shown in `sys.dm_exec_sessions.program_name`.
    pub application_name: String,
}

/// A bad connection string: which key, and what is wrong (never the password's value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct OptionsError {
    pub key: String,
    pub problem: String,
}

fn bad(key: &str, problem: impl Into<String>) -> OptionsError {
    OptionsError {
        key: key.to_owned(),
        problem: problem.into(),
    }
}

impl MsSqlOptions {
    /// Whether `text` is meant for this backend: an `mssql://` URL or an ADO.NET-style string.
    pub fn recognises(text: &str) -> bool {
        let lower = text.trim_start().to_ascii_lowercase();
        lower.starts_with("mssql://")
            || (!lower.contains("://")
                && ["server=", "data source=", "address="]
                    .iter()
                    .any(|k| lower.starts_with(k) || lower.contains(&format!(";{k}"))))
    }

    /// Parses either form (see the module documentation).
    pub fn parse(text: &str) -> Result<Self, OptionsError> {
        if text
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("mssql://")
        {
            Self::parse_url(text.trim())
        } else {
            Self::parse_ado(text)
        }
    }

    fn defaults(host: String, port: u16, database: String, user: String, password: String) -> Self {
        Self {
            host,
            port,
            database,
            user,
            password: Secret::new(password),
            encrypt: Encrypt::Required,
            trust: Trust::SystemRoots,
            pool_max_size: DEFAULT_POOL_MAX_SIZE,
            pool_min_idle: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            application_name: "central-outbox".into(),
        }
    }

    /// `mssql://user:pass@host:port/database?key=value&...`; user and password percent-encoded.
    fn parse_url(text: &str) -> Result<Self, OptionsError> {
        // The url crate's error text never includes the input, so it cannot leak the password.
        let url = url::Url::parse(text).map_err(|e| bad("url", format!("not a valid URL: {e}")))?;
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("host", "missing (mssql://user:pass@HOST:1433/database)"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = url.port().unwrap_or(DEFAULT_PORT);
        let database = percent_decode(url.path().trim_start_matches('/'), "database")?;
        if database.is_empty() || database.contains('/') {
            return Err(bad(
                "database",
                "missing or not one name (mssql://user:pass@host:1433/DATABASE)",
            ));
        }
        let user = percent_decode(url.username(), "user")?;
        let password = percent_decode(url.password().unwrap_or(""), "password")?;
        let mut options = Self::defaults(host, port, database, user, password);
        for (key, value) in url.query_pairs() {
            options.apply(&key.to_ascii_lowercase(), &value)?;
        }
        options.check()
    }

    /// `key=value;key=value`, keys case-insensitive; a value may be quoted with `"` or `'`
    /// (doubling the quote inside) to contain `;`, as in ADO.NET.
    fn parse_ado(text: &str) -> Result<Self, OptionsError> {
        let mut options = Self::defaults(
            String::new(),
            DEFAULT_PORT,
            String::new(),
            String::new(),
            String::new(),
        );
        for (key, value) in ado_pairs(text)? {
            match key.as_str() {
                "server" | "data source" | "address" | "addr" | "network address" => {
                    let server = value.trim();
                    let server = server
                        .strip_prefix("tcp:")
                        .or_else(|| server.strip_prefix("TCP:"))
                        .unwrap_or(server);
                    if server.contains('\\') {
                        return Err(bad(
                            "server",
                            "named instances (host\\instance) need the SQL Browser service, which \
                             is not supported; give host,port instead",
                        ));
                    }
                    let (host, port) = match server.split_once(',') {
                        Some((host, port)) => (
                            host.trim(),
                            port.trim()
                                .parse()
                                .map_err(|_| bad("server", "the port after ',' is not a number"))?,
                        ),
                        None => (server, DEFAULT_PORT),
                    };
                    options.host = host.to_owned();
                    options.port = port;
                }
                "database" | "initial catalog" => options.database = value.trim().to_owned(),
                "user id" | "uid" | "user" => options.user = value,
                "password" | "pwd" => options.password = Secret::new(value),
                "trustservercertificate" | "trust server certificate" => {
                    options.apply("trust_server_certificate", &value)?;
                }
                "trustservercertificateca" | "ca file" | "ca_file" => {
                    options.apply("ca_file", &value)?;
                }
                "max pool size" => options.apply("pool_max_size", &value)?,
                "min pool size" => options.apply("pool_min_idle", &value)?,
                "connect timeout" | "connection timeout" | "timeout" => {
                    options.apply("connect_timeout", &seconds(&value, &key)?)?;
                }
                "command timeout" => options.apply("command_timeout", &seconds(&value, &key)?)?,
                "application name" | "app" => options.apply("application_name", &value)?,
                "encrypt" => options.apply("encrypt", &value)?,
                // Accepted and meaningless here: central pools itself and never reads back a
                // password from the connection.
                "persist security info" | "pooling" | "multipleactiveresultsets" => {}
                "integrated security" | "trusted_connection" => {
                    if parse_bool(&value).unwrap_or(true) {
                        return Err(bad(&key, "Windows authentication is not supported"));
                    }
                }
                other => {
                    return Err(bad(
                        other,
                        "unknown key (known: server, database, user id, password, encrypt, \
                         trustservercertificate, trustservercertificateca, max pool size, \
                         min pool size, connect timeout, command timeout, application name)",
                    ));
                }
            }
        }
        if options.host.is_empty() {
            return Err(bad("server", "missing (server=tcp:HOST,1433)"));
        }
        if options.database.is_empty() {
            return Err(bad("database", "missing (database=NAME)"));
        }
        options.check()
    }

    /// Applies one optional setting, by its URL query key.
    fn apply(&mut self, key: &str, value: &str) -> Result<(), OptionsError> {
        match key {
            "encrypt" => {
                self.encrypt = match value.trim().to_ascii_lowercase().as_str() {
                    "strict" => Encrypt::Strict,
                    "true" | "yes" | "mandatory" | "required" => Encrypt::Required,
                    "false" | "no" | "optional" => Encrypt::LoginOnly,
                    _ => return Err(bad(key, "must be strict, true or false")),
                };
            }
            "trust_server_certificate" => {
                let trust = parse_bool(value).ok_or_else(|| bad(key, "must be true or false"))?;
                match (&self.trust, trust) {
                    (Trust::CaFile(_), true) => {
                        return Err(bad(key, "cannot be combined with ca_file"));
                    }
                    (_, true) => self.trust = Trust::ServerCertificate,
                    (Trust::ServerCertificate, false) => self.trust = Trust::SystemRoots,
                    _ => {}
                }
            }
            "ca_file" => {
                if self.trust == Trust::ServerCertificate {
                    return Err(bad(key, "cannot be combined with trust_server_certificate"));
                }
                if value.trim().is_empty() {
                    return Err(bad(key, "must be a path to a PEM file"));
                }
                self.trust = Trust::CaFile(PathBuf::from(value.trim()));
            }
            "pool_max_size" => {
                self.pool_max_size = value
                    .trim()
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| bad(key, "must be a number between 1 and 1000"))?;
            }
            "pool_min_idle" => {
                self.pool_min_idle = Some(
                    value
                        .trim()
                        .parse()
                        .map_err(|_| bad(key, "must be a number"))?,
                );
            }
            "connect_timeout" | "command_timeout" => {
                let duration = humantime::parse_duration(value.trim())
                    .map_err(|e| bad(key, format!("not a duration like 15s: {e}")))?;
                if duration < Duration::from_secs(1) {
                    return Err(bad(key, "must be at least 1s"));
                }
                if key == "connect_timeout" {
                    self.connect_timeout = duration;
                } else {
                    self.command_timeout = duration;
                }
            }
            "application_name" => self.application_name = value.to_owned(),
            other => {
                return Err(bad(
                    other,
                    "unknown key (known: encrypt, trust_server_certificate, ca_file, \
                     pool_max_size, pool_min_idle, connect_timeout, command_timeout, \
                     application_name)",
                ));
            }
        }
        Ok(())
    }

    fn check(self) -> Result<Self, OptionsError> {
        if self.user.is_empty() {
            return Err(bad(
                "user",
                "missing: SQL Server authentication needs a login (and password)",
            ));
        }
        if self.pool_min_idle.is_some_and(|n| n > self.pool_max_size) {
            return Err(bad("pool_min_idle", "must not exceed pool_max_size"));
        }
        Ok(self)
    }

    /// The driver configuration for these options.
    pub fn tiberius_config(&self) -> Config {
        let mut config = Config::new();
        config.host(&self.host);
        config.port(self.port);
        config.database(&self.database);
        config.application_name(&self.application_name);
        config.authentication(AuthMethod::sql_server(&self.user, self.password.expose()));
        config.encryption(match self.encrypt {
            Encrypt::Strict => EncryptionLevel::Strict,
            Encrypt::Required => EncryptionLevel::Required,
            Encrypt::LoginOnly => EncryptionLevel::Off,
        });
        match &self.trust {
            Trust::SystemRoots => {}
            Trust::CaFile(path) => config.trust_cert_ca(path.display()),
            Trust::ServerCertificate => config.trust_cert(),
        }
        config.handshake_timeout(Some(self.connect_timeout));
        config.command_timeout(Some(self.command_timeout));
        config
    }

    /// Connections the pool keeps open, warmed, while idle: the configured `pool_min_idle`
    /// (0 opens every connection on demand), by default the whole pool (`pool_max_size`),
    /// never more than that.
    ///
    /// Why the whole pool by default: a connection opened under load costs the server its
    /// warm-up while the load waits, and on Babelfish that is seconds of a server core per
    /// connection, taken from the very statements the load runs. With two spares kept (the
    /// previous default) a burst of dispatch or ingest grew the pool connection by connection,
    /// every one warmed mid-burst: Babelfish dispatch 803 - 1,018/s and ingest 104/s, against
    /// 4,697 - 4,723/s and 1,103 - 1,228/s with the pool of 6 opened in full before central
    /// serves (BENCHMARKS.md, "A pool opened in full"). A fixed-size pool is also what HikariCP recommends for the same
    /// reason. The cost is paid once, at start-up, before central serves or takes the lease.
    pub fn min_idle(&self) -> u32 {
        self.pool_min_idle
            .unwrap_or(self.pool_max_size)
            .min(self.pool_max_size)
    }

    /// `host:port/database` as user, for logs (no password).
    pub fn describe(&self) -> String {
        format!(
            "{}:{}/{} as {}",
            self.host, self.port, self.database, self.user
        )
    }
}

/// Seconds as ADO.NET gives timeouts, turned into a humantime duration text.
fn seconds(value: &str, key: &str) -> Result<String, OptionsError> {
    let secs: u64 = value
        .trim()
        .parse()
        .map_err(|_| bad(key, "must be a whole number of seconds"))?;
    Ok(format!("{secs}s"))
}

fn parse_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "1" => Some(true),
        "false" | "no" | "0" => Some(false),
        _ => None,
    }
}

fn percent_decode(text: &str, key: &str) -> Result<String, OptionsError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| bad(key, "has a malformed %-escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad(key, "is not UTF-8 after %-decoding"))
}

/// Splits an ADO.NET connection string into lower-cased keys and values.
fn ado_pairs(text: &str) -> Result<Vec<(String, String)>, OptionsError> {
    let mut pairs = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches([';', ' ', '\t', '\r', '\n']);
        if rest.is_empty() {
            return Ok(pairs);
        }
        let (key, after) = rest.split_once('=').ok_or_else(|| {
            bad(
                "connection string",
                "expected key=value pairs separated by ';'",
            )
        })?;
        let key = key.trim().to_ascii_lowercase();
        if key.is_empty() {
            return Err(bad("connection string", "a key is empty"));
        }
        let after = after.trim_start();
        let (value, remainder) = match after.chars().next() {
            Some(quote @ ('"' | '\'')) => {
                let mut value = String::new();
                let mut chars = after[1..].char_indices().peekable();
                let mut end = None;
                while let Some((i, c)) = chars.next() {
                    if c == quote {
                        if chars.peek().is_some_and(|&(_, next)| next == quote) {
                            value.push(quote);
                            chars.next();
                        } else {
                            end = Some(i + 2);
                            break;
                        }
                    } else {
                        value.push(c);
                    }
                }
                let end = end.ok_or_else(|| bad(&key, "has an unterminated quoted value"))?;
                (value, &after[end..])
            }
            _ => match after.split_once(';') {
                Some((value, remainder)) => (value.trim_end().to_owned(), remainder),
                None => (after.trim_end().to_owned(), ""),
            },
        };
        pairs.push((key, value));
        rest = remainder;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_form_with_every_option() {
        let o = MsSqlOptions::parse(
            "mssql://outbox:p%40ss%3Bword@db.plant.example:14330/Outbox?encrypt=strict\
             &ca_file=/etc/ssl/db-ca.pem&pool_max_size=20&pool_min_idle=2\
             &connect_timeout=5s&command_timeout=1m&application_name=central-a",
        )
        .unwrap();
        assert_eq!(o.host, "db.plant.example");
        assert_eq!(o.port, 14330);
        assert_eq!(o.database, "Outbox");
        assert_eq!(o.user, "outbox");
        assert_eq!(o.password.expose(), "p@ss;word");
        assert_eq!(o.encrypt, Encrypt::Strict);
        assert_eq!(o.trust, Trust::CaFile("/etc/ssl/db-ca.pem".into()));
        assert_eq!((o.pool_max_size, o.pool_min_idle), (20, Some(2)));
        assert_eq!(o.connect_timeout, Duration::from_secs(5));
        assert_eq!(o.command_timeout, Duration::from_secs(60));
        assert_eq!(o.application_name, "central-a");
    }

    #[test]
    fn url_defaults() {
        let o = MsSqlOptions::parse("mssql://sa:pw@localhost/master").unwrap();
        assert_eq!(o.port, 1433);
        assert_eq!(o.encrypt, Encrypt::Required);
        assert_eq!(o.trust, Trust::SystemRoots);
        assert_eq!(o.pool_max_size, DEFAULT_POOL_MAX_SIZE);
        assert_eq!(
            o.min_idle(),
            DEFAULT_POOL_MAX_SIZE,
            "the whole pool by default"
        );
        let o = MsSqlOptions::parse("mssql://sa:pw@localhost/master?pool_max_size=1").unwrap();
        assert_eq!(o.min_idle(), 1, "never more than the pool holds");
        let o = MsSqlOptions::parse("mssql://sa:pw@localhost/master?pool_min_idle=0").unwrap();
        assert_eq!(o.min_idle(), 0, "on demand when asked");
        let o = MsSqlOptions::parse(
            "mssql://sa:pw@localhost:1433/master?trust_server_certificate=true&encrypt=false",
        )
        .unwrap();
        assert_eq!(o.trust, Trust::ServerCertificate);
        assert_eq!(o.encrypt, Encrypt::LoginOnly);
    }

    #[test]
    fn ado_form_with_quotes_and_synonyms() {
        let o = MsSqlOptions::parse(
            "Server=tcp:db.plant.example,1444;Initial Catalog=Outbox;User ID=outbox;\
             Password=\"a;b\"\"c\";Encrypt=True;TrustServerCertificate=False;\
             Connect Timeout=7;Command Timeout=45;Max Pool Size=4;MultipleActiveResultSets=False",
        )
        .unwrap();
        assert_eq!((o.host.as_str(), o.port), ("db.plant.example", 1444));
        assert_eq!(o.database, "Outbox");
        assert_eq!(o.user, "outbox");
        assert_eq!(o.password.expose(), "a;b\"c");
        assert_eq!(o.encrypt, Encrypt::Required);
        assert_eq!(o.trust, Trust::SystemRoots);
        assert_eq!(o.connect_timeout, Duration::from_secs(7));
        assert_eq!(o.command_timeout, Duration::from_secs(45));
        assert_eq!(o.pool_max_size, 4);
        let o = MsSqlOptions::parse(
            "server=localhost;database=outbox;uid=sa;pwd=x;TrustServerCertificateCA=/ca.pem",
        )
        .unwrap();
        assert_eq!(o.port, 1433);
        assert_eq!(o.trust, Trust::CaFile("/ca.pem".into()));
    }

    #[test]
    fn recognises_both_forms_only() {
        assert!(MsSqlOptions::recognises("mssql://a:b@h/db"));
        assert!(MsSqlOptions::recognises("Server=h;Database=d"));
        assert!(MsSqlOptions::recognises("database=d;data source=h"));
        assert!(!MsSqlOptions::recognises("sqlite://var/central.db"));
        assert!(!MsSqlOptions::recognises("var/central.db"));
    }

    #[test]
    fn errors_name_the_key_and_never_the_password() {
        let secret = "Hunter2-TopSecret";
        let cases = [
            (format!("mssql://sa:{secret}@host"), "database"),
            (format!("mssql://sa:{secret}@host/"), "database"),
            (format!("mssql://:{secret}@host/db"), "user"),
            (
                format!("mssql://sa:{secret}@host/db?encrypt=maybe"),
                "encrypt",
            ),
            (format!("mssql://sa:{secret}@host/db?colour=red"), "colour"),
            (
                format!("mssql://sa:{secret}@host/db?pool_max_size=0"),
                "pool_max_size",
            ),
            (
                format!("mssql://sa:{secret}@host/db?trust_server_certificate=true&ca_file=/x"),
                "ca_file",
            ),
            (format!("server=h;user id=sa;password={secret}"), "database"),
            (
                format!("database=d;user id=sa;password={secret};server=h\\SQLEXPRESS"),
                "server",
            ),
            (
                format!("server=h;database=d;user id=sa;password={secret};Colour=red"),
                "colour",
            ),
            (
                format!("server=h;database=d;user id=sa;password='{secret}"),
                "password",
            ),
            (format!("server=h;database=d;password={secret}"), "user"),
        ];
        for (text, key) in cases {
            let err = MsSqlOptions::parse(&text).unwrap_err();
            assert_eq!(err.key, key, "{err}");
            assert!(!err.to_string().contains(secret), "{err}");
        }
        let o = MsSqlOptions::parse(&format!("mssql://sa:{secret}@host/db")).unwrap();
        assert!(!format!("{o:?}").contains(secret));
        assert!(!o.describe().contains(secret));
    }
}
