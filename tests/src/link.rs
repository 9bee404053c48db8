//! A TCP link between two services that a test can break and heal, to stage network faults
//! between real processes: everything sent to [`Link::addr`] is relayed to the upstream address
//! while the link is up.
//!
//! - [`Link::cut`] drops every open connection and refuses new ones (they are accepted and
//!   closed at once, as a broken path looks to gRPC).
//! - [`Link::black_hole`] keeps every connection open and passes no byte either way (a proxy or
//!   firewall that stops forwarding without closing anything): nothing is read from either
//!   side, so writers see their data accepted until their socket buffers fill, and never an
//!   answer. New connections are accepted and held the same way.
//! - [`Link::heal`] relays again; connections held by a black hole carry on with whatever was
//!   queued in them (their peers may have given up on them meanwhile).

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Bytes relayed per read; what one direction holds back when a black hole starts mid-read.
const CHUNK: usize = 16 * 1024;

#[derive(Debug, Clone)]
pub struct Link {
    addr: SocketAddr,
    /// Cancelled on cut: every relay of the current generation ends. Replaced on heal.
    up: Arc<Mutex<Option<CancellationToken>>>,
    /// Whether bytes pass: false while a black hole holds the link.
    passing: watch::Sender<bool>,
}

impl Link {
    /// Relays from a new loopback port to `upstream`, up from the start.
    pub async fn start(upstream: SocketAddr) -> io::Result<Link> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let link = Link {
            addr: listener.local_addr()?,
            up: Arc::new(Mutex::new(Some(CancellationToken::new()))),
            passing: watch::Sender::new(true),
        };
        let relay = link.clone();
        tokio::spawn(async move { relay.accept(listener, upstream).await });
        Ok(link)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Breaks the link: open connections are dropped, new ones closed on arrival.
    pub fn cut(&self) {
        if let Some(up) = self.state().take() {
            up.cancel();
        }
    }

    /// Silences the link: connections stay open and no byte passes either way.
    pub fn black_hole(&self) {
        self.passing.send_replace(false);
    }

    /// Ends a cut or a black hole: bytes pass again.
    pub fn heal(&self) {
        self.state().get_or_insert_with(CancellationToken::new);
        self.passing.send_replace(true);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Option<CancellationToken>> {
        self.up.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs as long as the test's runtime does.
    async fn accept(self, listener: TcpListener, upstream: SocketAddr) {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                continue;
            };
            let Some(up) = self.state().clone() else {
                drop(client);
                continue;
            };
            let passing = self.passing.subscribe();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::select! {
                    () = up.cancelled() => {}
                    _ = async {
                        tokio::join!(
                            relay(client_read, server_write, passing.clone()),
                            relay(server_read, client_write, passing),
                        )
                    } => {}
                }
            });
        }
    }
}

/// Copies `from` to `to` while bytes pass, until `from` ends (then `to` is shut for writing,
/// like `copy_bidirectional` does) or either side fails.
async fn relay(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut passing: watch::Receiver<bool>,
) {
    let mut buf = vec![0; CHUNK];
    loop {
        // Nothing is read while the link is silent, so nothing reaches this side's peer either.
        if passing.wait_for(|p| *p).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        // Bytes read just as a black hole began are held until it ends.
        if passing.wait_for(|p| *p).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
