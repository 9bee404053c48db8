//! Panics kept to the call that raised them. A panic in a store call or an adapter is a bug, but
//! it must cost only that call: the dispatcher's loops, the recorder and the delivery tasks
//! catch it and carry on with it as an answer (the database unavailable, a transient delivery
//! failure), never letting it end the task that made the call.

use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;

use crate::store::StoreError;

/// Runs a store call, answering a panic in it as the database being unavailable:
/// "`what` panicked: …". The caller then treats it like any failed call (a claim tried again
/// at the next ingest or poll, an outcome write retried or counted as unrecorded).
pub(super) async fn store_call<T>(
    what: &str,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    AssertUnwindSafe(call)
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            Err(StoreError::Unavailable(format!(
                "{what} panicked: {}",
                panic_message(panic.as_ref())
            )))
        })
}

/// The text a panic was raised with, when it was a string (as `panic!` makes it).
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-text panic payload")
}
