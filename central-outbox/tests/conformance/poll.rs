//! Waiting in the conformance tests: a condition asked again until it holds, with a deadline,
//! never a fixed delay. The database's clock decides when a claim, a lease or a report lapses,
//! so the tests ask the store until it says so.

use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, Interval};

/// Pause between two asks: short next to every deadline here, long enough not to busy a server.
const PAUSE: Duration = Duration::from_millis(50);

/// Paced asks under one deadline, for a loop that changes its own state between asks (where a
/// closure for [`until`] would have to borrow that state mutably).
pub(crate) struct Asks {
    give_up: Instant,
    pause: Interval,
}

impl Asks {
    pub(crate) fn within(deadline: Duration) -> Self {
        Self {
            give_up: Instant::now() + deadline,
            pause: tokio::time::interval(PAUSE),
        }
    }

    /// Waits for the next ask's turn (the first is at once).
    pub(crate) async fn next(&mut self) {
        self.pause.tick().await;
    }

    /// Whether the deadline has passed: the caller fails, saying what it still sees.
    pub(crate) fn overdue(&self) -> bool {
        Instant::now() >= self.give_up
    }
}

/// The first `Some` that `check` gives; panics with `what` if none comes within `deadline`.
pub(crate) async fn until<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let mut asks = Asks::within(deadline);
    loop {
        asks.next().await;
        if let Some(value) = check().await {
            return value;
        }
        assert!(!asks.overdue(), "{what} (waited {deadline:?})");
    }
}
