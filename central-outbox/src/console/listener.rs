//! How the console is served: plain HTTP/1.1, or TLS with `[tls]`'s certificate when central has
//! one. Over TLS a client certificate is asked for (not required) when `[tls] client_ca` is set;
//! a verified one's Common Name travels with each request of its connection as a [`Peer`], for
//! the certificate login. Without TLS no request has a certificate.
//!
//! Every request carries its client's address (`ConnectInfo<SocketAddr>`), which the login
//! counts failures by. Both run on the HTTP connection loop the `/metrics` endpoint uses
//! (`metrics_endpoint::connections`), with [`CONSOLE_LIMITS`]: at most that many connections
//! open (one more is closed at once and counted in
//! `outbox_http_connections_refused_total{listener="console"}`), and a request header must
//! arrive within `HEADER_READ_TIMEOUT`, also on an idle keep-alive connection. A TLS handshake
//! that does not finish within `tls::HANDSHAKE_TIMEOUT` is dropped. So a client that connects and
//! says nothing, or says it slowly, holds a slot for seconds, and no client can hold more than
//! the cap. Both stop accepting at shutdown and let requests under way finish (the caller bounds
//! the wait).

use std::sync::Arc;

use axum::extract::ConnectInfo;
use axum::{Extension, Router};
use metrics_endpoint::connections;
use metrics_endpoint::{Limits, ListenerStats};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::tls::HANDSHAKE_TIMEOUT;

/// The console's connection bounds (see `metrics_endpoint::connections`). A browser opens up to
/// six connections to one host and keeps them open while its pages refresh (every 3 s); 256
/// serves some forty operators' browsers at full parallelism, far more than a plant's control
/// room has, while a client that opens connections and holds them pins at most 256 file
/// descriptors and tasks of central, of the 65536 its systemd unit allows.
// `pub` for the e2e listener tests, through `crate::testing`.
#[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
pub const CONSOLE_LIMITS: Limits = Limits {
    max_open: 256,
    header_read_timeout: metrics_endpoint::HEADER_READ_TIMEOUT,
};

/// What the connection says about the client, for every request on it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Peer {
    /// The Common Name of the verified client certificate, if one was presented.
    pub client_cn: Option<String>,
}

/// Serves `router` in plaintext within `limits` until `shutdown`.
pub(super) async fn serve_plain(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stats: ListenerStats,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    connections::serve(listener, limits, stats, shutdown, move |stream, remote| {
        let router = router.clone().layer(Extension(ConnectInfo(remote)));
        async move { Some((stream, router)) }
    })
    .await
}

