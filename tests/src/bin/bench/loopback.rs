//! The `loopback` figures: central's dispatch against a plain C SMTP client on the same sink,
//! as issue 26 item 3 asks (CPU per delivery on loopback). Both sides send to Postfix's
//! `smtp-sink` (a single-threaded C server that accepts and discards), each to a fresh one on
//! its own port:
//!
//! 1. Postfix's `smtp-source -d -s 4`: four persistent connections (`-d`: the next message on
//!    the same connection, nothing in between), one command at a time (it does not pipeline),
//!    `N` messages.
//! 2. Central on `N` Pending rows (as the dispatch figure: `add_pending_rows`, default keys,
//!    `max_concurrent_connections = 4` written out so both sides use four connections), every
//!    attempt recorded in the database before and after its send as always.
//!
//! Both send the same message: before the first run, central delivers one row to the bench's
//! own sink ([`SmtpSink`]) and that mail (headers and body, as central formats it) becomes
//! `smtp-source -F`'s file, with as many recipients (`-r`) as central's envelope had and
//! central's sender (`-f`). smtp-source appends CRLF to each line of the file and dot-stuffs,
//! so the bytes after DATA are central's; the JSON records the message size and recipients
//! (`sample`).
//!
//! Each side is timed by the sink: `smtp-sink -c` prints a counter at every message, which a
//! thread here reads as it comes; the rate is (N − 1) over the time from the first message to
//! the last, as the dispatch figure. The CPU each process used between those two moments,
//! divided by the messages, is its CPU per delivery; the ratio of the two rates is the figure
//! the issue sets a target on (≥ 0.5). The tools come from Debian's `postfix` package
//! (`make bench` installs it when missing: `tests/install-system-tools.sh bench`).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use outbox_tests::smtp_sink::SmtpSink;
use serde_json::json;
use tokio::sync::OnceCell;

use crate::central_figures::{log_json, wait_for_deliveries};
use crate::proc_stats::{CpuWindow, cpu_time, flush_disk, own_pid};
use crate::report::RunRecord;
use crate::rig::Rig;
use crate::round_trips::SMTP_CONNECTIONS;
use crate::services::{self, Service};

/// The issue's target: central at least half of smtp-source's rate.
pub(crate) const TARGET_RATIO: f64 = 0.5;

/// Where Debian puts Postfix's test tools, searched after `PATH` (a non-root `PATH` often lacks
/// the sbin directories).
const SBIN: [&str; 2] = ["/usr/sbin", "/usr/local/sbin"];

/// central's mail, captured once per bench process (see the module doc).
static SAMPLE: OnceCell<Sample> = OnceCell::const_new();

#[derive(Debug)]
struct Sample {
    /// What the `-F` file holds: the message's lines, LF-terminated (smtp-source sends each
    /// with CRLF).
    lines: String,
    mail_from: String,
    recipients: Vec<String>,
    /// The message as sent after DATA, without the final `.` line, in bytes.
    bytes: usize,
}

/// smtp-source, then central, each against its own smtp-sink; one run.
pub(crate) async fn loopback(rig: &mut Rig) -> Result<RunRecord> {
    let source = tool("smtp-source")?;
    let sink = tool("smtp-sink")?;
    let sample = SAMPLE
        .get_or_try_init(|| capture_sample(rig))
        .await
        .context("capturing the message central sends")?;
    let rows = rig.sizes.loopback_rows.max(2);
    let deadline = rig
        .sizes
        .dispatch_deadline
        .max(Duration::from_secs_f64(rows as f64 / 500.0));

    let dir = rig.run_dir("loopback-source")?;
    let file = dir.path().join("message.txt");
    std::fs::write(&file, &sample.lines).context("writing smtp-source's message file")?;
    let raw = measure_source(&source, &sink, sample, &file, rows, deadline)
        .context("smtp-source -d against smtp-sink")?;
    drop(dir);
    let central = measure_central(rig, &sink, rows, deadline)
        .await
        .context("central against smtp-sink")?;
    let ratio = central.rate / raw.rate;
    eprintln!(
        "bench: loopback: smtp-source -d {:.0}/s ({:.1} µs CPU per message, sink {:.1}); \
         central {:.0}/s ({:.1} µs CPU per delivery, sink {:.1}); ratio {ratio:.2}",
        raw.rate, raw.client_us, raw.sink_us, central.rate, central.client_us, central.sink_us,
    );
    let mut cores = BTreeMap::new();
    for (prefix, m) in [("source:", &raw), ("central:", &central)] {
        for (process, c) in &m.cores {
            cores.insert(format!("{prefix}{process}"), *c);
        }
    }
    // The table's `other` and `steal` are the busier window's, so a disturbed half shows.
    for key in ["other", "steal"] {
        let busiest = raw
            .cores
            .get(key)
            .copied()
            .unwrap_or_default()
            .max(central.cores.get(key).copied().unwrap_or_default());
        cores.insert(key.to_string(), busiest);
    }
    Ok(RunRecord::new()
        .value("loopback.central_rate", central.rate)
        .value("loopback.source_rate", raw.rate)
        .value("loopback.ratio", ratio)
        .value("loopback.central_cpu_us", central.client_us)
        .value("loopback.source_cpu_us", raw.client_us)
        .detail(
            "sample",
            json!({
                "message_bytes": sample.bytes,
                "recipients": sample.recipients.len(),
                "mail_from": sample.mail_from,
            }),
        )
        .detail("rows", json!(rows))
        .detail("smtp_connections", json!(SMTP_CONNECTIONS))
        .detail("smtp_source", raw.details)
        .detail("central", central.details)
        .cpu(cores))
}

