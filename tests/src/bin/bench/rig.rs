//! The bench's workshop: where the binaries are, the work directory every run gets a fresh
//! subdirectory of, the database central runs on, the empty database templates, the sizes in
//! force, and the large fixtures (a filled site buffer, the million-row files), each built at
//! most once per invocation and shared by all runs of the figures that need them.
//!
//! Invariant: every run starts from a copy (or, for central on MS SQL, a new database), so no
//! run sees what an earlier run left behind.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::backend::{Backend, CentralDb};
use crate::fixtures::{self, CentralRows};
use crate::services::{self, Binaries, Service};

/// Sizes and rates every figure takes from the command line.
#[derive(Debug, Clone)]
pub(crate) struct Sizes {
    pub runs: usize,
    pub warmup: Duration,
    pub measure: Duration,
    pub callers: usize,
    pub send_rate: f64,
    pub forward_rows: u64,
    pub dispatch_rows: u64,
    pub dispatch_deadline: Duration,
    /// Messages per side in the `loopback` figure.
    pub loopback_rows: u64,
    /// The `rtt` figure's rows at each round trip: what the pipelined floor delivers in this
    /// many seconds.
    pub rtt_seconds: f64,
    pub e2e_rate: f64,
    pub e2e_duration: Duration,
    /// How long the `first-minute` figure submits after central starts.
    pub first_minute: Duration,
    pub memory_rows: u64,
    /// The `fresh` figure: site A's backlog at central, the relay's limit (messages a second
    /// and burst), and how long the fresh streams submit.
    pub fresh_backlog: u64,
    pub fresh_rate_limit: f64,
    pub fresh_burst: u32,
    pub fresh_duration: Duration,
    /// Runs of `fresh` that also measure the oldest-first baseline (the first ones).
    pub fresh_baseline_runs: usize,
    /// Delivered rows (each with its attempt) in the `history` figures' database.
    pub history_rows: u64,
    /// Whether the `failover` figure also times a first relay that hangs (not with `--quick`:
    /// it adds the 30 s SMTP timeout to every run).
    pub failover_hung: bool,
}

impl Sizes {
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "runs": self.runs,
            "warmup_s": self.warmup.as_secs_f64(),
            "measure_s": self.measure.as_secs_f64(),
            "callers": self.callers,
            "send_rate_per_s": self.send_rate,
            "forward_rows": self.forward_rows,
            "dispatch_rows": self.dispatch_rows,
            "dispatch_deadline_s": self.dispatch_deadline.as_secs_f64(),
            "loopback_rows": self.loopback_rows,
            "rtt_seconds": self.rtt_seconds,
            "e2e_rate_per_s": self.e2e_rate,
            "e2e_duration_s": self.e2e_duration.as_secs_f64(),
            "first_minute_s": self.first_minute.as_secs_f64(),
            "memory_rows": self.memory_rows,
            "fresh_backlog": self.fresh_backlog,
            "fresh_rate_limit_per_s": self.fresh_rate_limit,
            "fresh_burst": self.fresh_burst,
            "fresh_duration_s": self.fresh_duration.as_secs_f64(),
            "fresh_baseline_runs": self.fresh_baseline_runs,
            "history_rows": self.history_rows,
            "failover_hung": self.failover_hung,
        })
    }
}

/// A site buffer filled through `Send` while central was down.
#[derive(Debug, Clone)]
pub(crate) struct FilledBuffer {
    pub path: PathBuf,
    pub rows: u64,
    /// Sends per second while filling (informational: a long, sustained closed loop).
    pub fill_rate: f64,
}

/// Central's database holding a year of delivered rows (`sizes.history_rows`).
#[derive(Debug, Clone)]
pub(crate) struct HistoryFixture {
    pub path: PathBuf,
    pub build_seconds: f64,
    pub bytes: u64,
}

/// The million-row files of the memory figure.
#[derive(Debug, Clone)]
pub(crate) struct MemoryFixtures {
    pub central: PathBuf,
    pub site: PathBuf,
    pub build_seconds: f64,
}

