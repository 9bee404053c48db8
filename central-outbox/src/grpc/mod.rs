//! The gRPC edge of central: converts proto messages to domain types and back, and maps errors
//! to `tonic::Status` in one place. Handlers stay thin: validate, call the store, answer.

pub(crate) mod admin;
pub(crate) mod admin_convert;
pub(crate) mod convert;
pub(crate) mod incident_convert;
pub(crate) mod ingest;
pub(crate) mod site_health;
pub(crate) mod site_status;

use tokio::net::TcpListener;
use tonic::Status;
use tonic::transport::server::TcpIncoming;

use crate::domain::ContentError;
use crate::store::StoreError;

/// The HTTP/2 flow-control windows central announces: how much a client may send on one stream,
/// and on one connection in all, ahead of what central has read. hyper's defaults (1 MiB each;
/// tonic's documentation says 64 KiB, but passes nothing and hyper's apply), set here explicitly
/// because what one submit stream can make central hold counts the stream window
/// (`ingest::STREAM_MEMORY_BOUND`).
pub(crate) const HTTP2_STREAM_WINDOW_BYTES: u32 = 1024 * 1024;
pub(crate) const HTTP2_CONNECTION_WINDOW_BYTES: u32 = 1024 * 1024;

/// The connections the gRPC server accepts, with TCP_NODELAY: without it, Nagle's algorithm holds
/// a small response (an ack, a status) until the client's delayed ACK of the previous segment,
/// up to 40 ms per exchange on Linux.
pub(crate) fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// Bad input: the message names the field and the rule.
pub(crate) fn invalid_argument(e: ContentError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The one mapping from store failures to gRPC codes. Unavailable and Corrupt are retryable by
/// the caller; a secret needing a key is FAILED_PRECONDITION, fixed in `[secrets]`, and so is
/// what the backend does not support.
pub(crate) fn store_status(e: StoreError) -> Status {
    match e {
        StoreError::Unavailable(detail) => {
            tracing::error!(%detail, "store unavailable");
            Status::unavailable("the outbox database is unavailable; retry later")
        }
        StoreError::Corrupt(detail) => {
            tracing::error!(%detail, "corrupt stored data");
            Status::internal(format!("stored data is invalid: {detail}"))
        }
        // Names the secret's place and key ids, never a key or a secret.
        StoreError::Secrets(e) if e.needs_configuration() => {
            tracing::warn!(error = %e, "stored secrets need a [secrets] key");
            Status::failed_precondition(e.to_string())
        }
        StoreError::Secrets(e) => {
            tracing::error!(error = %e, "stored secret cannot be opened");
            Status::internal(e.to_string())
        }
        StoreError::Unsupported(detail) => Status::failed_precondition(detail),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio_stream::StreamExt;

    use super::*;

    #[tokio::test]
    async fn accepted_connections_have_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = incoming(listener);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(accepted.nodelay().unwrap());
    }
}
