//! A TCP link between two services that a test can cut and heal, to stage a network partition
//! between real processes: everything sent to [`Link::addr`] is relayed to the upstream address
//! while the link is up. [`Link::cut`] drops every open connection and refuses new ones (they
//! are accepted and closed at once, as a broken path looks to gRPC); [`Link::heal`] relays again.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub struct Link {
    addr: SocketAddr,
    /// Cancelled on cut: every relay of the current generation ends. Replaced on heal.
    up: Arc<Mutex<Option<CancellationToken>>>,
}

impl Link {
    /// Relays from a new loopback port to `upstream`, up from the start.
    pub async fn start(upstream: SocketAddr) -> io::Result<Link> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let link = Link {
            addr: listener.local_addr()?,
            up: Arc::new(Mutex::new(Some(CancellationToken::new()))),
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

    pub fn heal(&self) {
        self.state().get_or_insert_with(CancellationToken::new);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Option<CancellationToken>> {
        self.up.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs as long as the test's runtime does.
    async fn accept(self, listener: TcpListener, upstream: SocketAddr) {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                continue;
            };
            let Some(up) = self.state().clone() else {
                drop(client);
                continue;
            };
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(upstream).await else {
                    return;
                };
                tokio::select! {
                    () = up.cancelled() => {}
                    _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                }
            });
        }
    }
}