/// What one side measured.
struct Side {
    rate: f64,
    /// CPU of the sending process per message, first to last message, in µs.
    client_us: f64,
    /// The sink's, the same way.
    sink_us: f64,
    cores: BTreeMap<String, f64>,
    details: serde_json::Value,
}

fn measure_source(
    source: &Path,
    sink_tool: &Path,
    sample: &Sample,
    file: &Path,
    rows: u64,
    deadline: Duration,
) -> Result<Side> {
    let sink = PostfixSink::start(sink_tool, rows)?;
    let mut command = Command::new(source);
    command
        .arg("-d")
        .args(["-s", &SMTP_CONNECTIONS.to_string()])
        .args(["-m", &rows.to_string()])
        .args(["-r", &sample.recipients.len().to_string()])
        .arg("-F")
        .arg(file)
        .args(["-f", &sample.mail_from])
        .args([
            "-t",
            sample.recipients.first().map_or("x@y.test", String::as_str),
        ])
        .arg(sink.addr.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = KillOnDrop(
        command
            .spawn()
            .with_context(|| format!("cannot start {}", source.display()))?,
    );
    sink.watch(child.0.id());
    let cpu = CpuWindow::start(&[("smtp-source", child.0.id()), ("smtp-sink", sink.pid())]);
    let counted = sink.wait_for(rows, deadline, || Ok(()));
    // Read before smtp-source is reaped: a zombie's /proc entry still has its CPU times.
    let cores = cpu.cores();
    let status = child.0.wait().context("waiting for smtp-source")?;
    let mut stderr = String::new();
    if let Some(mut err) = child.0.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    let counted = counted?;
    if counted.count < rows {
        bail!(
            "the sink counted {} of {rows} messages within {deadline:?}; smtp-source: {status}: {}",
            counted.count,
            stderr.trim()
        );
    }
    // smtp-source exits non-zero on anything but the expected replies.
    if !status.success() {
        bail!("smtp-source: {status}: {}", stderr.trim());
    }
    let side = counted.side(rows, cores);
    Ok(Side {
        details: json!({
            "command": format!(
                "smtp-source -d -s {SMTP_CONNECTIONS} -m {rows} -r {} -F <central's message> \
                 -f {} -t {} 127.0.0.1:<port>",
                sample.recipients.len(),
                sample.mail_from,
                sample.recipients.first().map_or("", String::as_str),
            ),
            "first_to_last_seconds": counted.span().as_secs_f64(),
            "cpu_us_per_message": side.client_us,
            "sink_cpu_us_per_message": side.sink_us,
            "cpu_cores": side.cores,
        }),
        ..side
    })
}

async fn measure_central(
    rig: &mut Rig,
    sink_tool: &Path,
    rows: u64,
    deadline: Duration,
) -> Result<Side> {
    let dir = rig.run_dir("loopback")?;
    let db = rig.central_db(dir.path()).await?;
    db.add_pending_rows(rows).await?;
    let sink = PostfixSink::start(sink_tool, rows)?;
    let toml = services::central_toml_with_smtp(
        services::free_addr()?,
        &db.url(),
        sink.addr,
        &format!("max_concurrent_connections = {SMTP_CONNECTIONS}\n"),
    );
    flush_disk();
    let mut central = Service::central(&rig.bins, dir.path(), "central", &toml).await?;
    sink.watch(central.pid());
    let cpu = CpuWindow::start(&[
        ("central", central.pid()),
        ("smtp-sink", sink.pid()),
        ("bench", own_pid()),
    ])
    .with_server(central.pid(), rig.backend.server_port());
    // The sink is counted on a thread; this only checks now and then that central is alive.
    let counter = Arc::clone(&sink.state);
    let waited = tokio::task::spawn_blocking(move || {
        PostfixSink::wait_on(&counter, rows, deadline, || Ok(()))
    });
    let mut alive = Ok(());
    while !waited.is_finished() {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Err(e) = central.check_alive() {
            alive = Err(e);
            break;
        }
    }
    alive?;
    let counted = waited.await.context("the sink's counter")??;
    let cores = cpu.cores();
    let sessions = rig.backend.sessions_of(central.pid());
    let central_log = central.stop().await?;
    db.finish(&sessions).await;
    if counted.count < rows {
        bail!(
            "the sink counted {} of {rows} deliveries within {deadline:?}",
            counted.count
        );
    }
    let side = counted.side(rows, cores);
    Ok(Side {
        details: json!({
            "first_to_last_seconds": counted.span().as_secs_f64(),
            "cpu_us_per_delivery": side.client_us,
            "sink_cpu_us_per_message": side.sink_us,
            "cpu_cores": side.cores,
            "central_log": log_json(&central_log),
        }),
        ..side
    })
}

/// Central delivers one row to the bench's own sink; its mail is the sample.
async fn capture_sample(rig: &Rig) -> Result<Sample> {
    let dir = rig.run_dir("loopback-sample")?;
    let db = rig.central_db(dir.path()).await?;
    db.add_pending_rows(1).await?;
    let sink = SmtpSink::start().await?;
    let toml = services::central_toml(services::free_addr()?, &db.url(), sink.addr());
    let mut central = Service::central(&rig.bins, dir.path(), "central", &toml).await?;
    wait_for_deliveries(&sink, &mut central, 1, rig.sizes.dispatch_deadline).await?;
    let sessions = rig.backend.sessions_of(central.pid());
    central.stop().await?;
    db.finish(&sessions).await;
    sink.stop();
    let mail = sink
        .messages()
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("central delivered nothing to the sink"))?;
    // `raw` is the content after DATA, CRLF line ends, dot-unstuffed, final line's CRLF kept.
    let bytes = mail.raw.len();
    let lines = mail.raw.replace("\r\n", "\n");
    if lines.contains('\r') {
        bail!("central's message holds a bare CR; smtp-source -F could not send it as is");
    }
    eprintln!(
        "bench: loopback: central's message: {bytes} bytes after DATA, {} recipients, from <{}>",
        mail.rcpt_to.len(),
        mail.mail_from
    );
    Ok(Sample {
        lines,
        mail_from: mail.mail_from,
        recipients: mail.rcpt_to,
        bytes,
    })
}

