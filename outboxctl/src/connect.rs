//! The connection to central: one channel with connect and per-call timeouts, TLS when asked
//! for (`https://`, `--ca`, `--cert`/`--key`), and on every request the operator's bearer token
//! (which is who central records as the actor) and the `x-outbox-actor` display name (used
//! only when central runs unauthenticated).
//!
//! The channel connects eagerly, so a dead server or a wrong address is reported once, before
//! any command logic runs, as "cannot reach central at ...".

use std::path::{Path, PathBuf};
use std::time::Duration;

use outbox_proto::v1::notification_outbox_client::NotificationOutboxClient;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::error::{CliError, Result};

/// The request header central reads the acting operator from.
const ACTOR_HEADER: &str = "x-outbox-actor";

pub(crate) type OutboxClient = NotificationOutboxClient<InterceptedService<Channel, CallHeaders>>;

/// Adds the bearer token and `x-outbox-actor` to each request, when known.
#[derive(Debug, Clone)]
pub(crate) struct CallHeaders {
    actor: ActorHeader,
    authorization: Option<AsciiMetadataValue>,
}

/// The `x-outbox-actor` value, when an actor is known (central records "unknown" otherwise).
#[derive(Debug, Clone)]
pub(crate) struct ActorHeader(Option<AsciiMetadataValue>);

impl Interceptor for CallHeaders {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(actor) = &self.actor.0 {
            request.metadata_mut().insert(ACTOR_HEADER, actor.clone());
        }
        if let Some(token) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        Ok(request)
    }
}

/// How to reach central: TLS files and the token, as given on the command line.
#[derive(Debug, Default)]
pub(crate) struct Access {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    /// The token itself (OUTBOX_TOKEN), when no file is given.
    pub token: Option<String>,
}

impl Access {
    /// The `authorization` header value, from the token file or OUTBOX_TOKEN.
    fn authorization(&self) -> Result<Option<AsciiMetadataValue>> {
        let token = match &self.token_file {
            Some(path) => Some(read(path, "--token-file")?),
            None => self.token.clone(),
        };
        let Some(token) = token.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()) else {
            return Ok(None);
        };
        let mut value = AsciiMetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| CliError::Usage("the token must be printable ASCII on one line".into()))?;
        value.set_sensitive(true);
        Ok(Some(value))
    }

    /// The client TLS settings, if any TLS file was given.
    fn tls(&self) -> Result<Option<ClientTlsConfig>> {
        if self.ca.is_none() && self.cert.is_none() {
            return Ok(None);
        }
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = &self.ca {
            tls = tls.ca_certificate(Certificate::from_pem(read(ca, "--ca")?));
        }
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            tls = tls.identity(Identity::from_pem(
                read(cert, "--cert")?,
                read(key, "--key")?,
            ));
        }
        Ok(Some(tls))
    }
}

fn read(path: &Path, flag: &str) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("{flag} {}: {e}", path.display())))
}

/// `127.0.0.1:50051` is accepted as shorthand for `http://127.0.0.1:50051` (or `https://` when
/// TLS files are given): operators type addresses the way grpcurl takes them.
pub(crate) fn normalise_addr(addr: &str, tls: bool) -> String {
    if addr.contains("://") {
        addr.to_owned()
    } else if tls {
        format!("https://{addr}")
    } else {
        format!("http://{addr}")
    }
}

/// The actor as a header value. Header values must be visible ASCII; refusing anything else up
/// front beats an audit row with a mangled name.
pub(crate) fn actor_header(actor: Option<&str>) -> Result<ActorHeader> {
    let Some(actor) = actor.map(str::trim).filter(|a| !a.is_empty()) else {
        return Ok(ActorHeader(None));
    };
    // tonic would accept bytes 0x80-0xFF (HTTP obs-text) and central would read them as
    // mojibake, so insist on what every hop passes through unchanged.
    let printable = actor.chars().all(|c| c.is_ascii_graphic() || c == ' ');
    match MetadataValue::try_from(actor) {
        Ok(value) if printable => Ok(ActorHeader(Some(value))),
        _ => Err(CliError::Usage(format!(
            "--actor {actor:?}: must be printable ASCII (it is sent as a gRPC header)"
        ))),
    }
}

pub(crate) async fn connect(
    addr: &str,
    timeout: Duration,
    actor: ActorHeader,
    access: &Access,
) -> Result<OutboxClient> {
    let mut endpoint = Endpoint::from_shared(addr.to_owned())
        .map_err(|e| CliError::Usage(format!("--addr {addr:?}: {e}")))?
        .connect_timeout(timeout)
        .timeout(timeout);
    let tls = match access.tls()? {
        Some(tls) => Some(tls),
        // https:// alone: the platform's trust roots.
        None if addr.starts_with("https://") => Some(ClientTlsConfig::new().with_enabled_roots()),
        None => None,
    };
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| CliError::Usage(format!("TLS settings: {}", error_chain(&e))))?;
    }
    let headers = CallHeaders {
        actor,
        authorization: access.authorization()?,
    };
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| CliError::Unreachable {
            addr: addr.to_owned(),
            detail: error_chain(&e),
        })?;
    Ok(NotificationOutboxClient::with_interceptor(channel, headers))
}

/// "transport error: tcp connect error: Connection refused (os error 111)": the outer tonic error
/// alone says nothing useful. On one line even where a source's text has line breaks.
fn error_chain(error: &dyn std::error::Error) -> String {
    crate::error::one_line(&outbox_proto::error_chain(error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_host_port_means_plaintext_http() {
        assert_eq!(
            normalise_addr("127.0.0.1:50051", false),
            "http://127.0.0.1:50051"
        );
        assert_eq!(
            normalise_addr("127.0.0.1:50051", true),
            "https://127.0.0.1:50051"
        );
        assert_eq!(
            normalise_addr("https://central:443", false),
            "https://central:443"
        );
    }

    #[test]
    fn actor_must_be_ascii() {
        assert!(actor_header(Some("ops-jane")).unwrap().0.is_some());
        assert!(actor_header(None).unwrap().0.is_none());
        assert!(actor_header(Some("  ")).unwrap().0.is_none());
        assert!(matches!(
            actor_header(Some("jöran")),
            Err(CliError::Usage(_))
        ));
    }
}