/// Serves `router` over TLS within `limits` until `shutdown`. The handshake happens within the
/// connection's slot, so a client that connects and never finishes one holds a slot for at most
/// [`HANDSHAKE_TIMEOUT`].
pub(super) async fn serve_tls(
    listener: TcpListener,
    router: Router,
    config: Arc<rustls::ServerConfig>,
    limits: Limits,
    stats: ListenerStats,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(config);
    connections::serve(listener, limits, stats, shutdown, move |stream, remote| {
        let (acceptor, router) = (acceptor.clone(), router.clone());
        async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%remote, error = %e, "console: TLS handshake failed");
                    return None;
                }
                Err(_) => {
                    tracing::debug!(%remote, "console: TLS handshake timed out");
                    return None;
                }
            };
            let client_cn = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|cert| tls_files::common_name(cert));
            Some((
                tls,
                router
                    .layer(Extension(Peer { client_cn }))
                    .layer(Extension(ConnectInfo(remote))),
            ))
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::path::Path;

    use axum::routing::get;
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose,
    };
    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::tls::TlsConfig;

    /// A certificate for `cn` from `ca` (valid for "localhost"), as PEM files in `dir`.
    fn issue(
        dir: &Path,
        ca: &CertifiedIssuer<'static, KeyPair>,
        cn: &str,
        usage: ExtendedKeyUsagePurpose,
    ) -> (std::path::PathBuf, std::path::PathBuf) {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, ca).unwrap();
        let (cert_path, key_path) = (dir.join(format!("{cn}.pem")), dir.join(format!("{cn}.key")));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    /// A TLS connection to `addr`, presenting the certificate in `identity` if given.
    async fn connect_tls(
        addr: std::net::SocketAddr,
        ca_pem: &Path,
        identity: Option<&(std::path::PathBuf, std::path::PathBuf)>,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        let ca = std::fs::read(ca_pem).unwrap();
        for cert in tls_files::certificates("client_ca", ca_pem, &ca).unwrap() {
            roots.add(cert).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match identity {
            Some((cert, key)) => {
                let chain =
                    tls_files::certificates("cert", cert, &std::fs::read(cert).unwrap()).unwrap();
                let key = tls_files::private_key("key", key, &std::fs::read(key).unwrap()).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
            None => builder.with_no_client_auth(),
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
    }

    /// GET / over TLS to `addr`, presenting the certificate in `identity` if given; the body,
    /// or why there is none.
    async fn try_fetch(
        addr: std::net::SocketAddr,
        ca_pem: &Path,
        identity: Option<&(std::path::PathBuf, std::path::PathBuf)>,
    ) -> Result<String, String> {
        let mut tls = connect_tls(addr, ca_pem, identity)
            .await
            .map_err(|e| e.to_string())?;
        tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        // A server that closes without close_notify is still a full answer here.
        let _ = tls.read_to_end(&mut raw).await;
        let text = String::from_utf8(raw).map_err(|e| e.to_string())?;
        match text.split_once("\r\n\r\n") {
            Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_owned()),
            _ => Err(format!("not a 200 answer: {text:?}")),
        }
    }

    /// [`try_fetch`], which must succeed.
    async fn fetch(
        addr: std::net::SocketAddr,
        ca_pem: &Path,
        identity: Option<&(std::path::PathBuf, std::path::PathBuf)>,
    ) -> String {
        try_fetch(addr, ca_pem, identity).await.unwrap()
    }

    /// A CA, central's certificate (the console's TLS configuration, asking for client
    /// certificates from the CA) and an operator's client certificate, in `dir`. Returns the
    /// configuration, the CA's PEM file and the operator's certificate and key files.
    fn pki(
        dir: &Path,
    ) -> (
        Arc<rustls::ServerConfig>,
        std::path::PathBuf,
        (std::path::PathBuf, std::path::PathBuf),
    ) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let ca_pem = dir.join("ca.pem");
        std::fs::write(&ca_pem, ca.pem()).unwrap();
        let (cert, key) = issue(dir, &ca, "central", ExtendedKeyUsagePurpose::ServerAuth);
        let operator = issue(dir, &ca, "ops-console", ExtendedKeyUsagePurpose::ClientAuth);
        let settings = TlsConfig {
            cert: Some(cert),
            key: Some(key),
            client_ca: Some(ca_pem.clone()),
            allow_plaintext: false,
        }
        .load()
        .unwrap();
        let config = settings
            .console_config()
            .unwrap()
            .expect("TLS is configured");
        (config, ca_pem, operator)
    }

    /// Answers `/` with the Common Name of the client's certificate, or "nobody".
    fn peer_router() -> Router {
        Router::new().route(
            "/",
            get(|peer: Option<Extension<Peer>>| async move {
                peer.and_then(|Extension(peer)| peer.client_cn)
                    .unwrap_or_else(|| "nobody".into())
            }),
        )
    }

    /// Generous upper bound for anything a test waits for; a healthy run takes a fraction of it.
    const DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

    /// Bounds with a header read timeout short enough to wait for in a test.
    const QUICK_TIMEOUT: Limits = Limits {
        max_open: 4,
        header_read_timeout: std::time::Duration::from_millis(300),
    };

    /// Bounds with a small cap, and a header read timeout far beyond the test, so that held
    /// connections stay open.
    const SMALL_CAP: Limits = Limits {
        max_open: 3,
        header_read_timeout: std::time::Duration::from_secs(600),
    };

    const HALF_A_HEADER: &[u8] = b"GET / HTTP/1.1\r\nHost: localhost\r\n";

    /// What arrived on `stream` until the server closed it (a reset or a TLS stream cut without
    /// close_notify counts). Panics if the server keeps it open for [`DEADLINE`].
    async fn read_until_closed<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> Vec<u8> {
        metrics_endpoint::read_until_closed(stream, DEADLINE)
            .await
            .unwrap_or_else(|| panic!("the server kept the connection open for {DEADLINE:?}"))
    }

    /// Polls `served` until it is true, or panics after [`DEADLINE`].
    async fn until<F, Fut>(what: &str, mut served: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let started = tokio::time::Instant::now();
        while !served().await {
            assert!(
                started.elapsed() < DEADLINE,
                "timed out waiting for: {what}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn over_tls_a_client_certificate_is_optional_and_its_name_reaches_the_request() {
        let dir = tempfile::tempdir().unwrap();
        let (config, ca_pem, operator) = pki(dir.path());
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve_tls(
            listener,
            peer_router(),
            config,
            CONSOLE_LIMITS,
            ListenerStats::unregistered("console"),
            stop.clone(),
        ));

        assert_eq!(fetch(addr, &ca_pem, Some(&operator)).await, "ops-console");
        assert_eq!(fetch(addr, &ca_pem, None).await, "nobody");

        stop.cancel();
        server.await.unwrap().unwrap();
        // Without [tls] there is nothing to serve TLS with.
        assert!(
            TlsConfig::default()
                .load()
                .unwrap()
                .console_config()
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn plain_and_tls_close_a_connection_whose_request_header_does_not_arrive_in_time() {
        let stop = CancellationToken::new();
        let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let plain_addr = plain.local_addr().unwrap();
        let plain_server = tokio::spawn(serve_plain(
            plain,
            peer_router(),
            QUICK_TIMEOUT,
            ListenerStats::unregistered("console"),
            stop.clone(),
        ));
        let dir = tempfile::tempdir().unwrap();
        let (config, ca_pem, _) = pki(dir.path());
        let tls = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tls_addr = tls.local_addr().unwrap();
        let tls_server = tokio::spawn(serve_tls(
            tls,
            peer_router(),
            config,
            QUICK_TIMEOUT,
            ListenerStats::unregistered("console"),
            stop.clone(),
        ));

        let mut half = tokio::net::TcpStream::connect(plain_addr).await.unwrap();
        half.write_all(HALF_A_HEADER).await.unwrap();
        assert_eq!(read_until_closed(&mut half).await, b"", "closed unanswered");

        // Over TLS, after a finished handshake: the same bound.
        let mut half = connect_tls(tls_addr, &ca_pem, None).await.unwrap();
        half.write_all(HALF_A_HEADER).await.unwrap();
        half.flush().await.unwrap();
        assert_eq!(read_until_closed(&mut half).await, b"", "closed unanswered");

        // A client that sends its request in time is answered.
        let reply = metrics_endpoint::get(plain_addr, "/").await.unwrap();
        assert_eq!((reply.status, reply.body.as_str()), (200, "nobody"));
        assert_eq!(fetch(tls_addr, &ca_pem, None).await, "nobody");

        stop.cancel();
        plain_server.await.unwrap().unwrap();
        tls_server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn past_the_connection_cap_plain_and_tls_refuse_and_count_until_one_closes() {
        let stop = CancellationToken::new();
        let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let plain_addr = plain.local_addr().unwrap();
        let plain_stats = ListenerStats::unregistered("console");
        let plain_server = tokio::spawn(serve_plain(
            plain,
            peer_router(),
            SMALL_CAP,
            plain_stats.clone(),
            stop.clone(),
        ));
        let dir = tempfile::tempdir().unwrap();
        let (config, ca_pem, _) = pki(dir.path());
        let tls = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tls_addr = tls.local_addr().unwrap();
        let tls_stats = ListenerStats::unregistered("console");
        let tls_server = tokio::spawn(serve_tls(
            tls,
            peer_router(),
            config,
            SMALL_CAP,
            tls_stats.clone(),
            stop.clone(),
        ));

        // Plain: connections accepted in the order they were made, so the held ones have their
        // slots when the next one is accepted, and it is closed without an answer.
        let mut held = Vec::new();
        for _ in 0..SMALL_CAP.max_open {
            held.push(tokio::net::TcpStream::connect(plain_addr).await.unwrap());
        }
        let refused = metrics_endpoint::get(plain_addr, "/").await;
        assert!(refused.is_err(), "served past the cap: {refused:?}");
        assert!(plain_stats.refused() >= 1, "the refusal is counted");
        drop(held.remove(0));
        until("the plain console serves again", || async {
            metrics_endpoint::get(plain_addr, "/")
                .await
                .is_ok_and(|reply| reply.status == 200)
        })
        .await;

        // TLS: connections past the cap are closed before their handshake.
        let mut held_tls = Vec::new();
        for _ in 0..SMALL_CAP.max_open {
            held_tls.push(connect_tls(tls_addr, &ca_pem, None).await.unwrap());
        }
        let refused = try_fetch(tls_addr, &ca_pem, None).await;
        assert!(refused.is_err(), "served past the cap: {refused:?}");
        assert!(tls_stats.refused() >= 1, "the refusal is counted");
        drop(held_tls.remove(0));
        until("the TLS console serves again", || async {
            try_fetch(tls_addr, &ca_pem, None).await.is_ok()
        })
        .await;

        drop((held, held_tls));
        stop.cancel();
        plain_server.await.unwrap().unwrap();
        tls_server.await.unwrap().unwrap();
    }
}