/// `name` on `PATH` or in the sbin directories.
fn tool(name: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(SBIN.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            anyhow!(
                "{name} not found (Debian package postfix): run `make bench-tools` (as root) or \
                 `sh tests/install-system-tools.sh bench`"
            )
        })
}

/// A child killed and reaped when dropped.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the counter thread saw.
#[derive(Debug, Default)]
struct CounterState {
    count: u64,
    first: Option<Instant>,
    last: Option<Instant>,
    /// The sender's pid, sampled with the sink's at the first and the last message.
    client: Option<u32>,
    target: u64,
    /// The count when CPU was first sampled (the first message, or when the sender became
    /// known if central delivered before it was), with the sender's and the sink's CPU.
    cpu_first: Option<CpuAt>,
    cpu_last: Option<CpuAt>,
    ended: bool,
}

/// The sender's and the sink's CPU time at a count.
#[derive(Debug, Clone, Copy)]
struct CpuAt {
    count: u64,
    client: Duration,
    sink: Duration,
}

/// The counter when a side was done.
struct Counted {
    count: u64,
    first: Option<Instant>,
    last: Option<Instant>,
    cpu_first: Option<CpuAt>,
    cpu_last: Option<CpuAt>,
}

impl Counted {
    fn span(&self) -> Duration {
        match (self.first, self.last) {
            (Some(first), Some(last)) => last - first,
            _ => Duration::ZERO,
        }
    }

    fn side(&self, rows: u64, cores: BTreeMap<String, f64>) -> Side {
        let span = self.span().as_secs_f64().max(1e-9);
        let intervals = rows.saturating_sub(1).max(1) as f64;
        let per = |pick: fn(&CpuAt) -> Duration| match (&self.cpu_first, &self.cpu_last) {
            (Some(a), Some(b)) if b.count > a.count => {
                pick(b).saturating_sub(pick(a)).as_secs_f64() * 1e6 / (b.count - a.count) as f64
            }
            _ => f64::NAN,
        };
        Side {
            rate: intervals / span,
            client_us: per(|c| c.client),
            sink_us: per(|c| c.sink),
            cores,
            details: serde_json::Value::Null,
        }
    }
}

