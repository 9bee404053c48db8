//! How the console is served: plain HTTP/1.1, or TLS with `[tls]`'s certificate when central has
//! one. Over TLS a client certificate is asked for (not required) when `[tls] client_ca` is set;
//! a verified one's Common Name travels with each request of its connection as a [`Peer`], for
//! the certificate login. Without TLS no request has a certificate.
//!
//! Every request carries its client's address (`ConnectInfo<SocketAddr>`), which the login
//! counts failures by. Both stop accepting at shutdown and let requests under way finish (the
//! caller bounds the wait); a TLS handshake that does not finish within `tls::HANDSHAKE_TIMEOUT` is dropped, so
//! a client that connects and says nothing holds nothing for long.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ConnectInfo;
use axum::{Extension, Router};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::tls::HANDSHAKE_TIMEOUT;

/// What the connection says about the client, for every request on it.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    /// The Common Name of the verified client certificate, if one was presented.
    pub client_cn: Option<String>,
}

/// Serves `router` in plaintext until `shutdown`.
pub async fn serve_plain(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown.cancelled_owned())
    .await
}

/// Serves `router` over TLS until `shutdown`.
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    config: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(config);
    let mut connections = JoinSet::new();
    loop {
        // Finished connections are reaped as we go, so the set holds only live ones.
        while connections.try_join_next().is_some() {}
        let (stream, remote) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // E.g. out of file descriptors: a pause, not the end of the console.
                    tracing::warn!(error = %e, "console: cannot accept a connection");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let router = router.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%remote, error = %e, "console: TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%remote, "console: TLS handshake timed out");
                    return;
                }
            };
            let client_cn = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|cert| tls_files::common_name(cert));
            let service = TowerToHyperService::new(
                router
                    .layer(Extension(Peer { client_cn }))
                    .layer(Extension(ConnectInfo(remote))),
            );
            let builder = auto::Builder::new(TokioExecutor::new()).http1_only();
            let connection = builder.serve_connection(TokioIo::new(tls), service);
            tokio::pin!(connection);
            let served = tokio::select! {
                served = connection.as_mut() => served,
                () = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = served {
                tracing::debug!(%remote, error = %e, "console: connection ended with an error");
            }
        });
    }
    while connections.join_next().await.is_some() {}
    Ok(())
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

    /// GET / over TLS to `addr`, presenting the certificate in `identity` if given; the body.
    async fn fetch(
        addr: std::net::SocketAddr,
        ca_pem: &Path,
        identity: Option<&(std::path::PathBuf, std::path::PathBuf)>,
    ) -> String {
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
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut tls = connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut raw = Vec::new();
        // A server that closes without close_notify is still a full answer here.
        let _ = tls.read_to_end(&mut raw).await;
        let text = String::from_utf8(raw).unwrap();
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        text.split_once("\r\n\r\n").unwrap().1.to_owned()
    }

    #[tokio::test]
    async fn over_tls_a_client_certificate_is_optional_and_its_name_reaches_the_request() {
        let dir = tempfile::tempdir().unwrap();
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
        let ca_pem = dir.path().join("ca.pem");
        std::fs::write(&ca_pem, ca.pem()).unwrap();
        let (cert, key) = issue(
            dir.path(),
            &ca,
            "central",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let operator = issue(
            dir.path(),
            &ca,
            "ops-console",
            ExtendedKeyUsagePurpose::ClientAuth,
        );
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
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);

        let router = Router::new().route(
            "/",
            get(|Extension(peer): Extension<Peer>| async move {
                peer.client_cn.unwrap_or_else(|| "nobody".into())
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve_tls(listener, router, config, stop.clone()));

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
}
