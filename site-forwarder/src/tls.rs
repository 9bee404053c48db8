//! TLS on the site's link to central, and the plaintext rule for the site's own port.
//!
//! An `https://` `central_url` is reached over TLS (rustls on ring): central's certificate is
//! checked against `[tls] ca` when set, else against the compiled-in Mozilla roots
//! (webpki-roots; no platform store is read). `cert` and `key` are the site's client
//! certificate, which central requires when it runs with `tls.client_ca`; its Common Name must
//! be this site's `site_id`. `domain` overrides the name central's certificate must carry (by
//! default the URL's host). The files are read and checked when the service starts, so a bad
//! one stops start-up with a message naming the key and the path.
//!
//! Invariants: TLS keys with an `http://` URL are an error, never silently unused; the local
//! `SiteNotify` API serves plaintext only, so a non-loopback `listen_addr` needs
//! `allow_plaintext` (and the service then warns at every start).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use tls_files::{KeyError, certificates, read};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig, Uri};

/// The `[tls]` section as written. Paths are relative to the working directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM CA certificate(s) central's certificate must chain to. Unset with an `https://`
    /// central: the Mozilla roots.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// PEM client certificate chain this site presents to central (its CN = `site_id`).
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// The name central's certificate must carry, when it is not `central_url`'s host.
    #[serde(default)]
    pub domain: Option<String>,
    /// Serve the (always plaintext) `SiteNotify` API on a non-loopback `listen_addr` anyway.
    #[serde(default)]
    pub allow_plaintext: bool,
}

/// Why `[tls]` cannot be used. Every message starts with the key it is about.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A `tls.*` key (its message starts with it).
    #[error(transparent)]
    Config(#[from] KeyError),
    #[error(
        "tls: {keys} set, but central_url {url:?} is plaintext http://; use an https:// URL \
         (or remove the tls keys)"
    )]
    UnusedWithHttp { keys: String, url: String },
    #[error(
        "listen_addr: {addr} is not a loopback address, and the SiteNotify API serves plaintext \
         only (tls covers the link to central); bind a loopback address, or set \
         tls.allow_plaintext = true to serve plaintext anyway"
    )]
    PlaintextExposed { addr: SocketAddr },
}

pub type Result<T, E = TlsError> = std::result::Result<T, E>;

impl TlsConfig {
    /// Checks the keys against each other, `central_url` and `listen_addr`, without reading
    /// the files (see [`TlsConfig::client_config`]).
    pub fn check(&self, central_url: &str, listen_addr: SocketAddr) -> Result<()> {
        match (&self.cert, &self.key) {
            (Some(_), None) => return Err(KeyError::new("key", "set it with tls.cert").into()),
            (None, Some(_)) => return Err(KeyError::new("cert", "set it with tls.key").into()),
            _ => {}
        }
        if self.domain.as_deref().is_some_and(str::is_empty) {
            return Err(KeyError::new("domain", "must not be empty").into());
        }
        if !is_https(central_url) {
            let keys: Vec<&str> = [
                ("tls.ca", self.ca.is_some()),
                ("tls.cert", self.cert.is_some()),
                ("tls.key", self.key.is_some()),
                ("tls.domain", self.domain.is_some()),
            ]
            .into_iter()
            .filter_map(|(key, set)| set.then_some(key))
            .collect();
            if !keys.is_empty() {
                return Err(TlsError::UnusedWithHttp {
                    keys: keys.join(", "),
                    url: central_url.to_owned(),
                });
            }
        }
        self.plaintext_exposure(listen_addr).map(drop)
    }

    /// Whether serving `SiteNotify` on `addr` is plaintext off this machine: `Ok(true)` when
    /// `allow_plaintext` permits it (the caller warns), `Ok(false)` on loopback.
    pub fn plaintext_exposure(&self, addr: SocketAddr) -> Result<bool> {
        if addr.ip().is_loopback() {
            Ok(false)
        } else if self.allow_plaintext {
            Ok(true)
        } else {
            Err(TlsError::PlaintextExposed { addr })
        }
    }

