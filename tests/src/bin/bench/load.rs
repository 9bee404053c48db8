//! The two load generators and the latency summary.
//!
//! - [`closed_loop`]: N callers, each issuing its next call as soon as the previous one returns.
//!   It finds the maximum throughput; its latencies are not a latency figure (a slow reply also
//!   slows the offered load, which hides the slowness).
//! - [`open_loop`]: a fixed offered rate. Call i is due at `t0 + i / rate` whether or not earlier
//!   calls have returned, and its latency is measured from that due time, not from when the
//!   generator got round to sending it. So a stall anywhere (the service, or this process being
//!   starved of CPU) shows up in the tail instead of silently lowering the load
//!   ("coordinated omission").
//!
//! Every call has a timeout, so a hung service ends a figure with an error instead of hanging
//! the bench.

use std::future::Future;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::task::JoinSet;

/// Longest any single call may take before it counts as failed.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The part of a run that counts: calls before `warmup` has passed warm caches, connections and
/// the SQLite page cache, and are left out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub warmup: Duration,
    pub measure: Duration,
}

/// Latency percentiles in milliseconds (nearest rank on the sorted samples).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Percentiles {
    pub(crate) fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        let at = |q: f64| -> f64 {
            if samples.is_empty() {
                return 0.0;
            }
            // Nearest rank: the smallest sample with at least q of the samples at or below it.
            // (The epsilon keeps 0.99 * 100 = 99.000...01 from rounding up to rank 100.)
            let rank = (q * samples.len() as f64 - 1e-9).ceil() as usize;
            let index = rank.clamp(1, samples.len()) - 1;
            samples[index].as_secs_f64() * 1000.0
        };
        Self {
            count: samples.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            p999: at(0.999),
            max: at(1.0),
        }
    }

    pub(crate) fn to_json(self) -> Value {
        json!({
            "count": self.count,
            "p50_ms": self.p50,
            "p90_ms": self.p90,
            "p99_ms": self.p99,
            "p999_ms": self.p999,
            "max_ms": self.max,
        })
    }
}

/// What a closed loop measured.
#[derive(Debug)]
pub(crate) struct ClosedLoop {
    /// Calls that completed inside the measured window.
    pub completed: u64,
    /// Calls per second over the measured window.
    pub rate: f64,
    /// Service time of calls that started and ended inside the window (informational only).
    pub latency: Percentiles,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl ClosedLoop {
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "completed": self.completed,
            "rate_per_s": self.rate,
            "service_time": self.latency.to_json(),
            "errors": self.errors,
            "first_error": self.first_error,
        })
    }
}

/// Runs `clients.len()` callers in a closed loop for `window.warmup + window.measure`; caller i
/// uses `clients[i]` (cloned per call, which for a tonic client shares its connection).
pub(crate) async fn closed_loop<C, F, Fut>(clients: Vec<C>, window: Window, call: F) -> ClosedLoop
where
    C: Clone + Send + 'static,
    F: Fn(C) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let started = Instant::now();
    let measure_from = started + window.warmup;
    let end = measure_from + window.measure;
    let mut callers = JoinSet::new();
    for client in clients {
        let call = call.clone();
        callers.spawn(async move {
            let mut caller = CallerTally::default();
            loop {
                let began = Instant::now();
                if began >= end {
                    break;
                }
                let result = tokio::time::timeout(CALL_TIMEOUT, call(client.clone())).await;
                let done = Instant::now();
                match result {
                    Ok(Ok(())) => {
                        if done >= measure_from && done <= end {
                            caller.completed += 1;
                            if began >= measure_from {
                                caller.latencies.push(done - began);
                            }
                        }
                    }
                    Ok(Err(error)) => caller.error(error),
                    Err(_) => caller.error(format!("no answer within {CALL_TIMEOUT:?}")),
                }
            }
            caller
        });
    }
    let mut total = CallerTally::default();
    while let Some(caller) = callers.join_next().await {
        match caller {
            Ok(caller) => total.merge(caller),
            Err(e) => total.error(format!("caller task failed: {e}")),
        }
    }
    ClosedLoop {
        completed: total.completed,
        rate: total.completed as f64 / window.measure.as_secs_f64(),
        latency: Percentiles::of(total.latencies),
        errors: total.errors,
        first_error: total.first_error,
    }
}

