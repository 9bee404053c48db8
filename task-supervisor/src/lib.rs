//! Supervision of a service's long-lived tasks, the way OTP supervisors work: a task that ends
//! before it was told to stop, or panics, is restarted after a pause, counted
//! (`outbox_task_restarts_total{task}`) and logged; one that keeps failing (more than
//! [`MAX_RESTARTS`] restarts within [`RESTART_WINDOW`]) is not restarted again, and the failure
//! travels up: [`NodeFailure`] fires, and the service takes itself out of service (central:
//! health NOT_SERVING, the dispatcher drains and releases its lease so another replica takes
//! over at once; the site-forwarder: health NOT_SERVING, so a pair's standby takes over), its
//! `run` returns an error and the process exits non-zero for its service manager to restart.
//! So there is no state where a node looks healthy, or holds the lease, and does nothing.
//!
//! Both services use it, each registering [`SupervisionMetrics`] in its own registry.
//!
//! A supervised task is started by a factory (`start`), so each restart begins from fresh state
//! built from the same parts; whatever the task keeps across restarts (the recorder's inbox,
//! the lease it holds) lives outside it, in those parts.
//!
//! Debug builds can inject failures ([`FaultPlan`], each service's `test_faults` setting): a
//! planned start panics instead of running the task, so the tests exercise the real restart and
//! give-up paths on a real process. The services refuse the setting in release builds.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Restarts allowed within [`RESTART_WINDOW`] before a task is given up on. Five restarts cover
/// a burst of bad luck (a panic on one odd row, a few times over) without hiding a task that
/// cannot run at all; with the pauses below, such a task takes its node out within about 3 s.
pub const MAX_RESTARTS: usize = 5;
/// The window the restarts are counted in (OTP's "intensity" period).
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);
/// The first pause before a restart; it doubles per restart within the window, up to
/// [`MAX_PAUSE`], so a task failing on every start does not spin.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    task: &'static str,
}

/// The supervisor's series: restarts per task, and which task was given up on. Cheap to clone
/// (the families are shared).
#[derive(Clone, Debug, Default)]
pub struct SupervisionMetrics {
    restarts: Family<TaskLabels, Counter>,
    failed: Family<TaskLabels, Gauge>,
    /// Every task supervised so far, so a watcher can read each one's restarts
    /// ([`Self::restart_counts`]) without knowing the service's task names.
    tasks: Arc<Mutex<BTreeSet<&'static str>>>,
}

impl SupervisionMetrics {
    /// Registers `outbox_task_restarts_total` and `outbox_task_failed` in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "outbox_task_restarts",
            "Supervised long-lived tasks restarted after they ended or panicked, by task",
            self.restarts.clone(),
        );
        registry.register(
            "outbox_task_failed",
            "1 once a supervised task kept failing and was given up on, which takes this node \
             out of service (health NOT_SERVING, a lease released, the process exits)",
            self.failed.clone(),
        );
    }

    /// A task is supervised: its series exist from now on, at zero, so alert rules and
    /// dashboards find them on a healthy node.
    fn supervised(&self, task: &'static str) {
        self.restarts.get_or_create_owned(&TaskLabels { task });
        self.failed.get_or_create_owned(&TaskLabels { task });
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.insert(task);
        }
    }

    /// Each task supervised so far with its restarts, by name: what a watcher samples to see a
    /// task restarting repeatedly below the give-up intensity (central's self-alerts).
    pub fn restart_counts(&self) -> Vec<(&'static str, u64)> {
        let tasks: Vec<&'static str> = match self.tasks.lock() {
            Ok(tasks) => tasks.iter().copied().collect(),
            Err(_) => Vec::new(),
        };
        tasks
            .into_iter()
            .map(|task| (task, self.restarts(task)))
            .collect()
    }

    fn restarted(&self, task: &'static str) {
        self.restarts.get_or_create(&TaskLabels { task }).inc();
    }

    fn given_up(&self, task: &'static str) {
        self.failed.get_or_create(&TaskLabels { task }).set(1);
    }

    /// Restarts counted for `task` so far.
    pub fn restarts(&self, task: &'static str) -> u64 {
        self.restarts.get_or_create(&TaskLabels { task }).get()
    }

    /// Whether `task` was given up on.
    pub fn was_given_up(&self, task: &'static str) -> bool {
        self.failed.get_or_create(&TaskLabels { task }).get() > 0
    }
}

/// Fires once a supervised task was given up on; says which.
#[derive(Clone, Default)]
pub struct NodeFailure {
    token: CancellationToken,
    task: Arc<Mutex<Option<&'static str>>>,
}

impl NodeFailure {
    /// Records `task` as the one given up on (the first one wins) and fires.
    fn fail(&self, task: &'static str) {
        if let Ok(mut first) = self.task.lock() {
            first.get_or_insert(task);
        }
        self.token.cancel();
    }