/// `smtp-sink -c` on a free loopback port, its counter read by a thread.
struct PostfixSink {
    child: KillOnDrop,
    addr: std::net::SocketAddr,
    state: Arc<(Mutex<CounterState>, std::sync::Condvar)>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl PostfixSink {
    /// A sink that notes when it has counted `target` messages.
    fn start(tool: &Path, target: u64) -> Result<Self> {
        let addr = services::free_addr()?;
        let mut command = Command::new(tool);
        command.arg("-c");
        // Required when root (it drops to that user after binding), refused otherwise.
        if rustix::process::geteuid().is_root() {
            command.args(["-u", "nobody"]);
        }
        command
            .arg(addr.to_string())
            .arg("1000")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = KillOnDrop(
            command
                .spawn()
                .with_context(|| format!("cannot start {}", tool.display()))?,
        );
        let stdout = child.0.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let sink_pid = child.0.id();
        let state = Arc::new((
            Mutex::new(CounterState {
                target,
                ..CounterState::default()
            }),
            std::sync::Condvar::new(),
        ));
        let shared = Arc::clone(&state);
        let reader = std::thread::spawn(move || read_counter(stdout, sink_pid, &shared));
        // Ready once it accepts a connection.
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            if std::net::TcpStream::connect(addr).is_ok() {
                break;
            }
            if Instant::now() >= until {
                bail!("smtp-sink did not listen on {addr} within 10 s");
            }
            if let Some(status) = child.0.try_wait()? {
                bail!("smtp-sink exited at start: {status}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(Self {
            child,
            addr,
            state,
            reader: Some(reader),
        })
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// Samples `client`'s CPU with the sink's at the first and the last message (from now,
    /// if the first has arrived already).
    fn watch(&self, client: u32) {
        if let Ok(mut state) = self.state.0.lock() {
            state.client = Some(client);
            if state.count >= 1 && state.cpu_first.is_none() {
                state.cpu_first = cpu_at(state.count, Some(client), self.pid());
            }
        }
    }

    fn wait_for(
        &self,
        n: u64,
        deadline: Duration,
        check: impl Fn() -> Result<()>,
    ) -> Result<Counted> {
        Self::wait_on(&self.state, n, deadline, check)
    }

    fn wait_on(
        state: &(Mutex<CounterState>, std::sync::Condvar),
        n: u64,
        deadline: Duration,
        check: impl Fn() -> Result<()>,
    ) -> Result<Counted> {
        let until = Instant::now() + deadline;
        let mut guard = state
            .0
            .lock()
            .map_err(|_| anyhow!("counter lock poisoned"))?;
        loop {
            if guard.count >= n || guard.ended || Instant::now() >= until {
                return Ok(Counted {
                    count: guard.count,
                    first: guard.first,
                    last: guard.last,
                    cpu_first: guard.cpu_first,
                    cpu_last: guard.cpu_last,
                });
            }
            check()?;
            guard = state
                .1
                .wait_timeout(guard, Duration::from_millis(100))
                .map_err(|_| anyhow!("counter lock poisoned"))?
                .0;
        }
    }
}

impl Drop for PostfixSink {
    fn drop(&mut self) {
        let _ = self.child.0.kill();
        let _ = self.child.0.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

fn cpu_at(count: u64, client: Option<u32>, sink: u32) -> Option<CpuAt> {
    Some(CpuAt {
        count,
        client: cpu_time(client?).ok()?,
        sink: cpu_time(sink).ok()?,
    })
}

/// Reads `sess=S quit=Q mesg=M\r` records as smtp-sink writes them, noting when the message
/// count first reaches 1 and the target, and the CPU of the sender and the sink then.
fn read_counter(
    mut stdout: std::process::ChildStdout,
    sink_pid: u32,
    state: &(Mutex<CounterState>, std::sync::Condvar),
) {
    let mut pending = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = match stdout.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let now = Instant::now();
        pending.extend_from_slice(&buf[..n]);
        let mut latest = None;
        while let Some(end) = pending.iter().position(|b| *b == b'\r' || *b == b'\n') {
            let record: Vec<u8> = pending.drain(..=end).collect();
            if let Some(m) = std::str::from_utf8(&record)
                .ok()
                .and_then(|r| r.split_whitespace().find_map(|f| f.strip_prefix("mesg=")))
                .and_then(|m| m.trim().parse::<u64>().ok())
            {
                latest = Some(m);
            }
        }
        let Some(count) = latest else { continue };
        let Ok(mut s) = state.0.lock() else { break };
        if count == s.count {
            continue;
        }
        if s.first.is_none() && count >= 1 {
            s.first = Some(now);
            s.cpu_first = cpu_at(count, s.client, sink_pid);
        }
        s.count = count;
        if s.target > 0 && count >= s.target && s.last.is_none() {
            s.last = Some(now);
            s.cpu_last = cpu_at(count, s.client, sink_pid);
        }
        state.1.notify_all();
    }
    if let Ok(mut s) = state.0.lock() {
        s.ended = true;
    }
    state.1.notify_all();
}
