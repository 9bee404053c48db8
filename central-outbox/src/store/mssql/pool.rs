//! The connection pool's manager: how a pooled MS SQL connection is opened, checked and thrown
//! away. (The published bb8 adapter for tiberius pins tiberius 0.12, hence our own.)
//!
//! Invariant: a connection goes back into the pool only if every request it carried finished
//! cleanly. A request that saw an IO error, a timeout or a fatal server error, or that was
//! abandoned half way (its future dropped by a timeout or a cancelled task), leaves the TDS
//! stream in an unknown state, so [`Health`] marks it and `has_broken` makes bb8 close it.

use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tiberius::error::{Error, IoErrorKind};
use tiberius::{Client, Row, ToSql};
use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

use super::error::{breaks_connection, is_transient_connect};
use super::options::MsSqlOptions;

/// Connect attempts before giving up on a transient failure (refused, reset, server starting).
const CONNECT_ATTEMPTS: u32 = 4;
/// First pause between connect attempts; doubled each time, with jitter.
const CONNECT_BACKOFF: Duration = Duration::from_millis(250);
/// A connection that finished a request cleanly this recently is handed out without the
/// check-out round trip: it was answering a moment ago, and a clean finish leaves no transaction
/// open. Under load that round trip was one call in three on the server (each call costs far more
/// than its statement on Babelfish); a connection idle longer is still checked, which is where a
/// server restart or failover leaves dead ones.
const VOUCHED_FOR: Duration = Duration::from_secs(1);
/// Routing redirects followed per connect. Azure SQL's gateway redirects once, to the node
/// hosting the database; a chain longer than this is a misconfiguration, not a topology.
const MAX_REDIRECTS: u32 = 2;

/// Whether a connection is still fit for reuse. Kept apart from the connection so the discard
/// rules can be tested without a server.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Health {
    /// A request started and has not finished: set before sending, cleared when the response
    /// has been read to its end. Still set when the pool gets the connection back means the
    /// request's future was dropped mid-way (a timeout or cancellation).
    in_flight: bool,
    /// A request failed in a way that leaves the connection unusable.
    broken: bool,
    /// When a request last finished without an error.
    last_clean: Option<Instant>,
}

impl Health {
    /// A request is about to be sent.
    pub(super) fn start(&mut self) {
        self.in_flight = true;
    }

    /// The request's response was read to its end, successfully or with this error.
    pub(super) fn finish(&mut self, error: Option<&Error>) {
        self.finish_at(error, Instant::now());
    }

    fn finish_at(&mut self, error: Option<&Error>, now: Instant) {
        self.in_flight = false;
        self.last_clean = error.is_none().then_some(now);
        if error.is_some_and(breaks_connection) {
            self.broken = true;
        }
    }

    /// Whether the connection can skip the check-out test at `now`: it finished a request
    /// cleanly within [`VOUCHED_FOR`] and is not broken.
    pub(super) fn vouched_for(&self, now: Instant) -> bool {
        !self.is_broken()
            && self
                .last_clean
                .is_some_and(|at| now.saturating_duration_since(at) < VOUCHED_FOR)
    }

    /// Whether the pool must close this connection instead of handing it out again.
    pub(super) fn is_broken(&self) -> bool {
        self.broken || self.in_flight
    }
}

/// One bound parameter, owned so a statement's parameters can be built up dynamically.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Param {
    Text(Option<String>),
    BigInt(Option<i64>),
    Int(Option<i32>),
    Float(Option<f64>),
    Guid(Option<uuid::Uuid>),
    Time(Option<chrono::DateTime<chrono::Utc>>),
    Binary(Vec<u8>),
}

impl ToSql for Param {
    fn to_sql(&self) -> tiberius::ColumnData<'_> {
        match self {
            Self::Text(v) => v.to_sql(),
            Self::BigInt(v) => v.to_sql(),
            Self::Int(v) => v.to_sql(),
            Self::Float(v) => v.to_sql(),
            Self::Guid(v) => v.to_sql(),
            // datetime2(7) on the wire: compared with the datetime2(3) columns at full precision.
            Self::Time(v) => v.to_sql(),
            Self::Binary(v) => v.to_sql(),
        }
    }
}

