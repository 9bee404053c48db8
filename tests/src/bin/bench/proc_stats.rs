//! What the bench reads about processes and the machine: resident memory from
//! `/proc/PID/status`, CPU time from `/proc/PID/stat` (so each figure can say which process
//! burned the two cores), the database server's processes that serve central (found through
//! `/proc/net/tcp`, when central runs on MS SQL on this machine), and the facts recorded with
//! the results (cores, rustc, git commit, the file system the databases live on).
//!
//! Linux only, like the figures themselves; a missing fact is recorded as unknown, never guessed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use serde_json::{Value, json};

/// Resident memory of one process, in KiB as the kernel reports it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Memory {
    /// VmRSS: what the targets are about.
    pub rss_kib: u64,
    /// VmHWM: the peak RSS since the process started.
    pub peak_kib: u64,
    /// RssAnon and RssFile split VmRSS into heap/stack and mapped files (the binary, and any
    /// memory-mapped database pages).
    pub anon_kib: u64,
    pub file_kib: u64,
}

impl Memory {
    pub(crate) fn rss_mib(&self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }

    pub(crate) fn to_json(self) -> Value {
        json!({
            "rss_mib": self.rss_kib as f64 / 1024.0,
            "peak_mib": self.peak_kib as f64 / 1024.0,
            "anon_mib": self.anon_kib as f64 / 1024.0,
            "file_mib": self.file_kib as f64 / 1024.0,
        })
    }
}

pub(crate) fn memory(pid: u32) -> Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse().ok())
            .unwrap_or(0)
    };
    let memory = Memory {
        rss_kib: field("VmRSS:"),
        peak_kib: field("VmHWM:"),
        anon_kib: field("RssAnon:"),
        file_kib: field("RssFile:"),
    };
    if memory.rss_kib == 0 {
        return Err(anyhow!("/proc/{pid}/status has no VmRSS"));
    }
    Ok(memory)
}

/// User + system CPU time the process (all its threads) has used so far.
pub(crate) fn cpu_time(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may contain spaces: split after it.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow!("/proc/{pid}/stat is malformed"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 11 and 12 after the ')'.
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .ok_or_else(|| anyhow!("/proc/{pid}/stat is short"))?
            .parse::<u64>()
            .context("/proc/PID/stat field")
    };
    let total = ticks(11)? + ticks(12)?;
    Ok(Duration::from_secs_f64(total as f64 / clock_ticks() as f64))
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every common Linux if that fails).
fn clock_ticks() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        command_output("getconf", &["CLK_TCK"])
            .and_then(|out| out.parse().ok())
            .filter(|ticks| *ticks > 0)
            .unwrap_or(100)
    })
}

/// CPU use of a set of processes over a window: start with [`CpuWindow::start`], finish with
/// [`CpuWindow::cores`]. Processes that cannot be read are left out. Also counts what the rest
/// of the machine used meanwhile (`other`: busy time of all CPUs minus ours; `steal`: time the
/// hypervisor gave to other guests), because another build or test run on the same two cores
/// makes a figure meaningless.
#[derive(Debug)]
pub(crate) struct CpuWindow {
    started: Instant,
    at_start: Vec<(String, u32, Duration)>,
    machine_at_start: Option<MachineCpu>,
    server: Option<ServerWatch>,
}

/// The local database server's processes that serve one client process, counted as `database`.
#[derive(Debug)]
struct ServerWatch {
    client: u32,
    port: u16,
    at_start: HashMap<u32, Duration>,
}

impl CpuWindow {
    pub(crate) fn start(processes: &[(&str, u32)]) -> Self {
        let at_start = processes
            .iter()
            .filter_map(|(name, pid)| Some((name.to_string(), *pid, cpu_time(*pid).ok()?)))
            .collect();
        Self {
            started: Instant::now(),
            at_start,
            machine_at_start: MachineCpu::read(),
            server: None,
        }
    }

    /// Also counts, as `database`, the processes of a database server on this machine that
    /// serve `client`'s connections to local port `port` (one per connection on Babelfish,
    /// which is PostgreSQL). Without this they would be part of `other`, with whatever else
    /// the machine runs, and a figure bound by the server would look disturbed instead. A
    /// connection opened during the window counts from its start; one closed during it is
    /// lost (central's pool keeps its connections, so that is rare). `port = None` (SQLite, or
    /// a server elsewhere) counts nothing.
    pub(crate) fn with_server(mut self, client: u32, port: Option<u16>) -> Self {
        if let Some(port) = port {
            let at_start = server_processes(client, port)
                .into_iter()
                .filter_map(|pid| Some((pid, cpu_time(pid).ok()?)))
                .collect();
            self.server = Some(ServerWatch {
                client,
                port,
                at_start,
            });
        }
        self
    }

