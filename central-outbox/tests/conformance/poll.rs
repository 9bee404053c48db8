//! Waiting in the conformance tests: a condition asked again until it holds, with a deadline,
//! never a fixed delay. The database's clock decides when a claim, a lease or a report lapses,
//! so the tests ask the store until it says so.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Pause between two asks: short next to every deadline here, long enough not to busy a server.
const PAUSE: Duration = Duration::from_millis(50);

/// The first `Some` that `check` gives; panics with `what` if none comes within `deadline`.
pub async fn until<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let give_up = Instant::now() + deadline;
    let mut asks = tokio::time::interval(PAUSE);
    loop {
        asks.tick().await;
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < give_up, "{what} (waited {deadline:?})");
    }
}
