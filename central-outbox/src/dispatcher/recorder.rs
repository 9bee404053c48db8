//! The recorder: one task that writes every finished attempt's outcome, fenced by its claim's
//! epoch (see the store). Deliveries hand their records over a bounded channel and free their
//! slot at once, so an outcome write shares a commit with the claim of the row that takes the
//! slot instead of the two waiting for one commit each in turn.
//!
//! At most [`WRITES`] writes are under way, each taking every record that arrived while the
//! others wrote: one store call per group, not per delivery, which is what a server that spends
//! more on a call than on a row (MS SQL, above all Babelfish) needs to keep up. The task ends
//! once every sender is gone and every record received is written.
//!
//! A write that fails (the database unreachable, its disk full) is tried again, backing off,
//! for up to one claim timeout. Retrying is always safe: each outcome is fenced by its own
//! claim (epoch and attempt number), so it applies only if nobody has claimed the row again
//! since. And it avoids a duplicate mail: an outcome never recorded leaves the row to be
//! delivered again once its claim expires.
//!
//! It runs supervised (`crate::supervisor`): its inbox lives outside any one run, so a run
//! restarted after a panic takes up the records still queued. A write that panics costs only
//! its own records (counted as unrecorded, due again when their claims expire).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;

use super::caught;
use super::lease::DISPATCHER_LEASE;
use crate::metrics::Metrics;
use crate::records::AttemptRecord;
use crate::store::{DispatchStore, StoreError};

/// Outcome writes under way at most. Two: one can be committing while the next gathers what
/// finished meanwhile, without a dozen small writes competing for the database.
const WRITES: usize = 2;

/// Records waiting for a write at most. Each delivery sends one record when it finishes, so
/// this bounds only a burst of finishes while both writes are slow; a delivery waits (holding
/// no slot) when it is full.
const BACKLOG: usize = 4096;

/// Most records one write takes.
const PER_WRITE: usize = 1024;

/// The first pause before a failed write is tried again; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Where the channel loops send records, and where the recorder takes them from. The inbox
/// outlives any one run of the recorder: a run restarted by the supervisor takes up the same
/// inbox, so records queued when a run failed are written by the next.
pub(super) type Inbox = Arc<tokio::sync::Mutex<mpsc::Receiver<AttemptRecord>>>;

/// A new outbox for finished attempts: the channel loops' handle, and the recorder's inbox.
pub(super) fn channel() -> (RecorderHandle, Inbox) {
    let (records, received) = mpsc::channel(BACKLOG);
    (
        RecorderHandle { records },
        Arc::new(tokio::sync::Mutex::new(received)),
    )
}

/// The recorder as the channel loops and their deliveries see it: where records are handed
/// over, and how many wait for a write. The recorder ends once every handle is dropped and
/// what they handed over is written.
#[derive(Debug, Clone)]
pub(super) struct RecorderHandle {
    records: mpsc::Sender<AttemptRecord>,
}

/// The recorder is gone (a drain that ran out of time): a record not handed over leaves its
/// row due again when its claim expires.
#[derive(Debug)]
pub(super) struct RecorderGone;

impl RecorderHandle {
    /// Hands `record` over, waiting (holding no slot) while the backlog is full.
    pub(super) async fn send(&self, record: AttemptRecord) -> Result<(), RecorderGone> {
        self.records.send(record).await.map_err(|_| RecorderGone)
    }

    /// Hands `records` over in order, stopping at the first that cannot be (the rest are
    /// then not handed over either: the recorder is gone).
    pub(super) async fn send_all(&self, records: Vec<AttemptRecord>) -> Result<(), RecorderGone> {
        for record in records {
            self.send(record).await?;
        }
        Ok(())
    }

    /// Records handed over and not yet taken by a write: how far the database is behind the
    /// deliveries (at most [`BACKLOG`]).
    pub(super) fn backlog(&self) -> usize {
        self.records.max_capacity() - self.records.capacity()
    }
}