#[derive(Debug)]
pub(crate) struct Rig {
    pub bins: Binaries,
    pub sizes: Sizes,
    pub backend: Backend,
    pub work: PathBuf,
    keep: bool,
    /// Holds the shared fixtures; removed at the end unless `keep`.
    shared: Option<TempDir>,
    shared_path: PathBuf,
    /// Central's empty SQLite database (on MS SQL every run gets a new database instead).
    central_template: PathBuf,
    pub site_template: PathBuf,
    filled: Option<FilledBuffer>,
    memory: Option<MemoryFixtures>,
    history: Option<HistoryFixture>,
    /// Whether [`Self::central_db`] starts from `history` instead of the empty template.
    with_history: bool,
    /// Memory runs started so far (their Send-rate pairs alternate which goes first).
    memory_runs: usize,
    /// `fresh` runs started so far (only the first ones measure the baseline).
    fresh_runs: usize,
}

impl Rig {
    /// Creates the work directory and the empty templates (each service started once on a new
    /// file and stopped cleanly). On MS SQL, central is started once on a new database instead:
    /// a server that refuses the login or `CREATE DATABASE` fails here, before any figure.
    pub(crate) async fn prepare(
        bins: Binaries,
        sizes: Sizes,
        backend: Backend,
        work: PathBuf,
        keep: bool,
    ) -> Result<Self> {
        std::fs::create_dir_all(&work)
            .with_context(|| format!("creating work directory {}", work.display()))?;
        let shared = tempfile::Builder::new()
            .prefix("shared-")
            .tempdir_in(&work)
            .context("creating the shared fixture directory")?;
        let shared_path = shared.path().to_path_buf();
        let central_template = shared_path.join("central-template.db");
        let site_template = shared_path.join("site-template.db");
        let db = match &backend {
            Backend::Sqlite => CentralDb::Sqlite(central_template.clone()),
            Backend::MsSql { .. } => CentralDb::fresh(&backend, &central_template, &shared_path)
                .await
                .context("trying the MS SQL server")?,
        };
        let toml =
            services::central_toml(services::free_addr()?, &db.url(), services::free_addr()?);
        let central = Service::central(&bins, &shared_path, "template-central", &toml)
            .await
            .context("creating central's empty database")?;
        let sessions = backend.sessions_of(central.pid());
        central.stop().await?;
        db.finish(&sessions).await;
        let toml = services::site_toml(
            services::free_addr()?,
            &site_template,
            services::free_addr()?,
        );
        Service::site(&bins, &shared_path, "template-site", &toml)
            .await
            .context("creating the site's empty buffer")?
            .stop()
            .await?;
        Ok(Self {
            bins,
            sizes,
            backend,
            work,
            keep,
            shared: Some(shared),
            shared_path,
            central_template,
            site_template,
            filled: None,
            memory: None,
            history: None,
            with_history: false,
            memory_runs: 0,
            fresh_runs: 0,
        })
    }

