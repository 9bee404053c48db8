//! TLS on central's gRPC port, and who a verified client is.
//!
//! `[tls]` names PEM files: `cert` and `key` make central serve TLS only (rustls on ring, the
//! process's one crypto provider); `client_ca` adds mutual TLS, where every client must present
//! a certificate signed by that CA and is refused at the handshake otherwise. The files are read
//! and checked once, at start-up ([`TlsConfig::load`]), so a missing file, a file without PEM or
//! a key that does not belong to its certificate stops start-up with a message naming the key
//! and the path.
//!
//! A verified client is known by its certificate's Subject Common Name
//! ([`client_common_name`]): ingest treats it as the site id, the admin API maps it to a role.
//!
//! Invariant: a non-loopback address is served in plaintext only when `allow_plaintext` says so
//! ([`TlsSettings::plaintext_exposure`]), and central then warns at every start.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tls_files::{KeyError, certificates, private_key};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

/// Longest a new connection may take over its TLS handshake. tonic runs handshakes concurrently
/// but, by default, without a limit, so a client that connects and never speaks would hold a
/// task and a socket for good; 10 s is ample for a handshake over a slow plant WAN.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The `[tls]` section as written. Paths are relative to the working directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain central presents (its own certificate first). With `key`, the
    /// gRPC port serves TLS only.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert` (PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
    /// PEM CA certificate(s). When set, every client must present a certificate signed by one
    /// of them (mutual TLS); its Common Name is the client's identity.
    pub client_ca: Option<PathBuf>,
    /// Serve plaintext on a non-loopback `listen_addr` anyway (with a warning at every start).
    /// Without it such a bind refuses to start.
    pub allow_plaintext: bool,
}

/// Why `[tls]` cannot be used. Every message starts with the key it is about.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A `tls.*` key (its message starts with it).
    #[error(transparent)]
    Config(#[from] KeyError),
    #[error(
        "listen_addr: {addr} is not a loopback address and tls is not configured; set tls.cert \
         and tls.key to serve TLS, or tls.allow_plaintext = true to serve plaintext anyway"
    )]
    PlaintextExposed { addr: SocketAddr },
}

pub type Result<T, E = TlsError> = std::result::Result<T, E>;

/// `[tls]` checked, with its files read: what [`crate::run`] serves with.
#[derive(Clone, Default)]
pub struct TlsSettings {
    server: Option<ServerPems>,
    allow_plaintext: bool,
}

/// The PEM text of central's identity and of the client CA, as tonic takes it.
#[derive(Clone)]
struct ServerPems {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

/// Never prints key material: only what is configured.
impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("serves_tls", &self.serves_tls())
            .field(
                "requires_client_certificates",
                &self.requires_client_certificates(),
            )
            .field("allow_plaintext", &self.allow_plaintext)
            .finish()
    }
}

impl TlsConfig {
    /// Reads and checks the files: the certificates parse, the key parses and belongs to the
    /// first certificate, the client CA holds at least one certificate.
    pub fn load(&self) -> Result<TlsSettings> {
        let server = match (&self.cert, &self.key) {
            (None, None) => {
                if self.client_ca.is_some() {
                    return Err(KeyError::new(
                        "client_ca",
                        "client certificates are asked for only over TLS: set tls.cert and \
                         tls.key too",
                    )
                    .into());
                }
                None
            }
            (Some(_), None) => return Err(KeyError::new("key", "set it with tls.cert").into()),
            (None, Some(_)) => return Err(KeyError::new("cert", "set it with tls.key").into()),
            (Some(cert_path), Some(key_path)) => {
                let tls_files::IdentityPems { cert, key } =
                    tls_files::identity(cert_path, key_path)?;
                let client_ca = match &self.client_ca {
                    Some(path) => {
                        let pem = tls_files::read("client_ca", path)?;
                        certificates("client_ca", path, &pem)?;
                        Some(pem)
                    }
                    None => None,
                };
                Some(ServerPems {
                    cert,
                    key,
                    client_ca,
                })
            }
        };
        Ok(TlsSettings {
            server,
            allow_plaintext: self.allow_plaintext,
        })
    }
}

impl TlsSettings {
    /// Whether the gRPC port serves TLS.
    pub fn serves_tls(&self) -> bool {
        self.server.is_some()
    }

    /// Whether `allow_plaintext` permits plaintext on a non-loopback address.
    pub fn allows_plaintext(&self) -> bool {
        self.allow_plaintext
    }

