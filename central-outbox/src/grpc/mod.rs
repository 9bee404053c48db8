//! The gRPC edge of central: converts proto messages to domain types and back, and maps errors
//! to `tonic::Status` in one place. Handlers stay thin: validate, call the store, answer.

pub mod admin;
pub mod admin_convert;
pub mod convert;
pub mod ingest;

use tonic::Status;

use crate::domain::ContentError;
use crate::store::StoreError;

/// Bad input: the message names the field and the rule.
pub fn invalid_argument(e: ContentError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The one mapping from store failures to gRPC codes. Both are retryable by the caller.
pub fn store_status(e: StoreError) -> Status {
    match e {
        StoreError::Unavailable(detail) => {
            tracing::error!(%detail, "store unavailable");
            Status::unavailable("the outbox database is unavailable; retry later")
        }
        StoreError::Corrupt(detail) => {
            tracing::error!(%detail, "corrupt stored data");
            Status::internal(format!("stored data is invalid: {detail}"))
        }
    }
}
