//! The connection to central: one channel with connect and per-call timeouts, and the
//! `x-outbox-actor` header on every request so operator actions are attributed in the audit
//! history.
//!
//! The channel connects eagerly, so a dead server or a wrong address is reported once, before
//! any command logic runs, as "cannot reach central at ...".

use std::time::Duration;

use outbox_proto::v1::notification_outbox_client::NotificationOutboxClient;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::error::{CliError, Result};

/// The request header central reads the acting operator from.
const ACTOR_HEADER: &str = "x-outbox-actor";

pub type OutboxClient = NotificationOutboxClient<InterceptedService<Channel, ActorHeader>>;

/// Adds `x-outbox-actor` to each request (when an actor is known; central records "unknown"
/// otherwise).
#[derive(Debug, Clone)]
pub struct ActorHeader(Option<AsciiMetadataValue>);

impl Interceptor for ActorHeader {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(actor) = &self.0 {
            request.metadata_mut().insert(ACTOR_HEADER, actor.clone());
        }
        Ok(request)
    }
}

/// `127.0.0.1:50051` is accepted as shorthand for `http://127.0.0.1:50051`: plaintext is what
/// the services serve, and operators type addresses the way grpcurl takes them.
pub fn normalise_addr(addr: &str) -> String {
    if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    }
}

/// The actor as a header value. Header values must be visible ASCII; refusing anything else up
/// front beats an audit row with a mangled name.
pub fn actor_header(actor: Option<&str>) -> Result<ActorHeader> {
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

pub async fn connect(addr: &str, timeout: Duration, actor: ActorHeader) -> Result<OutboxClient> {
    let endpoint = Endpoint::from_shared(addr.to_owned())
        .map_err(|e| CliError::Usage(format!("--addr {addr:?}: {e}")))?
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| CliError::Unreachable {
            addr: addr.to_owned(),
            detail: error_chain(&e),
        })?;
    Ok(NotificationOutboxClient::with_interceptor(channel, actor))
}

/// "transport error: tcp connect error: Connection refused (os error 111)": the outer tonic error
/// alone says nothing useful.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    crate::error::one_line(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_host_port_means_plaintext_http() {
        assert_eq!(normalise_addr("127.0.0.1:50051"), "http://127.0.0.1:50051");
        assert_eq!(normalise_addr("https://central:443"), "https://central:443");
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