    /// Resolves once a task was given up on.
    pub async fn failed(&self) {
        self.token.cancelled().await;
    }

    /// The task given up on, if any.
    pub fn task(&self) -> Option<&'static str> {
        self.task.lock().ok().and_then(|t| *t)
    }

    /// A token cancelled at `shutdown` or when this fires, whichever comes first: a service
    /// whose task was given up on stops as it would at shutdown.
    pub fn or_shutdown(&self, shutdown: &CancellationToken) -> CancellationToken {
        let stopping = shutdown.child_token();
        let (failure, fire) = (self.clone(), stopping.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = fire.cancelled() => {}
                () = failure.failed() => {
                    tracing::error!(
                        task = failure.task().unwrap_or("?"),
                        "taking this node out of service: health NOT_SERVING"
                    );
                    fire.cancel();
                }
            }
        });
        stopping
    }
}

/// Starts that fail on purpose, per task name (debug builds only; see the module docs). Parsed
/// from `name=N` (the first N starts fail) or `name=always`, comma-separated.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    planned: Arc<Mutex<HashMap<String, Option<u32>>>>,
}

impl FaultPlan {
    /// Parses a plan; errors say what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut planned = HashMap::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, count) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?}: expected TASK=N or TASK=always"))?;
            let count = match count {
                "always" => None,
                n => Some(
                    n.parse::<u32>()
                        .map_err(|_| format!("{item:?}: {n:?} is not a count"))?,
                ),
            };
            planned.insert(name.to_owned(), count);
        }
        Ok(Self {
            planned: Arc::new(Mutex::new(planned)),
        })
    }

    /// The plan a service's `test_faults` setting asks for: none when unset; refused in release
    /// builds, where fault injection does not exist. The error is for the caller to prefix
    /// with the key.
    pub fn from_setting(setting: Option<&str>) -> Result<Self, String> {
        match setting {
            None => Ok(Self::default()),
            Some(_) if !cfg!(debug_assertions) => {
                Err("fault injection exists only in debug builds".into())
            }
            Some(plan) => Self::parse(plan),
        }
    }

    /// Whether this start of `task` is to fail (and counts it).
    fn take(&self, task: &str) -> bool {
        let Ok(mut planned) = self.planned.lock() else {
            return false;
        };
        match planned.get_mut(task) {
            Some(None) => true,
            Some(Some(0)) | None => false,
            Some(Some(n)) => {
                *n -= 1;
                true
            }
        }
    }
}

/// Starts and watches supervised tasks; cheap to clone.
#[derive(Clone)]
pub struct Supervisor {
    metrics: SupervisionMetrics,
    failure: NodeFailure,
    faults: FaultPlan,
}

impl Supervisor {
    pub fn new(metrics: SupervisionMetrics, failure: NodeFailure, faults: FaultPlan) -> Self {
        Self {
            metrics,
            failure,
            faults,
        }
    }

    /// What fires when a task is given up on.
    pub fn failure(&self) -> &NodeFailure {
        &self.failure
    }

