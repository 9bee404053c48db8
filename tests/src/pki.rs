//! A throwaway certificate authority for the TLS tests and `bench --tls`: a CA, a server
//! certificate for loopback (`localhost`, `127.0.0.1`, `::1`) and client certificates with a
//! chosen Common Name, each written as PEM files into a directory the caller owns (a temp dir),
//! so the services read them exactly as they would read an operator's files.
//!
//! Generated at run time with rcgen (ECDSA P-256 on ring), so no key material is kept in the
//! repository. Files are named after the CA (`<ca>-ca.pem`, `<ca>-<cn>.pem`, `<ca>-<cn>.key`),
//! so several CAs can share one directory (the "certificate from another CA" cases).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// The names central's test certificate is valid for: whatever a test dials on loopback.
pub const SERVER_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// A certificate and its private key, as PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertFiles {
    /// The pair as a tonic client identity.
    pub fn identity(&self) -> Result<Identity> {
        Ok(Identity::from_pem(read(&self.cert)?, read(&self.key)?))
    }
}

/// A CA that signs certificates into one directory.
pub struct Pki {
    name: String,
    dir: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
    ca_cert: PathBuf,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("name", &self.name)
            .field("ca_cert", &self.ca_cert)
            .finish()
    }
}

impl Pki {
    /// A new CA whose certificate (CN `<name> test CA`) is written to `dir/<name>-ca.pem`.
    pub fn new(dir: &Path, name: &str) -> Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let ca_cert = dir.join(format!("{name}-ca.pem"));
        write(&ca_cert, &issuer.pem())?;
        Ok(Self {
            name: name.to_owned(),
            dir: dir.to_path_buf(),
            issuer,
            ca_cert,
        })
    }

    /// The CA certificate's PEM file: central's `tls.client_ca`, a site's `tls.ca`.
    pub fn ca_cert(&self) -> &Path {
        &self.ca_cert
    }

    /// A server certificate (CN `central`) valid for [`SERVER_NAMES`].
    pub fn server_cert(&self) -> Result<CertFiles> {
        let names = SERVER_NAMES
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>();
        self.issue("central", names, &[ExtendedKeyUsagePurpose::ServerAuth])
    }

    /// A client certificate whose Subject Common Name is `common_name` (a site id, or an
    /// operator's name).
    pub fn client_cert(&self, common_name: &str) -> Result<CertFiles> {
        self.issue(
            common_name,
            Vec::new(),
            &[ExtendedKeyUsagePurpose::ClientAuth],
        )
    }

    /// A site pair node's certificate: Common Name `site_id`, valid for [`SERVER_NAMES`], for
    /// both ends of the pair link (each node serves its peer and calls it).
    pub fn node_cert(&self, site_id: &str) -> Result<CertFiles> {
        let names = SERVER_NAMES.iter().map(|n| n.to_string()).collect();
        self.issue(
            site_id,
            names,
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    /// A tonic client configuration trusting this CA, presenting `identity` if given.
    pub fn client_tls(&self, identity: Option<&CertFiles>) -> Result<ClientTlsConfig> {
        let mut config =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&self.ca_cert)?));
        if let Some(files) = identity {
            config = config.identity(files.identity()?);
        }
        Ok(config)
    }

    fn issue(
        &self,
        common_name: &str,
        names: Vec<String>,
        usages: &[ExtendedKeyUsagePurpose],
    ) -> Result<CertFiles> {
        let mut params = CertificateParams::new(names)
            .with_context(|| format!("certificate parameters for {common_name:?}"))?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = usages.to_vec();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        // The CN may hold characters a file name should not; the files only need to differ.
        let stem: String = common_name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let files = CertFiles {
            cert: self.dir.join(format!("{}-{stem}.pem", self.name)),
            key: self.dir.join(format!("{}-{stem}.key", self.name)),
        };
        write(&files.cert, &cert.pem())?;
        write(&files.key, &key.serialize_pem())?;
        Ok(files)
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}
