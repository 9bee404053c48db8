//! The TLS files both services load from PEM (certificate chains, private keys), the one rustls
//! crypto provider both install, and the Common Name of a verified client certificate, which
//! both use as the caller's identity.
//!
//! Both services read these files from their `[tls]` section, so every error here is a
//! [`KeyError`] naming the key the file was configured under and the file's path:
//! `tls.<key>: <problem>`. Each service's own `tls.rs` keeps only its settings and its checks
//! (which keys go together, the plaintext rule, how tonic or rustls is configured).

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A `[tls]` key that cannot be used, and why. The message starts with the key: `tls.<key>: ...`.
#[derive(Debug, thiserror::Error)]
#[error("tls.{key}: {problem}")]
pub struct KeyError {
    /// The key under `[tls]` (`cert`, `key`, `ca`, `client_ca`, ...), without the `tls.`.
    pub key: &'static str,
    /// What is wrong with it; names the file when there is one.
    pub problem: String,
}

impl KeyError {
    pub fn new(key: &'static str, problem: impl Into<String>) -> Self {
        Self {
            key,
            problem: problem.into(),
        }
    }
}

pub type Result<T, E = KeyError> = std::result::Result<T, E>;

/// Makes ring the process's rustls provider before anything opens a TLS connection (gRPC, SMTP,
/// webhooks, OAuth, MS SQL). It is the only provider compiled in; installing it explicitly
/// keeps every TLS user on it even if a dependency ever enables another.
pub fn install_crypto_provider() {
    // Err only when a provider is installed already (a second service in one test process).
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The bytes of the PEM file `path`, configured as `tls.<key>`.
pub fn read(key: &'static str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| KeyError::new(key, format!("cannot read {}: {e}", path.display())))
}

/// Every certificate in `pem` (read from `path`, configured as `tls.<key>`), at least one.
pub fn certificates(
    key: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| KeyError::new(key, format!("{} is not valid PEM: {e}", path.display())))?;
    if chain.is_empty() {
        return Err(KeyError::new(
            key,
            format!("{} holds no PEM CERTIFICATE", path.display()),
        ));
    }
    Ok(chain)
}

/// The private key in `pem` (read from `path`, configured as `tls.<key>`): PKCS#8, PKCS#1 or
/// SEC1.
pub fn private_key(key: &'static str, path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| {
        KeyError::new(
            key,
            format!("{} holds no usable PEM private key: {e}", path.display()),
        )
    })
}

/// The PEM text of an identity (`tls.cert` and `tls.key`), checked.
pub struct IdentityPems {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

/// Reads `tls.cert` and `tls.key` and checks them: the certificates parse, the key parses and
/// belongs to the first certificate, as rustls checks when it builds a configuration. Found
/// here, at start-up, a mismatch names both files instead of failing the first handshake:
/// `tls.key: <key file> does not fit the certificate in <cert file>: <why>`.
pub fn identity(cert_path: &Path, key_path: &Path) -> Result<IdentityPems> {
    let cert = read("cert", cert_path)?;
    let key = read("key", key_path)?;
    let chain = certificates("cert", cert_path, &cert)?;
    let private_key = private_key("key", key_path, &key)?;
    rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| KeyError::new("key", e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(chain, private_key)
    .map_err(|e| {
        KeyError::new(
            "key",
            format!(
                "{} does not fit the certificate in {}: {e}",
                key_path.display(),
                cert_path.display()
            ),
        )
    })?;
    Ok(IdentityPems { cert, key })
}

/// The Subject Common Name of the client certificate verified at the TLS handshake of the
/// connection `request` came on; `None` on a connection without one (plaintext, or TLS without
/// a client CA) or when the certificate has no Common Name. With several CNs, the first.
pub fn client_common_name<T>(request: &tonic::Request<T>) -> Option<String> {
    let chain = request.peer_certs()?;
    // rustls puts the client's own certificate first, then any intermediates it sent.
    common_name(chain.first()?)
}

/// The first Subject Common Name of a DER certificate.
pub fn common_name(der: &[u8]) -> Option<String> {
    use x509_cert::der::Decode;
    let certificate = x509_cert::Certificate::from_der(der).ok()?;
    let name = certificate
        .tbs_certificate()
        .subject()
        .common_name()
        .ok()??;
    Some(name.value().into_owned())
}

/// When a DER certificate stops being valid (its notAfter), as time since the Unix epoch;
/// `None` when it does not parse.
pub fn not_after(der: &[u8]) -> Option<std::time::Duration> {
    use x509_cert::der::Decode;
    let certificate = x509_cert::Certificate::from_der(der).ok()?;
    Some(
        certificate
            .tbs_certificate()
            .validity()
            .not_after
            .to_unix_duration(),
    )
}

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

    #[test]
    fn the_common_name_is_read_from_the_subject() {
        let (der, _, _) = self_signed("site-a");
        assert_eq!(common_name(&der).as_deref(), Some("site-a"));
        assert_eq!(common_name(b"not a certificate"), None);
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        let without_cn = params.self_signed(&key).unwrap();
        assert_eq!(common_name(without_cn.der()), None);
    }

    #[test]
    fn the_end_of_validity_is_read() {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_after = rcgen::date_time_ymd(2031, 7, 1);
        let cert = params.self_signed(&key).unwrap();
        // 2031-07-01T00:00:00Z
        assert_eq!(
            not_after(cert.der()),
            Some(std::time::Duration::from_secs(1_940_630_400))
        );
        assert_eq!(not_after(b"not a certificate"), None);
    }

    #[test]
    fn a_request_without_a_client_certificate_has_no_common_name() {
        assert_eq!(client_common_name(&tonic::Request::new(())), None);
    }

    #[test]
    fn errors_name_the_key_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = read("ca", &missing).unwrap_err().to_string();
        assert!(err.starts_with("tls.ca: cannot read"), "{err}");
        assert!(err.contains(&missing.display().to_string()), "{err}");
        let err = certificates("client_ca", &missing, b"hello")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("tls.client_ca: "), "{err}");
        assert!(err.contains("holds no PEM CERTIFICATE"), "{err}");

        let (_, cert_pem, key_pem) = self_signed("central");
        let (_, _, other_key_pem) = self_signed("other");
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        let other_key = dir.path().join("other-key.pem");
        std::fs::write(&cert, cert_pem).unwrap();
        std::fs::write(&key, key_pem).unwrap();
        std::fs::write(&other_key, other_key_pem).unwrap();
        assert!(identity(&cert, &key).is_ok());
        let err = identity(&cert, &other_key).err().unwrap().to_string();
        assert!(err.starts_with("tls.key: "), "{err}");
        assert!(err.contains("does not fit the certificate in"), "{err}");
    }
}
