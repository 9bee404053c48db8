//! The `/metrics` HTTP endpoint both services serve, kept here once so central and the
//! site-forwarder answer scrapes the same way.
//!
//! `GET /metrics` answers with whatever `render` produces at that moment, as OpenMetrics text;
//! any other path is 404. Rendering is async so a scrape can read fresh figures (the buffer, the
//! store) instead of values cached by a timer, which could drift from what the gRPC API reports.
//! Nothing here panics on input: a malformed request gets an HTTP error from hyper, a failed
//! accept is retried after a pause. Connections are bounded as [`connections`] says (at most
//! [`METRICS_LIMITS`]`.max_open` open, a header within [`HEADER_READ_TIMEOUT`]), so a client that
//! holds connections open cannot take the service's file descriptors. The server stops with the
//! shutdown token; scrapes still open then get [`SHUTDOWN_GRACE`] to finish.
//!
//! [`connections`] is also the loop central's web console runs on: one set of HTTP bounds for
//! every HTTP port either service opens.
//!
//! [`get`] (a tiny hand-written HTTP/1.1 client) and [`sample`] are for tests and smoke checks,
//! so nothing needs an HTTP client crate or a metrics parser.

pub mod connections;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::http::header;
use axum::routing::get as route_get;
use futures_util::future::BoxFuture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub use connections::{HEADER_READ_TIMEOUT, Limits, ListenerMetrics, ListenerStats};

/// The content type of the OpenMetrics text format that `prometheus-client` encodes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long scrapes still open at shutdown may take. A render is a few cheap queries; a scrape
/// still running after this is stuck, and must not hold up the service's exit.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The bounds of every `/metrics` listener. A Prometheus server holds one connection per
/// scrape (two for an HA pair) and each scrape is over in milliseconds; 64 leaves room for
/// several of them, a federation, and people running curl, while a client that opens connections
/// and holds them pins at most 64 file descriptors and tasks of the service.
pub const METRICS_LIMITS: Limits = Limits {
    max_open: 64,
    header_read_timeout: HEADER_READ_TIMEOUT,
};

/// Serves `GET /metrics` on `listener` within `limits` (normally [`METRICS_LIMITS`]), counting
/// into `stats`, until `shutdown` is cancelled (then waits at most [`SHUTDOWN_GRACE`] for open
/// scrapes). Each scrape awaits a fresh `render()`.
pub async fn serve<R>(
    listener: TcpListener,
    render: R,
    limits: Limits,
    stats: ListenerStats,
    shutdown: CancellationToken,
) -> io::Result<()>
where
    R: Fn() -> BoxFuture<'static, String> + Clone + Send + Sync + 'static,
{
    let scrape = move || {
        let page = render();
        async move { ([(header::CONTENT_TYPE, CONTENT_TYPE)], page.await) }
    };
    let app = Router::new().route("/metrics", route_get(scrape));
    let server = connections::serve(
        listener,
        limits,
        stats,
        shutdown.clone(),
        move |stream, _| {
            let app = app.clone();
            async move { Some((stream, app)) }
        },
    );
    let grace = async {
        shutdown.cancelled().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        served = server => served,
        () = grace => Ok(()),
    }
}

/// Reads from `stream` until the peer closes it (end of stream, or an error such as a reset or
/// a TLS stream cut without close_notify), for at most `within`. Returns what arrived, or
/// `None` if the stream was still open then. For tests of how a server ends connections.
pub async fn read_until_closed<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    within: Duration,
) -> Option<Vec<u8>> {
    let mut arrived = Vec::new();
    let closed = tokio::time::timeout(within, async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => arrived.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    closed.is_ok().then_some(arrived)
}

/// An HTTP answer as [`get`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: String,
}

/// Longest a [`get`] may take in all.
const GET_TIMEOUT: Duration = Duration::from_secs(10);

/// `GET path` on `addr` with `Connection: close`, read to the end. Enough for this endpoint,
/// which always answers with a Content-Length body; not a general HTTP client.
pub async fn get(addr: SocketAddr, path: &str) -> io::Result<Reply> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, io::Error>(raw)
    };
    let raw = tokio::time::timeout(GET_TIMEOUT, exchange)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no full answer in time"))??;
    let text = String::from_utf8(raw).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let malformed = || io::Error::new(io::ErrorKind::InvalidData, "malformed HTTP answer");
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(malformed)?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(malformed)?;
    let content_type = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        .map(|(_, value)| value.trim().to_owned());
    Ok(Reply {
        status,
        content_type,
        body: body.to_owned(),
    })
}