/// One run of the recorder: writes what arrives in `inbox` until every sender is gone and
/// all it received is written. A write that panics (a bug in a store) costs only its own
/// records: they are counted as unrecorded, and their rows are due again when their claims
/// expire.
pub(super) async fn run<S: DispatchStore>(
    store: Arc<S>,
    metrics: Arc<Metrics>,
    claim_timeout: Duration,
    inbox: Inbox,
    recorded: Arc<[Arc<Notify>]>,
) {
    let mut received = inbox.lock_owned().await;
    let mut writes = JoinSet::new();
    let mut open = true;
    loop {
        tokio::select! {
            biased;
            Some(written) = writes.join_next(), if !writes.is_empty() => {
                if let Err(e) = written
                    && e.is_panic()
                {
                    tracing::error!(error = %e, "an outcome write panicked");
                }
            }
            batch = next_batch(&mut received), if open && writes.len() < WRITES => {
                match batch {
                    Some(batch) => {
                        writes.spawn(record_outcomes(
                            Arc::clone(&store),
                            Arc::clone(&metrics),
                            batch,
                            claim_timeout,
                            Arc::clone(&recorded),
                        ));
                    }
                    None => open = false,
                }
            }
            else => break,
        }
    }
}

/// Every record waiting now (at least one); `None` once the channel is closed and empty.
async fn next_batch(received: &mut mpsc::Receiver<AttemptRecord>) -> Option<Vec<AttemptRecord>> {
    let mut batch = Vec::new();
    (received.recv_many(&mut batch, PER_WRITE).await > 0).then_some(batch)
}

/// Writes finished attempts' outcomes in one store call, each fenced by its claim epoch; a
/// failed call is tried again for up to `retry_for` (see the module documentation).
async fn record_outcomes<S: DispatchStore>(
    store: Arc<S>,
    metrics: Arc<Metrics>,
    records: Vec<AttemptRecord>,
    retry_for: Duration,
    recorded: Arc<[Arc<Notify>]>,
) {
    let ids: Vec<_> = records
        .iter()
        .map(|r| (r.id, r.transition.status))
        .collect();
    let written = caught::store_call(
        "the outcome write",
        write_retrying(&*store, &metrics, records, retry_for),
    )
    .await;
    match written {
        Ok(applied) => {
            if applied.iter().any(|&a| a) {
                for bell in recorded.iter() {
                    bell.notify_one();
                }
            }
            for ((id, status), applied) in ids.into_iter().zip(applied) {
                if applied {
                    tracing::debug!(%id, %status, "attempt recorded");
                } else {
                    tracing::warn!(
                        %id,
                        "attempt outcome not recorded: the claim or lease was lost meanwhile"
                    );
                }
            }
        }
        Err(e) => {
            metrics.outcomes_unrecorded(ids.len() as u64);
            for (id, _) in ids {
                tracing::error!(
                    %id,
                    error = %e,
                    "cannot record the attempt; the row becomes due again after its claim expires"
                );
            }
        }
    }
}

/// One store call, tried again after a failure (pausing [`FIRST_PAUSE`], doubling up to
/// [`MAX_PAUSE`]) until it answers or `retry_for` has passed since the first try.
async fn write_retrying<S: DispatchStore>(
    store: &S,
    metrics: &Metrics,
    records: Vec<AttemptRecord>,
    retry_for: Duration,
) -> Result<Vec<bool>, StoreError> {
    let give_up_at = Instant::now() + retry_for;
    let mut pause = FIRST_PAUSE;
    loop {
        let failure = match store
            .record_outcomes(DISPATCHER_LEASE, records.clone())
            .await
        {
            Ok(applied) => return Ok(applied),
            Err(e) => e,
        };
        metrics.outcome_write_failed();
        if Instant::now() + pause >= give_up_at {
            return Err(failure);
        }
        tracing::warn!(
            records = records.len(),
            error = %failure,
            "cannot record attempts yet; trying again"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}
