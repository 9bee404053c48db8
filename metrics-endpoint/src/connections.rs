//! How both services accept HTTP/1.1 connections: the `/metrics` endpoint ([`crate::serve`]) and
//! central's web console, plain or over TLS. One loop, so the bounds below hold for every HTTP
//! port either service opens.
//!
//! Invariants:
//! - At most [`Limits::max_open`] connections are open at once. One more is closed as soon as it
//!   is accepted, before anything is read from it, and counted in
//!   `outbox_http_connections_refused_total{listener}`: a client that opens connections and sends
//!   nothing costs the service a bounded number of file descriptors and tasks, never all of them.
//!   Closing at once rather than leaving the connection in the kernel's backlog is what makes each
//!   refusal countable (the kernel drops a full backlog's SYNs without telling anyone), and the
//!   client hears at once that it was refused instead of waiting for its own timeout.
//! - A request header must arrive whole within [`Limits::header_read_timeout`] of the moment the
//!   server starts waiting for it: on a new connection, and on a keep-alive connection after each
//!   answer (hyper starts its header timer again whenever the connection goes idle). So the same
//!   bound cuts off a client that sends half a header and one that keeps an idle connection open:
//!   neither holds a slot for longer. hyper applies the timeout only with a timer set, which is
//!   why every connection gets a [`TokioTimer`].
//! - At shutdown the loop stops accepting, answers the requests under way and closes idle
//!   connections; the caller bounds how long that may take.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long a request header may take to arrive, on a new connection or an idle keep-alive one.
/// Browsers and Prometheus send a header (a few hundred bytes, a few KiB with cookies) in one
/// go, so on any working link it arrives within a round trip or two. Ten seconds also rides out
/// three lost segments in a row (TCP's retransmission timeout starts at 1 s and doubles: 1 + 2 +
/// 4 s) on a congested WAN link, while a client that holds a connection with half a header, or
/// none, gives its slot back within ten seconds. Idle keep-alive connections close after the
/// same time: the console's pages refresh every 3 s and keep theirs; a Prometheus scraping every
/// 15 s or more opens a fresh connection per scrape, which on a LAN costs a millisecond.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause after a failed accept (out of file descriptors, typically) before the next one: the
/// error does not clear by itself at once, and retrying in a tight loop would only burn a core.
const ACCEPT_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Refusals are counted one by one; a WARN line says so at most once per this interval, with
/// how many there were since the last line, so a flood of connections does not flood the log.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// The bounds of one HTTP listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once (a TLS handshake under way counts); one more is refused.
    pub max_open: usize,
    /// See [`HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: &'static str,
}

/// The connection figures of a service's HTTP listeners, labelled by listener, registered once in
/// the service's registry: `outbox_http_connections_refused_total` and
/// `outbox_http_connections_open`.
#[derive(Debug, Clone, Default)]
pub struct ListenerMetrics {
    refused: Family<ListenerLabels, Counter>,
    open: Family<ListenerLabels, Gauge>,
}

impl ListenerMetrics {
    /// Registers the figures in `registry`, with a series at 0 for each of `listeners` from the
    /// start (so `increase()` sees the first refusal).
    pub fn register(registry: &mut Registry, listeners: &[&'static str]) -> Self {
        let metrics = Self::default();
        registry.register(
            "outbox_http_connections_refused",
            "Connections to an HTTP listener (/metrics, the console) closed unserved at once \
             because the listener had its maximum of connections open",
            metrics.refused.clone(),
        );
        registry.register(
            "outbox_http_connections_open",
            "Connections open on an HTTP listener (/metrics, the console)",
            metrics.open.clone(),
        );
        for &listener in listeners {
            metrics.listener(listener);
        }
        metrics
    }

    /// The figures of the listener called `name` (e.g. "metrics", "console").
    pub fn listener(&self, name: &'static str) -> ListenerStats {
        let labels = ListenerLabels { listener: name };
        ListenerStats {
            name,
            refused: self.refused.get_or_create_owned(&labels),
            open: self.open.get_or_create_owned(&labels),
        }
    }
}

/// One listener's figures; clones count into the same series.
#[derive(Debug, Clone)]
pub struct ListenerStats {
    name: &'static str,
    refused: Counter,
    open: Gauge,
}

impl ListenerStats {
    /// Figures registered nowhere, for a listener whose counts nobody reads but a test.
    pub fn unregistered(name: &'static str) -> Self {
        ListenerMetrics::default().listener(name)
    }