    /// Whether every client must present a certificate from `client_ca` (mutual TLS).
    pub fn requires_client_certificates(&self) -> bool {
        self.server.as_ref().is_some_and(|s| s.client_ca.is_some())
    }

    /// Whether serving on `addr` is plaintext off this machine: `Ok(true)` when
    /// `allow_plaintext` permits it (the caller warns), `Ok(false)` when the port serves TLS or
    /// is loopback, an error naming `listen_addr` and `tls` otherwise.
    pub fn plaintext_exposure(&self, addr: SocketAddr) -> Result<bool> {
        if self.serves_tls() || addr.ip().is_loopback() {
            Ok(false)
        } else if self.allow_plaintext {
            Ok(true)
        } else {
            Err(TlsError::PlaintextExposed { addr })
        }
    }

    /// A gRPC server builder serving TLS as configured (plain `Server::builder()` without
    /// `[tls]`).
    pub fn server_builder(&self) -> Result<Server> {
        let Some(pems) = &self.server else {
            return Ok(Server::builder());
        };
        let mut config = ServerTlsConfig::new()
            .identity(Identity::from_pem(&pems.cert, &pems.key))
            .timeout(HANDSHAKE_TIMEOUT);
        if let Some(ca) = &pems.client_ca {
            // Required, not optional: a client without a certificate from this CA is refused
            // at the handshake, before any request is read.
            config = config
                .client_ca_root(Certificate::from_pem(ca))
                .client_auth_optional(false);
        }
        Server::builder()
            .tls_config(config)
            .map_err(|e| KeyError::new("cert", format!("cannot serve TLS with it: {e}")).into())
    }
}

impl TlsSettings {
    /// The web console's TLS configuration (`None` without `[tls]`): central's certificate,
    /// HTTP/1.1, and with `client_ca` a client certificate asked for but not required, so an
    /// operator without one still reaches the token login while one with a mapped certificate
    /// can log in by it.
    pub fn console_config(&self) -> Result<Option<std::sync::Arc<rustls::ServerConfig>>> {
        use std::sync::Arc;
        let Some(pems) = &self.server else {
            return Ok(None);
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certificates("cert", Path::new("tls.cert"), &pems.cert)?;
        let key = private_key("key", Path::new("tls.key"), &pems.key)?;
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| KeyError::new("cert", format!("cannot serve the console: {e}")))?;
        let builder = match &pems.client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in certificates("client_ca", Path::new("tls.client_ca"), ca)? {
                    roots
                        .add(cert)
                        .map_err(|e| KeyError::new("client_ca", e.to_string()))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .allow_unauthenticated()
                .build()
                .map_err(|e| KeyError::new("client_ca", e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| KeyError::new("key", format!("cannot serve the console: {e}")))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(Arc::new(config)))
    }
}

/// A certificate central presents or trusts, and when it stops being valid: what the
/// self-alerts watch (`self_alerts`), so an expiry is announced days ahead instead of showing as
/// every site failing its handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedCertificate {
    /// The `[tls]` key it was configured under: `cert` (central's chain) or `client_ca`.
    pub key: &'static str,
    /// Its Subject Common Name, or a placeholder when it has none.
    pub subject: String,
    pub not_after: chrono::DateTime<chrono::Utc>,
    /// SHA-256 of its DER, in hex: tells apart two certificates with one subject (the old and
    /// the renewed one).
    pub fingerprint: String,
}

impl TlsSettings {
    /// Every certificate of `tls.cert` (central's own and the intermediates it sends) and of
    /// `tls.client_ca`, with its end of validity; none without `[tls]`. The files were checked at
    /// start-up; a certificate whose validity cannot be read is left out (rustls would refuse it
    /// at the handshake anyway).
    pub fn watched_certificates(&self) -> Vec<WatchedCertificate> {
        use sha2::{Digest, Sha256};
        let Some(pems) = &self.server else {
            return Vec::new();
        };
        let mut watched = Vec::new();
        let files = [
            ("cert", Some(&pems.cert)),
            ("client_ca", pems.client_ca.as_ref()),
        ];
        for (key, pem) in files {
            let Some(pem) = pem else { continue };
            let Ok(chain) = certificates(key, Path::new(key), pem) else {
                continue;
            };
            for der in chain {
                let Some(not_after) = tls_files::not_after(&der)
                    .and_then(|d| i64::try_from(d.as_secs()).ok())
                    .and_then(|secs| chrono::DateTime::from_timestamp(secs, 0))
                else {
                    continue;
                };
                let fingerprint = Sha256::digest(der.as_ref())
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                watched.push(WatchedCertificate {
                    key,
                    subject: tls_files::common_name(&der)
                        .unwrap_or_else(|| "(no common name)".to_owned()),
                    not_after,
                    fingerprint,
                });
            }
        }
        watched
    }
}