    /// Average cores busy per process since the start (1.0 = one core fully busy), plus
    /// `other` and `steal` for the rest of the machine.
    pub(crate) fn cores(&self) -> BTreeMap<String, f64> {
        let wall = self.started.elapsed().as_secs_f64().max(1e-6);
        let mut cores: BTreeMap<String, f64> = self
            .at_start
            .iter()
            .filter_map(|(name, pid, before)| {
                let after = cpu_time(*pid).ok()?;
                let used = after.saturating_sub(*before).as_secs_f64();
                Some((name.clone(), used / wall))
            })
            .collect();
        if let Some(server) = &self.server {
            let used: f64 = server_processes(server.client, server.port)
                .into_iter()
                .chain(server.at_start.keys().copied())
                .collect::<HashSet<u32>>()
                .into_iter()
                .filter_map(|pid| {
                    let after = cpu_time(pid).ok()?;
                    let before = server.at_start.get(&pid).copied().unwrap_or_default();
                    Some(after.saturating_sub(before).as_secs_f64())
                })
                .sum();
            cores.insert("database".into(), used / wall);
        }
        if let (Some(before), Some(after)) = (self.machine_at_start, MachineCpu::read()) {
            let ticks = clock_ticks() as f64;
            let busy = after.busy.saturating_sub(before.busy) as f64 / ticks / wall;
            let ours: f64 = cores.values().sum();
            cores.insert("other".into(), (busy - ours).max(0.0));
            let steal = after.steal.saturating_sub(before.steal) as f64 / ticks / wall;
            cores.insert("steal".into(), steal);
        }
        cores
    }
}

/// Processes on this machine at the other end of `client`'s TCP connections to local port
/// `port`: the database server's sessions working for it. Empty when the server is on another
/// machine, or when `/proc` cannot be read.
pub(crate) fn server_processes(client: u32, port: u16) -> Vec<u32> {
    let ours = socket_inodes(client);
    let table = tcp_table();
    // (local, remote) of each of the client's connections to the port...
    let ends: HashSet<(&str, &str)> = table
        .iter()
        .filter(|c| ours.contains(&c.inode) && port_of(&c.remote) == Some(port))
        .map(|c| (c.local.as_str(), c.remote.as_str()))
        .collect();
    // ... and the server's side of each: the same pair of addresses, the other way round.
    let theirs: HashSet<u64> = table
        .iter()
        .filter(|c| ends.contains(&(c.remote.as_str(), c.local.as_str())))
        .map(|c| c.inode)
        .collect();
    if theirs.is_empty() {
        return Vec::new();
    }
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    processes
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != client && !socket_inodes(*pid).is_disjoint(&theirs))
        .collect()
}

/// One row of `/proc/net/tcp` or `tcp6`: addresses as the kernel writes them (hex `ADDR:PORT`).
#[derive(Debug)]
struct TcpConnection {
    local: String,
    remote: String,
    inode: u64,
}

fn tcp_table() -> Vec<TcpConnection> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    Some(TcpConnection {
                        local: f.get(1)?.to_string(),
                        remote: f.get(2)?.to_string(),
                        inode: f.get(9)?.parse().ok()?,
                    })
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn port_of(address: &str) -> Option<u16> {
    u16::from_str_radix(address.rsplit_once(':')?.1, 16).ok()
}

/// The inodes of the sockets `pid` has open (`/proc/PID/fd/N -> socket:[INODE]`).
fn socket_inodes(pid: u32) -> HashSet<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return HashSet::new();
    };
    fds.filter_map(|fd| {
        let target = std::fs::read_link(fd.ok()?.path()).ok()?;
        target
            .to_str()?
            .strip_prefix("socket:[")?
            .strip_suffix(']')?
            .parse()
            .ok()
    })
    .collect()
}

/// Writes every dirty page to disk (`sync`). Called before a measured window, so writeback left
/// over from preparing files (copies, fixtures) does not land inside it: with ext4's ordered
/// journal, that writeback would slow every fsync the services make.
pub(crate) fn flush_disk() {
    let _ = Command::new("sync").status();
}

/// Machine-wide CPU counters from the first line of `/proc/stat`, in clock ticks.
#[derive(Debug, Clone, Copy)]
struct MachineCpu {
    /// user + nice + system + irq + softirq.
    busy: u64,
    steal: u64,
}