    /// A fresh directory for one run; removed when dropped unless `--keep`.
    pub(crate) fn run_dir(&self, label: &str) -> Result<RunDir> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{label}-"))
            .tempdir_in(&self.work)
            .context("creating a run directory")?;
        Ok(RunDir {
            dir: Some(dir),
            keep: self.keep,
        })
    }

    /// An empty database for one central process (see [`CentralDb::fresh`]); on SQLite, in
    /// `dir`. While [`Self::set_history`] is on, a copy of the year of history instead.
    pub(crate) async fn central_db(&self, dir: &Path) -> Result<CentralDb> {
        match (&self.history, self.with_history) {
            (Some(history), true) => {
                CentralDb::with_history(&self.backend, &history.path, self.sizes.history_rows, dir)
                    .await
            }
            _ => CentralDb::fresh(&self.backend, &self.central_template, dir).await,
        }
    }

    /// Makes every central database the figures ask for start with a year of history (`on`),
    /// or empty again. On SQLite the history file is built on first use and copied for each
    /// database; on MS SQL each database gets its rows written when it is made.
    pub(crate) fn set_history(&mut self, on: bool) -> Result<HistoryFixture> {
        let history = match &self.history {
            Some(history) => history.clone(),
            None => {
                if !matches!(self.backend, Backend::Sqlite) {
                    // Nothing to build once: `CentralDb::with_history` writes the rows.
                    let history = HistoryFixture {
                        path: self.central_template.clone(),
                        build_seconds: 0.0,
                        bytes: 0,
                    };
                    self.history = Some(history.clone());
                    self.with_history = on;
                    return Ok(history);
                }
                let started = Instant::now();
                let path = self.shared_path.join("central-history.db");
                fixtures::copy_db(&self.central_template, &path)?;
                fixtures::add_central_rows(
                    &path,
                    self.sizes.history_rows,
                    CentralRows::YearOfHistory,
                )
                .context("writing a year of history")?;
                let history = HistoryFixture {
                    bytes: std::fs::metadata(&path)?.len(),
                    path,
                    build_seconds: started.elapsed().as_secs_f64(),
                };
                self.history = Some(history.clone());
                history
            }
        };
        self.with_history = on;
        Ok(history)
    }

    /// The site buffer filled with `sizes.forward_rows` Sends, built on first use.
    pub(crate) async fn filled_buffer(&mut self) -> Result<FilledBuffer> {
        if let Some(filled) = &self.filled {
            return Ok(filled.clone());
        }
        let rows = self.sizes.forward_rows;
        let path = self.shared_path.join("site-filled.db");
        fixtures::copy_db(&self.site_template, &path)?;
        let toml = services::site_toml(services::free_addr()?, &path, services::free_addr()?);
        let site = Service::site(&self.bins, &self.shared_path, "fill-site", &toml).await?;
        let fill_rate = crate::site_figures::fill(&site, rows, self.sizes.callers).await;
        site.stop().await?;
        let filled = FilledBuffer {
            path,
            rows,
            fill_rate: fill_rate?,
        };
        self.filled = Some(filled.clone());
        Ok(filled)
    }

    /// Central with `sizes.memory_rows` delivered rows and a site with as many buffered, built
    /// on first use.
    pub(crate) fn memory_fixtures(&mut self) -> Result<MemoryFixtures> {
        if let Some(memory) = &self.memory {
            return Ok(memory.clone());
        }
        let started = Instant::now();
        let rows = self.sizes.memory_rows;
        let central = self.shared_path.join("central-full.db");
        fixtures::copy_db(&self.central_template, &central)?;
        fixtures::add_central_rows(&central, rows, CentralRows::Delivered)
            .context("writing central's rows")?;
        let site = self.shared_path.join("site-full.db");
        fixtures::copy_db(&self.site_template, &site)?;
        fixtures::add_site_rows(&site, rows).context("writing the site's rows")?;
        let memory = MemoryFixtures {
            central,
            site,
            build_seconds: started.elapsed().as_secs_f64(),
        };
        self.memory = Some(memory.clone());
        Ok(memory)
    }

    /// Counts a memory run; returns how many there were before it.
    pub(crate) fn next_memory_run(&mut self) -> usize {
        self.memory_runs += 1;
        self.memory_runs - 1
    }

    /// Counts a `fresh` run; returns how many there were before it.
    pub(crate) fn next_fresh_run(&mut self) -> usize {
        self.fresh_runs += 1;
        self.fresh_runs - 1
    }

    /// Removes the shared fixtures (unless `--keep`), reporting where they are otherwise.
    pub(crate) fn finish(&mut self) {
        if let Some(shared) = self.shared.take() {
            if self.keep {
                let path = shared.keep();
                eprintln!("bench: kept fixtures in {}", path.display());
            } else if let Err(e) = shared.close() {
                eprintln!("bench: could not remove the fixtures: {e}");
            }
        }
    }
}

/// One run's directory.
#[derive(Debug)]
pub(crate) struct RunDir {
    dir: Option<TempDir>,
    keep: bool,
}

impl RunDir {
    pub(crate) fn path(&self) -> &Path {
        self.dir
            .as_ref()
            .map(TempDir::path)
            .unwrap_or(Path::new("."))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take()
            && self.keep
        {
            let path = dir.keep();
            eprintln!("bench: kept {}", path.display());
        }
    }
}

/// Fails unless `got` equals `want`, naming `what`: a figure whose workload was not what it
/// claims must not be reported.
pub(crate) fn check_count(what: &str, got: u64, want: u64) -> Result<()> {
    if got != want {
        bail!("{what}: expected {want}, found {got}");
    }
    Ok(())
}