#[derive(Default)]
struct CallerTally {
    completed: u64,
    latencies: Vec<Duration>,
    errors: u64,
    first_error: Option<String>,
}

impl CallerTally {
    fn error(&mut self, error: String) {
        self.errors += 1;
        self.first_error.get_or_insert(error);
    }

    fn merge(&mut self, other: CallerTally) {
        self.completed += other.completed;
        self.latencies.extend(other.latencies);
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// One call of an open loop.
#[derive(Debug)]
pub(crate) struct Sample<T> {
    /// When the call was due (not when it was sent).
    pub due: Instant,
    /// When its answer arrived.
    pub done: Instant,
    pub value: T,
}

/// What an open loop measured.
#[derive(Debug)]
pub(crate) struct OpenLoop<T> {
    pub started: Instant,
    /// Successful calls, in due order.
    pub samples: Vec<Sample<T>>,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Latest the generator sent a call after its due time: how far this process itself fell
    /// behind (already part of every latency; reported so a starved generator is visible).
    pub max_send_lag: Duration,
}

impl<T> OpenLoop<T> {
    /// Latencies (due → answer) of calls due at or after `from` (relative to the start).
    pub(crate) fn latencies_after(&self, from: Duration) -> Percentiles {
        let from = self.started + from;
        Percentiles::of(
            self.samples
                .iter()
                .filter(|s| s.due >= from)
                .map(|s| s.done - s.due)
                .collect(),
        )
    }
}

/// Offers `rate` calls per second for `duration`, round-robin over `clients`, and waits for
/// every answer.
pub(crate) async fn open_loop<C, T, F, Fut>(
    clients: Vec<C>,
    rate: f64,
    duration: Duration,
    call: F,
) -> OpenLoop<T>
where
    C: Clone + Send + 'static,
    T: Send + 'static,
    F: Fn(C) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, String>> + Send + 'static,
{
    let total = (rate * duration.as_secs_f64()).round() as u64;
    let started = Instant::now();
    let due = |i: u64| started + Duration::from_secs_f64(i as f64 / rate);
    let mut calls = JoinSet::new();
    let mut max_send_lag = Duration::ZERO;
    let mut next = 0u64;
    while next < total && !clients.is_empty() {
        let now = Instant::now();
        // Send everything that is due; if this task was late, several calls go at once, each
        // still timed from its own due time.
        while next < total && due(next) <= now {
            let at = due(next);
            max_send_lag = max_send_lag.max(now - at);
            let client = clients[(next % clients.len() as u64) as usize].clone();
            let request = call(client);
            calls.spawn(async move {
                let result = tokio::time::timeout(CALL_TIMEOUT, request).await;
                (at, Instant::now(), result)
            });
            next += 1;
        }
        if next < total {
            tokio::time::sleep_until(due(next).into()).await;
        }
    }
    let mut samples = Vec::with_capacity(total as usize);
    let mut errors = 0;
    let mut first_error = None;
    while let Some(joined) = calls.join_next().await {
        let failure = match joined {
            Ok((due, done, Ok(Ok(value)))) => {
                samples.push(Sample { due, done, value });
                continue;
            }
            Ok((_, _, Ok(Err(error)))) => error,
            Ok((_, _, Err(_))) => format!("no answer within {CALL_TIMEOUT:?}"),
            Err(e) => format!("call task failed: {e}"),
        };
        errors += 1;
        first_error.get_or_insert(failure);
    }
    samples.sort_by_key(|s| s.due);
    OpenLoop {
        started,
        samples,
        errors,
        first_error,
        max_send_lag,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples = (1..=100).map(Duration::from_millis).collect();
        let p = Percentiles::of(samples);
        assert_eq!(p.count, 100);
        assert_eq!(p.p50, 50.0);
        assert_eq!(p.p99, 99.0);
        assert_eq!(p.max, 100.0);
        assert_eq!(Percentiles::of(Vec::new()).count, 0);
    }
}