impl MachineCpu {
    fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().next()?.strip_prefix("cpu ")?;
        let f: Vec<u64> = line
            .split_whitespace()
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        Some(Self {
            busy: at(0) + at(1) + at(2) + at(5) + at(6),
            steal: at(7),
        })
    }
}

/// The load average when the bench starts: anything well above zero means something else is
/// using the machine.
pub(crate) fn load_average() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.trim().to_string())
}

/// This process's pid, to include the load generator and the in-process SMTP sink.
pub(crate) fn own_pid() -> u32 {
    std::process::id()
}

/// Facts about the machine and the build, recorded with the results.
pub(crate) fn machine(work_dir: &Path) -> Value {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_string())
        });
    let mem_total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| info.lines().next().map(str::to_string));
    let dirty = command_output("git", &["status", "--porcelain", "--untracked-files=no"])
        .map(|out| !out.is_empty());
    json!({
        "cores": cores,
        "cpu_model": cpu_model,
        "memory": mem_total,
        "kernel": command_output("uname", &["-r"]),
        "load_average_at_start": load_average(),
        "rustc": command_output("rustc", &["--version"]),
        "git_commit": command_output("git", &["rev-parse", "HEAD"]),
        "git_tracked_changes": dirty,
        "work_dir": work_dir.display().to_string(),
        "work_dir_filesystem": command_output("stat", &["-f", "-c", "%T", &work_dir.display().to_string()]),
    })
}

/// Appends 4 KiB to `file` and syncs it; how long the sync took.
fn append_and_sync(file: &mut std::fs::File) -> std::io::Result<Duration> {
    use std::io::Write as _;
    file.write_all(&[0x5a_u8; 4096])?;
    let started = Instant::now();
    file.sync_all()?;
    Ok(started.elapsed())
}

/// Latency of 200 appends of 4 KiB, each followed by fsync, in `dir`: the cost every durable
/// commit pays on this disk at this moment. Recorded before and after the figures, because the
/// fsync-bound figures move with it (a virtual disk's latency varies over time).
pub(crate) fn fsync_probe(dir: &Path) -> Value {
    let path = dir.join("fsync-probe");
    let measure = || -> std::io::Result<Vec<Duration>> {
        let mut file = std::fs::File::create(&path)?;
        let mut times = Vec::with_capacity(200);
        for _ in 0..200 {
            times.push(append_and_sync(&mut file)?);
        }
        Ok(times)
    };
    let result = measure();
    let _ = std::fs::remove_file(&path);
    match result {
        Ok(times) => {
            let p = crate::load::Percentiles::of(times);
            json!({ "p50_ms": p.p50, "p99_ms": p.p99, "max_ms": p.max })
        }
        Err(e) => json!({ "error": e.to_string() }),
    }
}

/// A 4 KiB append and fsync in a directory every [`FsyncWatch::EVERY`] while a figure runs, on
/// a thread of its own: whether the disk stalled during the run (a virtual disk's flushes now
/// and then take hundreds of milliseconds, and every durable commit of the run waits as long).
pub(crate) struct FsyncWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<std::io::Result<Vec<Duration>>>,
    path: std::path::PathBuf,
}

impl FsyncWatch {
    const EVERY: Duration = Duration::from_millis(50);

    pub(crate) fn start(dir: &Path) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let path = dir.join("fsync-watch");
        let thread = std::thread::spawn({
            let stop = std::sync::Arc::clone(&stop);
            let path = path.clone();
            move || {
                let mut file = std::fs::File::create(&path)?;
                let mut times = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    times.push(append_and_sync(&mut file)?);
                    std::thread::sleep(Self::EVERY);
                }
                Ok(times)
            }
        });
        Self { stop, thread, path }
    }

    /// Stops the watch; p50, p99 and max of the fsyncs it timed, and how many took over 50 ms.
    pub(crate) fn finish(self) -> Value {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let result = self.thread.join();
        let _ = std::fs::remove_file(&self.path);
        match result {
            Ok(Ok(times)) if !times.is_empty() => {
                let slow = times.iter().filter(|t| t.as_millis() > 50).count();
                let p = crate::load::Percentiles::of(times);
                json!({ "p50_ms": p.p50, "p99_ms": p.p99, "max_ms": p.max, "over_50_ms": slow })
            }
            Ok(Ok(_)) => json!({ "error": "no fsync timed" }),
            Ok(Err(e)) => json!({ "error": e.to_string() }),
            Err(_) => json!({ "error": "the watch thread panicked" }),
        }
    }
}

/// Trimmed stdout of a successful command, or None.
pub(crate) fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}
