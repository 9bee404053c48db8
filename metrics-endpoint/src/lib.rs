//! The `/metrics` HTTP endpoint both services serve, kept here once so central and the
//! site-forwarder answer scrapes the same way.
//!
//! `GET /metrics` answers with whatever `render` produces at that moment, as OpenMetrics text;
//! any other path is 404. Rendering is async so a scrape can read fresh figures (the buffer, the
//! store) instead of values cached by a timer, which could drift from what the gRPC API reports.
//! Nothing here panics on input: a malformed request gets an HTTP error from hyper, a failed
//! accept is retried by axum. The server stops with the shutdown token; scrapes still open then
//! get [`SHUTDOWN_GRACE`] to finish.
//!
//! [`get`] (a tiny hand-written HTTP/1.1 client) and [`sample`] are for tests and smoke checks,
//! so nothing needs an HTTP client crate or a metrics parser.

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

/// The content type of the OpenMetrics text format that `prometheus-client` encodes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long scrapes still open at shutdown may take. A render is a few cheap queries; a scrape
/// still running after this is stuck, and must not hold up the service's exit.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Serves `GET /metrics` on `listener` until `shutdown` is cancelled (then waits at most
/// [`SHUTDOWN_GRACE`] for open scrapes). Each scrape awaits a fresh `render()`.
pub async fn serve<R>(
    listener: TcpListener,
    render: R,
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
    let server =
        axum::serve(listener, app).with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let grace = async {
        shutdown.cancelled().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        served = server => served,
        () = grace => Ok(()),
    }
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
        let server = tokio::spawn(serve(listener, render, shutdown.clone()));

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
}