    /// Connections refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.get()
    }

    /// Connections open now.
    pub fn open(&self) -> i64 {
        self.open.get()
    }
}

/// A connection's slot: the gauge counts it until the connection's task ends.
struct OpenConnection {
    open: Gauge,
    _slot: OwnedSemaphorePermit,
}

impl OpenConnection {
    fn new(stats: &ListenerStats, slot: OwnedSemaphorePermit) -> Self {
        stats.open.inc();
        Self {
            open: stats.open.clone(),
            _slot: slot,
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.open.dec();
    }
}

/// Rate-limits the WARN lines about refusals (see [`REFUSAL_LOG_INTERVAL`]).
#[derive(Default)]
struct RefusalLog {
    last_line: Option<Instant>,
    unlogged: u64,
}

impl RefusalLog {
    fn refused(&mut self, stats: &ListenerStats, limits: Limits, remote: SocketAddr) {
        self.unlogged += 1;
        if self
            .last_line
            .is_none_or(|at| at.elapsed() >= REFUSAL_LOG_INTERVAL)
        {
            tracing::warn!(
                listener = stats.name,
                max_open = limits.max_open,
                refused = self.unlogged,
                last_client = %remote,
                "HTTP listener has its maximum of connections open: further connections are \
                 closed unserved (counted in outbox_http_connections_refused_total)"
            );
            self.last_line = Some(Instant::now());
            self.unlogged = 0;
        }
    }
}

/// Serves HTTP/1.1 on `listener` within `limits` until `shutdown`. Each accepted connection is
/// handed to `prepare` (a TLS handshake, say), which gives back the stream to speak HTTP on and
/// the router to answer with, or `None` to drop the connection; the time `prepare` takes counts
/// against the connection's slot, so `prepare` must bound it.
pub async fn serve<P, Fut, Io>(
    listener: TcpListener,
    limits: Limits,
    stats: ListenerStats,
    shutdown: CancellationToken,
    prepare: P,
) -> io::Result<()>
where
    P: Fn(TcpStream, SocketAddr) -> Fut,
    Fut: Future<Output = Option<(Io, Router)>> + Send + 'static,
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_open));
    let mut refusals = RefusalLog::default();
    let mut connections = JoinSet::new();
    loop {
        // Finished connections are reaped as we go, so the set holds only live ones.
        while connections.try_join_next().is_some() {}
        let (stream, remote) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(listener = stats.name, error = %e, "cannot accept a connection");
                    tokio::time::sleep(ACCEPT_RETRY_PAUSE).await;
                    continue;
                }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            stats.refused.inc();
            refusals.refused(&stats, limits, remote);
            // Dropped unread: the client sees the connection closed (or reset) at once.
            drop(stream);
            continue;
        };
        // Nagle's algorithm would hold the end of an answer back until the client's delayed ACK
        // of the previous segment, up to 40 ms on Linux.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(listener = stats.name, %remote, error = %e, "cannot set TCP_NODELAY");
        }
        let open = OpenConnection::new(&stats, slot);
        let prepared = prepare(stream, remote);
        let (name, shutdown) = (stats.name, shutdown.clone());
        connections.spawn(async move {
            let _open = open;
            let Some((io, router)) = prepared.await else {
                return;
            };
            serve_connection(io, router, limits, &shutdown, name, remote).await;
        });
    }
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Answers requests on one connection until the client closes it, a bound closes it, or
/// shutdown (which lets a request under way finish).
async fn serve_connection<Io>(
    io: Io,
    router: Router,
    limits: Limits,
    shutdown: &CancellationToken,
    listener: &'static str,
    remote: SocketAddr,
) where
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let connection = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(router));
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = served {
        // A header not received in time ends here too: the client's doing, not the service's.
        tracing::debug!(listener, %remote, error = %e, "connection ended with an error");
    }
}
