//! The order a channel's attempts take their places at their connections in. The dispatcher
//! starts attempts in the order it claimed them (`domain::serve_order`), each as a task of its
//! own; tasks do not run in the order they were spawned, so an adapter that queues attempts
//! behind its connections (email: `smtp_lane`) would otherwise line them up in whatever order
//! their tasks first ran, and a backlog on one connection would not go out oldest first.
//!
//! Each attempt gets a [`Turn`]: it [waits](Turn::wait) until the attempt started before it has
//! taken its place, takes its own, and then lets the turn go (drops it), which lets the next
//! one on. An attempt that ends before it takes a place (an unknown list, a panic, a timeout)
//! lets the turn go as it ends, so no attempt ever waits for one that will not come.

use tokio::sync::oneshot;

/// One attempt's place in its channel's start order; see the module documentation.
// `pub` for the e2e mail tests, through `crate::testing`.
#[derive(Debug)]
#[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
pub struct Turn {
    /// Closes when the attempt before this one has let its turn go.
    after: Option<oneshot::Receiver<()>>,
    /// Dropped with this turn: lets the next attempt on.
    _lets_next_on: oneshot::Sender<()>,
}

/// Hands out the turns of one channel, in the order its attempts start.
#[derive(Debug, Default)]
pub(crate) struct StartOrder {
    /// Closes when the last turn handed out has been let go.
    last: Option<oneshot::Receiver<()>>,
}

impl StartOrder {
    /// The turn of the attempt starting now, after every one started before it.
    pub(crate) fn next_turn(&mut self) -> Turn {
        let (lets_next_on, next) = oneshot::channel();
        Turn {
            after: self.last.replace(next),
            _lets_next_on: lets_next_on,
        }
    }
}

impl Turn {
    /// A turn that waits for nothing: for an attempt outside any order (tests).
    #[cfg(any(test, feature = "test-support"))]
    #[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
    pub fn first() -> Self {
        StartOrder::default().next_turn()
    }

    /// A turn that waits for nothing: for a message that follows one which took the attempt's
    /// place already (an incident's message to each recipient after the first).
    pub(crate) fn unordered() -> Self {
        StartOrder::default().next_turn()
    }

    /// Until the attempt before this one has let its turn go.
    pub(crate) async fn wait(&mut self) {
        if let Some(after) = self.after.as_mut() {
            // Err is the earlier turn dropped, which is exactly the signal: nothing is sent.
            // Awaited in place, so a wait that is given up on leaves the turn as it was.
            let _ = after.await;
            self.after = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[tokio::test]
    async fn each_turn_waits_for_the_one_before_it_only() {
        let mut order = StartOrder::default();
        let first = order.next_turn();
        let mut second = order.next_turn();
        let mut third = order.next_turn();
        assert!(
            second.wait().now_or_never().is_none(),
            "the first still holds it"
        );
        drop(first);
        second.wait().await;
        assert!(
            third.wait().now_or_never().is_none(),
            "the second still holds it"
        );
        drop(second);
        third.wait().await;
        // A turn already waited for does not wait again.
        third.wait().await;
        Turn::first().wait().await;
    }
}