    /// Runs `start()` as a task named `task` until `stop` is cancelled and it has ended,
    /// restarting it whenever it ends before `stop` or panics (see the module docs). The
    /// returned handle ends when the task ended after `stop`, or was given up on.
    pub fn spawn<F, Fut>(
        &self,
        task: &'static str,
        stop: CancellationToken,
        start: F,
    ) -> JoinHandle<()>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.metrics.supervised(task);
        let this = self.clone();
        tokio::spawn(async move { this.watch(task, stop, start).await })
    }

    /// Runs `task`, which cannot be restarted (it owns state a fresh start could not rebuild,
    /// like the dispatcher's view of its lease), until `stop` is cancelled and it has ended.
    /// If it ends before `stop`, or panics, the node fails at once.
    pub fn spawn_once<Fut>(
        &self,
        task: &'static str,
        stop: CancellationToken,
        run: Fut,
    ) -> JoinHandle<()>
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.metrics.supervised(task);
        let this = self.clone();
        tokio::spawn(async move {
            let ended = AbortOnDrop(tokio::spawn(run)).join().await;
            let panicked = ended.as_ref().is_err_and(tokio::task::JoinError::is_panic);
            // Told to stop, or stopping because another task already took the node out.
            if (stop.is_cancelled() || this.failure.task().is_some()) && !panicked {
                return;
            }
            this.metrics.given_up(task);
            match ended {
                Ok(()) => tracing::error!(
                    task,
                    "a task ended on its own; taking this node out of service"
                ),
                Err(e) => {
                    tracing::error!(task, error = %e, "a task failed; taking this node out of service")
                }
            }
            this.failure.fail(task);
        })
    }

    async fn watch<F, Fut>(self, task: &'static str, stop: CancellationToken, mut start: F)
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut restarts: VecDeque<Instant> = VecDeque::new();
        loop {
            let run = if self.faults.take(task) {
                tokio::spawn(async move { panic!("injected fault (test_faults)") })
            } else {
                tokio::spawn(start())
            };
            // Aborting the supervisor (a drain out of time) aborts the task too.
            let ended = AbortOnDrop(run).join().await;
            // Told to stop, or stopping because another task already took the node out.
            if stop.is_cancelled() || self.failure.task().is_some() {
                if let Err(e) = ended
                    && e.is_panic()
                {
                    self.metrics.restarted(task);
                    tracing::error!(task, error = %e, "a task panicked while stopping");
                }
                return;
            }
            let why = match ended {
                Ok(()) => "ended on its own".to_owned(),
                Err(e) => e.to_string(),
            };
            let now = Instant::now();
            while restarts
                .front()
                .is_some_and(|&at| now.duration_since(at) > RESTART_WINDOW)
            {
                restarts.pop_front();
            }
            if restarts.len() >= MAX_RESTARTS {
                self.metrics.given_up(task);
                tracing::error!(
                    task,
                    reason = %why,
                    restarts = restarts.len(),
                    window = ?RESTART_WINDOW,
                    "a task keeps failing; taking this node out of service"
                );
                self.failure.fail(task);
                return;
            }
            restarts.push_back(now);
            self.metrics.restarted(task);
            let pause = FIRST_PAUSE
                .saturating_mul(1 << (restarts.len() - 1).min(16))
                .min(MAX_PAUSE);
            tracing::error!(task, reason = %why, ?pause, "a task failed; restarting it");
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.failure.failed() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// A task that is aborted when its handle is dropped, so it cannot outlive its supervisor.
struct AbortOnDrop(JoinHandle<()>);

impl AbortOnDrop {
    async fn join(mut self) -> Result<(), tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn supervisor(faults: &str) -> Supervisor {
        Supervisor::new(
            SupervisionMetrics::default(),
            NodeFailure::default(),
            FaultPlan::parse(faults).unwrap(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_panics_is_restarted_and_counted() {
        let sup = supervisor("");
        let starts = Arc::new(AtomicUsize::new(0));
        let stop = CancellationToken::new();
        let handle = sup.spawn("flaky", stop.clone(), {
            let starts = Arc::clone(&starts);
            let stop = stop.clone();
            move || {
                let n = starts.fetch_add(1, Ordering::SeqCst);
                let stop = stop.clone();
                async move {
                    if n < 2 {
                        panic!("bad luck {n}");
                    }
                    stop.cancelled().await;
                }
            }
        });
        while starts.load(Ordering::SeqCst) < 3 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.cancel();
        handle.await.unwrap();
        assert_eq!(starts.load(Ordering::SeqCst), 3);
        assert!(sup.failure().task().is_none(), "two restarts are tolerated");
        assert_eq!(sup.metrics.restarts("flaky"), 2);
        assert_eq!(sup.metrics.restart_counts(), vec![("flaky", 2)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_keeps_failing_fires_the_node_failure() {
        let sup = supervisor("doomed=always");
        let stop = CancellationToken::new();
        let handle = sup.spawn("doomed", stop.clone(), || async {});
        sup.failure().failed().await;
        handle.await.unwrap();
        assert_eq!(sup.failure().task(), Some("doomed"));
        assert_eq!(sup.metrics.restarts("doomed"), MAX_RESTARTS as u64);
        assert!(sup.metrics.was_given_up("doomed"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_ends_on_its_own_is_restarted_and_one_told_to_stop_is_not() {
        let sup = supervisor("");
        let starts = Arc::new(AtomicUsize::new(0));
        let stop = CancellationToken::new();
        let handle = sup.spawn("returns", stop.clone(), {
            let starts = Arc::clone(&starts);
            let stop = stop.clone();
            move || {
                let n = starts.fetch_add(1, Ordering::SeqCst);
                let stop = stop.clone();
                async move {
                    if n == 0 {
                        return;
                    }
                    stop.cancelled().await;
                }
            }
        });
        while starts.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.cancel();
        handle.await.unwrap();
        assert_eq!(starts.load(Ordering::SeqCst), 2, "no start after stop");
    }

    #[test]
    fn fault_plans_are_parsed_and_counted() {
        let plan = FaultPlan::parse("channel.email=2, recorder=always").unwrap();
        assert!(plan.take("channel.email"));
        assert!(plan.take("channel.email"));
        assert!(!plan.take("channel.email"));
        assert!(plan.take("recorder") && plan.take("recorder"));
        assert!(!plan.take("lease"));
        assert!(FaultPlan::parse("x").is_err());
        assert!(FaultPlan::parse("x=lots").is_err());
    }
}