    /// The TLS client configuration for `central_url`, with its files read and checked; `None`
    /// for an `http://` URL. `handshake_timeout` bounds the handshake, which tonic's connect
    /// timeout (TCP only) does not.
    pub fn client_config(
        &self,
        central_url: &str,
        handshake_timeout: Duration,
    ) -> Result<Option<ClientTlsConfig>> {
        self.client_config_for(central_url, self.domain.as_deref(), handshake_timeout)
    }

    /// [`Self::client_config`] for any `url` (central's or the pair peer's), with the name its
    /// certificate must carry when it is not the URL's host.
    pub fn client_config_for(
        &self,
        url: &str,
        domain: Option<&str>,
        handshake_timeout: Duration,
    ) -> Result<Option<ClientTlsConfig>> {
        if !is_https(url) {
            return Ok(None);
        }
        let mut config = ClientTlsConfig::new().timeout(handshake_timeout);
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca {
            Some(path) => {
                let pem = read("ca", path)?;
                for certificate in certificates("ca", path, &pem)? {
                    roots.add(certificate).map_err(|e| {
                        KeyError::new("ca", format!("{}: not a usable CA: {e}", path.display()))
                    })?;
                }
                config = config.ca_certificate(Certificate::from_pem(pem));
            }
            // Public CAs: for a central whose certificate comes from one.
            None => config = config.with_webpki_roots(),
        }
        if let (Some(cert_path), Some(key_path)) = (&self.cert, &self.key) {
            let tls_files::IdentityPems { cert, key } = tls_files::identity(cert_path, key_path)?;
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = domain {
            config = config.domain_name(domain.to_owned());
        }
        Ok(Some(config))
    }

    /// Checks the pair link's keys: TLS (`https://` peer, `tls.cert`, `tls.key` and `tls.ca`,
    /// which both nodes' certificates chain to) or plaintext (`http://` peer, and `listen` on
    /// loopback unless `allow_plaintext`).
    pub fn check_pair(&self, peer_url: &str, listen: SocketAddr) -> Result<()> {
        let identity = self.cert.is_some() && self.key.is_some();
        let checked: Result<(), KeyError> = match (is_https(peer_url), identity) {
            (true, true) if self.ca.is_none() => Err(KeyError::new(
                "ca",
                "required for the pair link: the CA both nodes' certificates chain to",
            )),
            (true, true) => Ok(()),
            (true, false) => Err(KeyError::new(
                "cert",
                "required for an https:// pair.peer_url: each node of the pair presents its \
                 certificate (Common Name = site_id) to the other",
            )),
            (false, true) => Err(KeyError::new(
                "cert",
                "is set, so the pair link uses TLS: make pair.peer_url https://",
            )),
            (false, false) if listen.ip().is_loopback() || self.allow_plaintext => Ok(()),
            (false, false) => Err(KeyError::new(
                "cert",
                format!(
                    "pair.listen {listen} is not a loopback address: set tls.cert, tls.key and \
                     tls.ca to protect the pair link (it carries every notification), or set \
                     tls.allow_plaintext = true"
                ),
            )),
        };
        checked.map_err(TlsError::from)
    }

    /// The TLS server side of the pair link, `None` for plaintext: this node's certificate, and
    /// a client certificate chaining to `tls.ca` required at the handshake.
    pub fn pair_server_config(&self) -> Result<Option<ServerTlsConfig>> {
        let (Some(cert_path), Some(key_path), Some(ca_path)) = (&self.cert, &self.key, &self.ca)
        else {
            return Ok(None);
        };
        let cert = read("cert", cert_path)?;
        let key = read("key", key_path)?;
        let ca = read("ca", ca_path)?;
        certificates("ca", ca_path, &ca)?;
        certificates("cert", cert_path, &cert)?;
        tls_files::private_key("key", key_path, &key)?;
        Ok(Some(
            ServerTlsConfig::new()
                .identity(Identity::from_pem(cert, key))
                .client_ca_root(Certificate::from_pem(ca))
                .client_auth_optional(false),
        ))
    }
}

/// Whether `central_url` is plaintext to another machine: `http://` to a host that is neither a
/// loopback address nor `localhost`. Allowed (central refuses plaintext off loopback unless it
/// was told otherwise), but worth a warning.
pub fn plaintext_to_remote(central_url: &str) -> bool {
    let Ok(uri) = central_url.parse::<Uri>() else {
        return false;
    };
    let host = uri.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    uri.scheme_str() == Some("http") && !loopback
}

fn is_https(url: &str) -> bool {
    url.parse::<Uri>()
        .is_ok_and(|uri| uri.scheme_str() == Some("https"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: &str = "127.0.0.1:50052";

    fn local() -> SocketAddr {
        LOCAL.parse().unwrap()
    }

    #[test]
    fn tls_keys_need_an_https_url() {
        let config = TlsConfig {
            ca: Some("ca.pem".into()),
            ..TlsConfig::default()
        };
        let err = config
            .check("http://central:50051", local())
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("tls: tls.ca set"), "{err}");
        assert!(config.check("https://central:50051", local()).is_ok());
        assert!(
            TlsConfig::default()
                .check("http://central:50051", local())
                .is_ok()
        );
    }

    #[test]
    fn plaintext_to_another_machine_is_recognised() {
        for (url, remote) in [
            ("http://central.plant:50051", true),
            ("http://10.0.0.5:50051", true),
            ("http://127.0.0.1:50051", false),
            ("http://[::1]:50051", false),
            ("http://localhost:50051", false),
            ("https://central.plant:50051", false),
        ] {
            assert_eq!(plaintext_to_remote(url), remote, "{url}");
        }
    }

    #[test]
    fn cert_and_key_go_together() {
        let cert_only = TlsConfig {
            cert: Some("site.pem".into()),
            ..TlsConfig::default()
        };
        let err = cert_only
            .check("https://central:50051", local())
            .unwrap_err();
        assert!(err.to_string().starts_with("tls.key"), "{err}");
    }

    #[test]
    fn a_non_loopback_listen_addr_needs_allow_plaintext() {
        let public: SocketAddr = "0.0.0.0:50052".parse().unwrap();
        let err = TlsConfig::default()
            .check("http://127.0.0.1:50051", public)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("listen_addr: 0.0.0.0:50052"), "{err}");
        assert!(err.contains("tls.allow_plaintext"), "{err}");
        let allowed = TlsConfig {
            allow_plaintext: true,
            ..TlsConfig::default()
        };
        assert!(allowed.check("http://127.0.0.1:50051", public).is_ok());
        assert!(allowed.plaintext_exposure(public).unwrap());
        assert!(!allowed.plaintext_exposure(local()).unwrap());
    }

    #[test]
    fn files_are_read_only_for_https_and_errors_name_the_key_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "hello").unwrap();
        let timeout = Duration::from_secs(5);
        let config = TlsConfig {
            ca: Some(missing.clone()),
            ..TlsConfig::default()
        };
        assert!(
            config
                .client_config("http://central:1", timeout)
                .unwrap()
                .is_none()
        );
        let err = config
            .client_config("https://central:1", timeout)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("tls.ca: cannot read"), "{err}");
        assert!(err.contains(&missing.display().to_string()), "{err}");
        let config = TlsConfig {
            ca: Some(garbage.clone()),
            ..TlsConfig::default()
        };
        let err = config
            .client_config("https://central:1", timeout)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("tls.ca:"), "{err}");
        assert!(err.contains(&garbage.display().to_string()), "{err}");
        // No CA: the Mozilla roots, nothing to read.
        assert!(
            TlsConfig::default()
                .client_config("https://central:1", timeout)
                .unwrap()
                .is_some()
        );
    }
}
