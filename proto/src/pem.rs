//! The TLS material both services load from PEM files (certificate chains, private keys), the
//! one rustls crypto provider both install, and the Common Name of a verified client
//! certificate, which both use as the caller's identity. Errors are the problem as text, naming the file;
//! each service prefixes the config key it was read for.

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Makes ring the process's rustls provider before anything opens a TLS connection (gRPC, SMTP,
/// webhooks, OAuth, MS SQL). It is the only provider compiled in; installing it explicitly
/// keeps every TLS user on it even if a dependency ever enables another.
pub fn install_crypto_provider() {
    // Err only when a provider is installed already (a second service in one test process).
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The bytes of a PEM file.
pub fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Every certificate in `pem` (read from `path`), at least one.
pub fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{} is not valid PEM: {e}", path.display()))?;
    if chain.is_empty() {
        return Err(format!("{} holds no PEM CERTIFICATE", path.display()));
    }
    Ok(chain)
}

/// The private key in `pem` (read from `path`): PKCS#8, PKCS#1 or SEC1.
pub fn private_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem)
        .map_err(|e| format!("{} holds no usable PEM private key: {e}", path.display()))
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

/// Checks that `key` belongs to the first certificate of the chain `cert` (both PEM files, read
/// and parsed by the caller), as rustls does when it builds a configuration: found here, at
/// start-up, a mismatch names both files instead of failing the first handshake. The message
/// reads "<key> does not fit the certificate in <cert>: <why>".
pub fn check_key_fits(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    cert_path: &Path,
    key_path: &Path,
) -> Result<(), String> {
    rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map(drop)
    .map_err(|e| {
        format!(
            "{} does not fit the certificate in {}: {e}",
            key_path.display(),
            cert_path.display()
        )
    })
}