/// A pooled connection and its health.
pub(super) struct Connection {
    client: Client<Compat<TcpStream>>,
    health: Health,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("health", &self.health)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Runs one batch with bound parameters (`@P1`, `@P2`, ... in `sql`) and reads every result
    /// set to its end. Marks the connection broken on an error that leaves it unusable; if this
    /// future is dropped before it finishes, the connection stays marked in flight, and so is
    /// discarded too.
    pub(super) async fn batch(
        &mut self,
        sql: &str,
        params: &[Param],
    ) -> Result<Vec<Vec<Row>>, Error> {
        self.health.start();
        let refs: Vec<&dyn ToSql> = params.iter().map(|p| p as &dyn ToSql).collect();
        let result = async {
            let stream = self.client.query(sql, &refs).await?;
            stream.into_results().await
        }
        .await;
        self.health.finish(result.as_ref().err());
        result
    }

    /// Whether the pool will discard this connection (see [`Health::is_broken`]).
    pub(super) fn is_broken(&self) -> bool {
        self.health.is_broken()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: &'static str,
}

/// Connections each pool has opened (logged in and warmed), since the store was opened.
///
/// Why an operator watches it: by default both pools open every connection before central
/// serves (see `MsSqlOptions::min_idle`), so after start-up the count grows only when a
/// connection is replaced: one broken by an error or an abandoned request, one past its
/// lifetime (every 30 minutes), or one the pool grows by when `Min Pool Size` is below the
/// pool's size. Each such connection is opened and warmed while requests may be waiting for it
/// (seconds of a server core each on Babelfish), so a rate above the lifetime's says requests
/// are paying for cold connections.
#[derive(Debug, Clone, Default)]
pub struct ConnectionsOpened {
    opened: Family<PoolLabels, Counter>,
}

impl ConnectionsOpened {
    /// Adds the series to `registry`: `outbox_store_connections_opened_total{pool}`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "outbox_store_connections_opened",
            "MS SQL connections opened and warmed, by pool (requests: ingest, dispatch and \
             admin; lease: the dispatcher lease's own); after start-up, each one replaced a \
             broken or expired connection or grew the pool",
            self.opened.clone(),
        );
    }

    /// The counter of the pool named `pool`, created at 0 so the series shows before the first
    /// connection.
    fn of(&self, pool: &'static str) -> Counter {
        self.opened.get_or_create_owned(&PoolLabels { pool })
    }
}

/// Opens, validates and discards connections for bb8.
#[derive(Debug, Clone)]
pub(super) struct Manager {
    options: MsSqlOptions,
    /// The warm-up ([`super::warm`]) a new connection runs before the pool hands it out.
    /// `None` only for the migrations' connection: before them, the statements it runs may not
    /// exist yet.
    warm_up: Option<super::warm::Kind>,
    /// Counts each connection this manager opened (see [`ConnectionsOpened`]).
    opened: Counter,
}

impl Manager {
    /// Connections warmed with the statements of `kind` before they are handed out: every
    /// pool that serves requests, each counted in `opened` under the pool's name.
    pub(super) fn warming(
        options: MsSqlOptions,
        kind: super::warm::Kind,
        opened: &ConnectionsOpened,
        pool: &'static str,
    ) -> Self {
        Self {
            options,
            warm_up: Some(kind),
            opened: opened.of(pool),
        }
    }

    /// Connections handed out as they come from the login, counted nowhere: for the
    /// migrations.
    pub(super) fn cold(options: MsSqlOptions) -> Self {
        Self {
            options,
            warm_up: None,
            opened: Counter::default(),
        }
    }