/// The value of the sample `series` (name and labels exactly as rendered, e.g.
/// `outbox_ingest_total{outcome="accepted"}`) in OpenMetrics text, if present and a number.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.split(' ').next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use futures_util::FutureExt;

    use super::*;

    /// Generous upper bound for anything a test waits for; a healthy run takes a fraction of it.
    const DEADLINE: Duration = Duration::from_secs(30);

    /// A page that renders instantly.
    fn static_page() -> BoxFuture<'static, String> {
        async { "up 1\n# EOF\n".to_owned() }.boxed()
    }

    /// Serves [`static_page`] within `limits` on a port-0 listener.
    async fn start(
        limits: Limits,
    ) -> (
        SocketAddr,
        ListenerStats,
        CancellationToken,
        tokio::task::JoinHandle<io::Result<()>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = ListenerStats::unregistered("metrics");
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            static_page,
            limits,
            stats.clone(),
            shutdown.clone(),
        ));
        (addr, stats, shutdown, server)
    }

    /// What arrived on `stream` until the server closed it. Panics if the server keeps it
    /// open for [`DEADLINE`].
    async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
        super::read_until_closed(stream, DEADLINE)
            .await
            .unwrap_or_else(|| panic!("the server kept the connection open for {DEADLINE:?}"))
    }
    #[tokio::test]
    async fn renders_on_every_scrape_404s_elsewhere_and_stops_on_shutdown() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let scrapes = Arc::new(AtomicU64::new(0));
        let render = {
            let scrapes = Arc::clone(&scrapes);
            move || {
                let n = scrapes.fetch_add(1, Ordering::SeqCst) + 1;
                async move { format!("scrape {n}\n# EOF\n") }.boxed()
            }
        };
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            render,
            METRICS_LIMITS,
            ListenerStats::unregistered("metrics"),
            shutdown.clone(),
        ));

        for n in 1..=2 {
            let reply = get(addr, "/metrics").await.unwrap();
            assert_eq!(reply.status, 200);
            assert_eq!(reply.content_type.as_deref(), Some(CONTENT_TYPE));
            assert_eq!(reply.body, format!("scrape {n}\n# EOF\n"));
            assert_eq!(sample(&reply.body, "scrape"), Some(f64::from(n)));
        }
        let reply = get(addr, "/").await.unwrap();
        assert_eq!(reply.status, 404);
        assert_eq!(scrapes.load(Ordering::SeqCst), 2, "only /metrics renders");

        shutdown.cancel();
        let stopped = tokio::time::timeout(Duration::from_secs(10), server).await;
        assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");
        assert!(
            get(addr, "/metrics").await.is_err(),
            "nothing listens after shutdown"
        );
    }

    #[tokio::test]
    async fn a_request_header_that_does_not_arrive_in_time_ends_the_connection() {
        let limits = Limits {
            max_open: 4,
            header_read_timeout: Duration::from_millis(300),
        };
        let (addr, _stats, shutdown, server) = start(limits).await;

        // Half a request header, and nothing more: the connection is closed, unanswered.
        let mut half = TcpStream::connect(addr).await.unwrap();
        half.write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\n")
            .await
            .unwrap();
        assert_eq!(read_until_closed(&mut half).await, b"");

        // A keep-alive connection left idle after its answer is closed too.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\n\r\n")
            .await
            .unwrap();
        let answer = String::from_utf8(read_until_closed(&mut idle).await).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("up 1\n# EOF\n"), "{answer}");

        // A client that sends in time is answered as before.
        assert_eq!(get(addr, "/metrics").await.unwrap().status, 200);
        shutdown.cancel();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn past_the_connection_cap_a_connection_is_refused_and_counted_until_one_closes() {
        // A header timeout far beyond the test, so the held connections stay open.
        let limits = Limits {
            max_open: 3,
            header_read_timeout: Duration::from_secs(600),
        };
        let (addr, stats, shutdown, server) = start(limits).await;

        let mut held = Vec::new();
        for _ in 0..limits.max_open {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        // Connections are accepted in the order they were made, so the held ones have their
        // slots by the time the next one is accepted: it is closed without an answer.
        let refused = get(addr, "/metrics").await;
        assert!(refused.is_err(), "served past the cap: {refused:?}");
        assert!(stats.refused() >= 1, "the refusal is counted");
        assert_eq!(stats.open(), i64::try_from(limits.max_open).unwrap());
        // The held ones are still served.
        held[0]
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = String::from_utf8(read_until_closed(&mut held[0]).await).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

        // That one is closed now; once the server has noticed, a new client is served again.
        drop(held.remove(0));
        let started = tokio::time::Instant::now();
        while get(addr, "/metrics").await.map(|reply| reply.status).ok() != Some(200) {
            assert!(started.elapsed() < DEADLINE, "never served again");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(held);
        shutdown.cancel();
        server.await.unwrap().unwrap();
    }
}
