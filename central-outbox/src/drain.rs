//! The order central stops in, in one place. [`crate::run`] starts its tasks under the tokens
//! of a [`DrainOrder`] and hands it the gRPC server; once a shutdown is asked for (or a
//! supervised task is given up on), things stop in this order:
//!
//! 1. `shutdown`: health answers NOT_SERVING, the gRPC server stops accepting, and the tasks
//!    that serve or watch ([`DrainOrder::stops_with_server`]: the store's health watch, the
//!    self-alerts, the `/metrics` endpoint) and the web console stop taking work;
//! 2. `streams`: the submit streams end, right after health went NOT_SERVING (an open stream
//!    would hold the server open forever); the server then waits for the calls under way, for
//!    at most the shutdown timeout;
//! 3. `dispatch`, once the server has stopped: the tasks that deliver
//!    ([`DrainOrder::stops_after_server`]: the dispatcher, which lets its deliveries under way
//!    finish, records their outcomes and releases its lease, and the purge) stop; they went on
//!    delivering while the last calls were answered;
//! 4. every task is waited for; the console's requests under way get the shutdown timeout, so
//!    a browser holding a request open does not hold up the exit beyond it.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::health::Health;

/// The tokens central's tasks stop by, and the tasks to wait for; see the module documentation.
pub(crate) struct DrainOrder {
    /// Step 1: a shutdown asked for, or a supervised task given up on.
    pub(crate) shutdown: CancellationToken,
    /// Step 2: ends the submit streams (the ingest service holds it).
    pub(crate) streams: CancellationToken,
    /// Step 3: stops the dispatcher and the purge.
    pub(crate) dispatch: CancellationToken,
    /// How long the gRPC calls, and the console's requests, may take to finish.
    shutdown_timeout: Duration,
    with_server: Vec<(&'static str, JoinHandle<()>)>,
    after_server: Vec<(&'static str, JoinHandle<()>)>,
    /// The web console's and the acknowledgement page's listeners.
    http: Vec<(&'static str, JoinHandle<()>)>,
}

impl DrainOrder {
    /// Steps 1 to 3 start at `shutdown`.
    pub(crate) fn new(shutdown: CancellationToken, shutdown_timeout: Duration) -> Self {
        Self {
            shutdown,
            streams: CancellationToken::new(),
            dispatch: CancellationToken::new(),
            shutdown_timeout,
            with_server: Vec::new(),
            after_server: Vec::new(),
            http: Vec::new(),
        }
    }

    /// A task that stops at `shutdown` (step 1), named in the log if it fails.
    pub(crate) fn stops_with_server(&mut self, name: &'static str, task: JoinHandle<()>) {
        self.with_server.push((name, task));
    }

    /// A task that stops at `dispatch` (step 3), named in the log if it fails.
    pub(crate) fn stops_after_server(&mut self, name: &'static str, task: JoinHandle<()>) {
        self.after_server.push((name, task));
    }

    /// An HTTP listener's task (the web console, the acknowledgement page): it stops at
    /// `shutdown`, and its requests under way are waited for at most the shutdown timeout.
    pub(crate) fn http(&mut self, name: &'static str, task: JoinHandle<()>) {
        self.http.push((name, task));
    }

    /// What the gRPC server waits for to begin its shutdown (steps 1 and 2): health
    /// NOT_SERVING, then the submit streams ended.
    pub(crate) fn server_shutdown(&self, health: Health) -> impl Future<Output = ()> + use<> {
        let (shutdown, streams) = (self.shutdown.clone(), self.streams.clone());
        async move {
            shutdown.cancelled().await;
            tracing::info!("shutting down: health NOT_SERVING, closing streams");
            health.begin_shutdown().await;
            // Long-lived submit streams would hold the server open forever: end them.
            streams.cancel();
        }
    }

    /// Serves until the gRPC server has stopped (or the shutdown timeout after the shutdown:
    /// the server stops accepting at shutdown and waits for open calls, and that wait is
    /// bounded), then steps 3 and 4. Returns the server's result.
    pub(crate) async fn serve<E>(
        self,
        server: impl Future<Output = Result<(), E>>,
    ) -> Result<(), E> {
        let served = tokio::select! {
            served = server => served,
            () = async {
                self.shutdown.cancelled().await;
                tokio::time::sleep(self.shutdown_timeout).await;
            } => {
                tracing::warn!("gRPC calls did not finish within the shutdown timeout");
                Ok(())
            }
        };
        self.dispatch.cancel();
        for (name, task) in self.after_server.into_iter().chain(self.with_server) {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "{name} task failed");
            }
        }
        // One bound for all of them: they drain at once.
        let deadline = tokio::time::Instant::now() + self.shutdown_timeout;
        for (name, task) in self.http {
            match tokio::time::timeout_at(deadline, task).await {
                Ok(Err(e)) => tracing::error!(error = %e, "{name} task failed"),
                Ok(Ok(())) => {}
                Err(_) => {
                    tracing::warn!("{name} requests did not finish within the shutdown timeout")
                }
            }
        }
        served
    }
}