    /// [`Self::connect_once`], then the warm-up if this manager warms. A warm-up that fails on
    /// a connection still fit for use (a server error, say) is logged and the connection handed
    /// out anyway: warming only saves time. One that broke the connection fails the connect.
    async fn connect_warm(&self) -> Result<Connection, Error> {
        let mut conn = self.connect_once().await?;
        let Some(kind) = self.warm_up else {
            return Ok(conn);
        };
        match super::warm::warm(&mut conn, kind).await {
            Ok(took) => {
                tracing::debug!(?took, server = %self.options.describe(), "MS SQL connection warmed");
                Ok(conn)
            }
            Err(e) if conn.is_broken() => Err(e),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    server = %self.options.describe(),
                    "warming a new MS SQL connection failed; using it cold"
                );
                Ok(conn)
            }
        }
    }

    /// One connect, following routing redirects.
    pub(super) async fn connect_once(&self) -> Result<Connection, Error> {
        let mut config = self.options.tiberius_config();
        let mut addr = (self.options.host.clone(), self.options.port);
        for _ in 0..=MAX_REDIRECTS {
            // The driver's handshake timeout covers TLS and login, not the TCP connect.
            let tcp = tokio::time::timeout(
                self.options.connect_timeout,
                TcpStream::connect((addr.0.as_str(), addr.1)),
            )
            .await
            .map_err(|_| Error::Io {
                kind: IoErrorKind::TimedOut,
                message: format!(
                    "TCP connect to {}:{} took longer than {:?}",
                    addr.0, addr.1, self.options.connect_timeout
                ),
            })??;
            // Small request/response exchanges: never wait to coalesce packets.
            tcp.set_nodelay(true)?;
            match Client::connect(config.clone(), tcp.compat_write()).await {
                Ok(client) => {
                    return Ok(Connection {
                        client,
                        health: Health::default(),
                    });
                }
                // Azure SQL's gateway (and availability-group read routing) sends the client
                // to the node that serves the database.
                Err(Error::Routing { host, port }) => {
                    tracing::debug!(%host, port, "MS SQL server redirected the connection");
                    config.host(&host);
                    config.port(port);
                    addr = (host, port);
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Protocol(
            format!("more than {MAX_REDIRECTS} routing redirects").into(),
        ))
    }
}

impl bb8::ManageConnection for Manager {
    type Connection = Connection;
    type Error = Error;

    /// Connects and warms the connection (see [`Manager::warming`]), retrying transient
    /// failures with exponential backoff and jitter; a refused login or a bad certificate fails
    /// at once.
    async fn connect(&self) -> Result<Connection, Error> {
        let mut pause = CONNECT_BACKOFF;
        let mut attempt = 1;
        loop {
            match self.connect_warm().await {
                Ok(conn) => {
                    self.opened.inc();
                    return Ok(conn);
                }
                Err(e) if attempt < CONNECT_ATTEMPTS && is_transient_connect(&e) => {
                    tracing::warn!(
                        error = %e,
                        attempt,
                        server = %self.options.describe(),
                        "MS SQL connect failed; retrying"
                    );
                    let jitter = pause.mul_f64(fastrand::f64() * 0.5);
                    tokio::time::sleep(pause + jitter).await;
                    pause *= 2;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Skipped for a connection vouched for by a clean finish a moment ago (see
    /// [`VOUCHED_FOR`]); otherwise a round trip that also catches a connection left inside a
    /// transaction (which a well-formed batch never does: each commits or is rolled back by
    /// XACT_ABORT).
    async fn is_valid(&self, conn: &mut Connection) -> Result<(), Error> {
        if conn.health.vouched_for(Instant::now()) {
            return Ok(());
        }
        let results = conn.batch(super::sql::CHECK_CONNECTION, &[]).await?;
        let open = results
            .first()
            .and_then(|rows| rows.first())
            .and_then(|row| row.try_get::<i32, _>(0).ok().flatten());
        match open {
            Some(0) => Ok(()),
            other => Err(Error::Protocol(
                format!("connection check: open transactions {other:?}").into(),
            )),
        }
    }

    fn has_broken(&self, conn: &mut Connection) -> bool {
        conn.health.is_broken()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: IoErrorKind) -> Error {
        Error::Io {
            kind,
            message: String::new(),
        }
    }

    #[test]
    fn each_pool_shows_its_count_from_the_start_and_the_migrations_count_nowhere() {
        let options = MsSqlOptions::parse(
            "server=tcp:db.example.test,1433;database=outbox;user id=u;password=p",
        )
        .unwrap();
        let opened = ConnectionsOpened::default();
        let requests = Manager::warming(
            options.clone(),
            super::super::warm::Kind::Everything,
            &opened,
            "requests",
        );
        let _lease = Manager::warming(
            options.clone(),
            super::super::warm::Kind::Lease,
            &opened,
            "lease",
        );
        Manager::cold(options).opened.inc();
        requests.opened.inc();
        let mut registry = Registry::default();
        opened.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let sample = |series: &str| {
            text.lines().find_map(|line| {
                line.strip_prefix(series)?
                    .strip_prefix(' ')?
                    .parse::<u64>()
                    .ok()
            })
        };
        assert_eq!(
            sample(r#"outbox_store_connections_opened_total{pool="requests"}"#),
            Some(1),
            "{text}"
        );
        assert_eq!(
            sample(r#"outbox_store_connections_opened_total{pool="lease"}"#),
            Some(0),
            "{text}"
        );
    }

    #[test]
    fn a_cleanly_finished_request_keeps_the_connection() {
        let mut health = Health::default();
        assert!(!health.is_broken());
        health.start();
        health.finish(None);
        assert!(!health.is_broken());
        // A server error such as a duplicate key or a permission error is an answer, not a
        // broken stream.
        health.start();
        health.finish(Some(&Error::Conversion("x".into())));
        assert!(!health.is_broken());
    }

    #[test]
    fn io_errors_and_timeouts_discard_the_connection() {
        for error in [
            io(IoErrorKind::ConnectionReset),
            io(IoErrorKind::UnexpectedEof),
            io(IoErrorKind::TimedOut),
            Error::Protocol("desynchronised".into()),
        ] {
            let mut health = Health::default();
            health.start();
            health.finish(Some(&error));
            assert!(health.is_broken(), "{error}");
            // ... for good: a later clean request does not rehabilitate it.
            health.start();
            health.finish(None);
            assert!(health.is_broken(), "{error}");
        }
    }

    #[test]
    fn only_a_recent_clean_finish_skips_the_check_out_test() {
        let start = Instant::now();
        let mut health = Health::default();
        assert!(!health.vouched_for(start), "never used: checked");
        health.start();
        health.finish_at(None, start);
        assert!(health.vouched_for(start + VOUCHED_FOR / 2));
        assert!(
            !health.vouched_for(start + VOUCHED_FOR),
            "idle too long: checked"
        );
        // A server error is an answer, but not a clean finish: the next check-out is tested
        // (did the failed batch leave a transaction open?).
        health.start();
        health.finish_at(Some(&Error::Conversion("x".into())), start);
        assert!(!health.is_broken());
        assert!(!health.vouched_for(start));
        // In flight (an abandoned request) or broken: never vouched for.
        health.start();
        assert!(!health.vouched_for(start + VOUCHED_FOR / 2));
        health.finish_at(Some(&io(IoErrorKind::ConnectionReset)), start);
        assert!(!health.vouched_for(start));
    }

    #[test]
    fn an_abandoned_request_discards_the_connection() {
        // What a dropped future leaves behind: started, never finished.
        let mut health = Health::default();
        health.start();
        assert!(health.is_broken());
    }

    #[tokio::test]
    async fn a_dropped_batch_future_leaves_the_connection_marked() {
        // Drive the same start/finish protocol as Connection::batch through a future that is
        // cancelled by a timeout, as a store call under tokio::time::timeout would be.
        let mut health = Health::default();
        let slow = async {
            health.start();
            std::future::pending::<()>().await;
            health.finish(None);
        };
        let outcome = tokio::time::timeout(Duration::from_millis(10), slow).await;
        assert!(outcome.is_err());
        assert!(health.is_broken());
    }
}