pub use tls_files::client_common_name;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rcgen::{CertificateParams, DnType, KeyPair};

    use super::*;

    /// A self-signed certificate for `cn`, its PEM and its key's PEM.
    fn self_signed(cn: &str) -> (Vec<u8>, String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let cert = params.self_signed(&key).unwrap();
        (cert.der().to_vec(), cert.pem(), key.serialize_pem())
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn files_are_loaded_and_errors_name_the_key_and_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let (_, cert_pem, key_pem) = self_signed("central");
        let cert = write(dir.path(), "cert.pem", &cert_pem);
        let key = write(dir.path(), "key.pem", &key_pem);
        let (_, other_cert_pem, other_key_pem) = self_signed("other");
        let other_key = write(dir.path(), "other-key.pem", &other_key_pem);
        let ca = write(dir.path(), "ca.pem", &other_cert_pem);
        let garbage = write(dir.path(), "garbage.pem", "hello");
        let missing = dir.path().join("missing.pem");

        let full = TlsConfig {
            cert: Some(cert.clone()),
            key: Some(key.clone()),
            client_ca: Some(ca.clone()),
            allow_plaintext: false,
        };
        let settings = full.load().unwrap();
        assert!(settings.serves_tls() && settings.requires_client_certificates());
        assert!(settings.server_builder().is_ok());
        let watched = settings.watched_certificates();
        let subjects: Vec<_> = watched
            .iter()
            .map(|c| (c.key, c.subject.as_str()))
            .collect();
        assert_eq!(subjects, [("cert", "central"), ("client_ca", "other")]);
        assert_eq!(watched[0].fingerprint.len(), 64);
        assert_ne!(watched[0].fingerprint, watched[1].fingerprint);
        assert!(TlsSettings::default().watched_certificates().is_empty());
        assert!(!format!("{settings:?}").contains("PRIVATE KEY"));
        assert!(!TlsConfig::default().load().unwrap().serves_tls());

        let cases = [
            (
                TlsConfig {
                    key: None,
                    ..full.clone()
                },
                "tls.key: set it with tls.cert",
                None,
            ),
            (
                TlsConfig {
                    cert: Some(missing.clone()),
                    ..full.clone()
                },
                "tls.cert: cannot read",
                Some(&missing),
            ),
            (
                TlsConfig {
                    cert: Some(garbage.clone()),
                    ..full.clone()
                },
                "tls.cert:",
                Some(&garbage),
            ),
            (
                TlsConfig {
                    key: Some(garbage.clone()),
                    ..full.clone()
                },
                "tls.key:",
                Some(&garbage),
            ),
            (
                TlsConfig {
                    key: Some(other_key.clone()),
                    ..full.clone()
                },
                "tls.key:",
                Some(&other_key),
            ),
            (
                TlsConfig {
                    client_ca: Some(garbage.clone()),
                    ..full.clone()
                },
                "tls.client_ca:",
                Some(&garbage),
            ),
            (
                TlsConfig {
                    client_ca: Some(ca.clone()),
                    ..TlsConfig::default()
                },
                "tls.client_ca:",
                None,
            ),
        ];
        for (config, starts, path) in cases {
            let err = config.load().unwrap_err().to_string();
            assert!(err.starts_with(starts), "{err}");
            if let Some(path) = path {
                assert!(err.contains(&path.display().to_string()), "{err}");
            }
        }
    }

    #[test]
    fn plaintext_off_loopback_needs_allow_plaintext() {
        let public: SocketAddr = "0.0.0.0:50051".parse().unwrap();
        let loopback: SocketAddr = "[::1]:50051".parse().unwrap();
        let plain = TlsSettings::default();
        assert!(!plain.plaintext_exposure(loopback).unwrap());
        let err = plain.plaintext_exposure(public).unwrap_err().to_string();
        assert!(err.starts_with("listen_addr: 0.0.0.0:50051"), "{err}");
        assert!(err.contains("tls.allow_plaintext"), "{err}");
        let allowed = TlsSettings {
            allow_plaintext: true,
            ..TlsSettings::default()
        };
        assert!(allowed.plaintext_exposure(public).unwrap());
    }
}
