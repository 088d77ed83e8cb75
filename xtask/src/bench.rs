//! `cargo xtask bench`: lock throughput and latency of a real 3-node cluster.
//!
//! It builds `fencelockd` and `fencelock-bench` in release, measures fsync on
//! the temporary directory the servers' data goes to, and then, for each
//! workload, starts a fresh 3-node cluster on free 127.0.0.1 ports (fsync on,
//! data on disk), waits for a leader, runs the load generator as its own
//! process, and stops the servers with SIGTERM so that each logs its
//! counters (entries applied, synced writes). The table goes to stdout, the
//! whole record to `target/bench/bench-<unix time>.json` and
//! `target/bench/latest.json`.
//!
//! A benchmark measures and never judges: the target column says whether a
//! figure met the issue's target, and nothing fails on it. The task fails
//! only when a workload could not run at all.
//!
//! `--perf` also records a system-wide `perf` profile of each workload's
//! measured window (`target/bench/perf-<workload>.data`) and counts each
//! server's syscalls in it.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use fencelock_launch::{Cluster, ClusterSpec, TLS_USER};
use serde_json::{json, Value};

use crate::cargo;

/// The servers' counters, logged once at a clean stop.
const STOPPED_MESSAGE: &str = "fencelockd stopped";

/// How long a stopping server may take (it lets requests finish for 5 s).
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The syscalls counted per server with `--perf`.
const SYSCALLS: &[&str] = &["fdatasync", "fsync", "pwrite64", "sendto", "recvfrom", "futex"];

/// `cargo xtask bench`'s flags, as given.
#[derive(Clone, Debug, clap::Args)]
#[command(after_help = format!("Workloads: {}", workload_names()))]
pub struct Options {
    /// 3 s per workload instead of 10 (the later of --quick and --duration wins)
    #[arg(long, overrides_with = "duration")]
    quick: bool,
    /// Measured time per workload: 10, 10s or 2.5s [default: 10]
    #[arg(long, value_name = "SECS", value_parser = parse_duration, overrides_with = "quick")]
    duration: Option<Duration>,
    /// Load before the measured time, not counted
    #[arg(long, value_name = "SECS", value_parser = parse_seconds, default_value = "1")]
    warmup: Duration,
    /// Comma-separated workloads to run (default: all)
    #[arg(long, value_name = "NAMES", value_parser = parse_only)]
    only: Option<WorkloadNames>,
    /// Also record a system-wide perf profile of each workload's measured time
    #[arg(long)]
    perf: bool,
    /// How the generator drives the lock workloads' connections: one event
    /// loop (events) or a fencelock-client and thread each (threads)
    #[arg(long, value_name = "events|threads", value_parser = parse_generator, default_value = "events")]
    generator: String,
    /// Also run each workload on a cluster speaking TLS on both ports (its
    /// clients too), right after the plain run, and compare the two
    #[arg(long)]
    tls: bool,
}

/// The names `--only` gave, each a workload's.
#[derive(Clone, Debug, PartialEq)]
struct WorkloadNames(Vec<String>);

/// What a run is asked to do, once the flags are read.
#[derive(Clone, Debug, PartialEq)]
struct Plan {
    duration: Duration,
    warmup: Duration,
    /// Workload names to run; empty runs them all.
    only: Vec<String>,
    perf: bool,
    /// How the generator drives the lock workloads' connections: `events`
    /// (one event loop) or `threads` (a `fencelock-client` and thread each).
    generator: String,
    /// Each workload again over TLS.
    tls: bool,
}

impl Options {
    fn plan(self) -> Plan {
        let duration = match (self.quick, self.duration) {
            (true, _) => Duration::from_secs(3),
            (false, Some(duration)) => duration,
            (false, None) => Duration::from_secs(10),
        };
        Plan {
            duration,
            warmup: self.warmup,
            only: self.only.map(|names| names.0).unwrap_or_default(),
            perf: self.perf,
            generator: self.generator,
            tls: self.tls,
        }
    }
}

impl Plan {
    fn selected(&self) -> impl Iterator<Item = &'static Workload> + '_ {
        WORKLOADS
            .iter()
            .filter(|workload| self.only.is_empty() || self.only.iter().any(|name| name == workload.name))
    }
}

/// `--duration`: seconds as [`parse_seconds`] reads them, and more than none.
fn parse_duration(text: &str) -> Result<Duration> {
    let duration = parse_seconds(text)?;
    if duration.is_zero() {
        bail!("--duration must be positive");
    }
    Ok(duration)
}

fn parse_only(text: &str) -> Result<WorkloadNames> {
    let names: Vec<String> = text.split(',').map(|name| name.trim().to_owned()).collect();
    for name in &names {
        if !WORKLOADS.iter().any(|workload| workload.name == name) {
            bail!("no workload `{name}`; there are: {}", workload_names());
        }
    }
    Ok(WorkloadNames(names))
}

fn parse_generator(text: &str) -> Result<String> {
    if !["events", "threads"].contains(&text) {
        bail!("--generator is `events` or `threads`, not `{text}`");
    }
    Ok(text.to_owned())
}

/// `10`, `10s` or `2.5s`.
fn parse_seconds(text: &str) -> Result<Duration> {
    let number = text.strip_suffix('s').unwrap_or(text);
    let seconds: f64 = number.parse().with_context(|| format!("`{text}` is not a number of seconds"))?;
    if !(0.0..=3600.0).contains(&seconds) {
        bail!("{seconds} s is not between 0 and an hour");
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// One row of the table: a load generator run on a fresh cluster.
#[derive(Debug)]
struct Workload {
    name: &'static str,
    label: &'static str,
    clients: usize,
    /// The generator's flags besides endpoints, clients and times.
    flags: &'static [&'static str],
    target: Target,
}

/// The issue's targets, for the table's last column.
#[derive(Clone, Copy, Debug)]
enum Target {
    None,
    Cycles(f64),
    CyclesAndAcquireP99(f64, u64),
    CyclesAndFifo(f64),
}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "distinct-1",
        label: "distinct keys",
        clients: 1,
        flags: &["--workload", "distinct"],
        target: Target::Cycles(1_000.0),
    },
    Workload {
        name: "distinct-8",
        label: "distinct keys",
        clients: 8,
        flags: &["--workload", "distinct"],
        target: Target::None,
    },
    Workload {
        name: "distinct-64",
        label: "distinct keys",
        clients: 64,
        flags: &["--workload", "distinct"],
        target: Target::CyclesAndAcquireP99(20_000.0, 10_000),
    },
    Workload {
        name: "distinct-256",
        label: "distinct keys",
        clients: 256,
        flags: &["--workload", "distinct"],
        target: Target::Cycles(25_000.0),
    },
    Workload {
        name: "hot-key-64",
        label: "one hot key, waiting",
        clients: 64,
        // Short leases, so that a lost release stalls the key briefly.
        flags: &["--workload", "hot-key", "--lease", "10s", "--wait", "10s"],
        target: Target::CyclesAndFifo(3_000.0),
    },
    Workload {
        name: "renew-10k",
        label: "renewals, 10,000 locks held",
        clients: 8,
        // Leases far longer than the run, so that none expires under load.
        flags: &["--workload", "renew", "--locks", "10000", "--lease", "120s"],
        target: Target::None,
    },
];

fn workload_names() -> String {
    WORKLOADS.iter().map(|workload| workload.name).collect::<Vec<_>>().join(", ")
}

pub fn run(root: &Path, options: Options) -> Result<()> {
    let options = options.plan();
    cargo(root, &["build", "--release", "--bin", "fencelockd", "--bin", "fencelock-bench"])?;
    let target_dir = target_dir(root);
    let server = target_dir.join("release").join("fencelockd");
    let generator = target_dir.join("release").join("fencelock-bench");
    let out_dir = target_dir.join("bench");
    fs::create_dir_all(&out_dir).with_context(|| format!("cannot create {}", out_dir.display()))?;
    let temp = tempfile::Builder::new()
        .prefix("fencelock-bench-")
        .tempdir()
        .context("cannot make a temporary directory")?;

    let started_unix = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    eprintln!("xtask bench: measuring fsync in {}", temp.path().display());
    let fsync = generator_json(&generator, &["fsync", "--dir", &temp.path().display().to_string()])?;
    let wakeup = generator_json(&generator, &["wakeup"])?;

    let mut results = Vec::new();
    let mut failed = Vec::new();
    let modes: &[bool] = if options.tls { &[false, true] } else { &[false] };
    for workload in options.selected() {
        for &tls in modes {
            let name = if tls { format!("{}+tls", workload.name) } else { workload.name.to_owned() };
            eprintln!("xtask bench: {name} ({} clients)", workload.clients);
            let dir = temp.path().join(&name);
            match run_workload(&server, &generator, &dir, &out_dir, workload, &options, tls) {
                Ok(result) => results.push(result),
                Err(err) => {
                    eprintln!("xtask bench: {name} failed: {err:#}");
                    failed.push(name.clone());
                    results.push(
                        json!({"name": name, "label": label_of(workload, tls), "error": format!("{err:#}")}),
                    );
                }
            }
            // Each cluster's data is only needed while it runs.
            let _ = fs::remove_dir_all(&dir);
        }
    }

    let record = json!({
        "started_unix": started_unix,
        "date_utc": utc_date(started_unix),
        // As typed: `cargo xtask` and the arguments from the task's name on.
        "command": std::iter::once("cargo xtask".to_owned()).chain(std::env::args().skip(1)).collect::<Vec<_>>().join(" "),
        "git": git_revision(root),
        "machine": machine(),
        // The machine is shared: a busy one before the start is a warning.
        "loadavg_before": fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        "fsync": fsync,
        "wakeup": wakeup,
        "cluster": {
            "nodes": 3,
            "settings": "fencelockd defaults: tick 50 ms, election 500 ms, heartbeat 100 ms; every raft write synced (a leader's on an I/O thread that groups writes into one sync, a follower's on its node loop when the I/O thread is idle)",
            "data": temp.path().display().to_string(),
        },
        "duration_s": options.duration.as_secs_f64(),
        "warmup_s": options.warmup.as_secs_f64(),
        "profiled": options.perf,
        "generator": options.generator,
        "tls": options.tls,
        "workloads": results,
    });
    let table = render(&record);
    println!("{table}");
    let text = serde_json::to_string_pretty(&record)?;
    let stamped = out_dir.join(format!("bench-{started_unix}.json"));
    for path in [&stamped, &out_dir.join("latest.json")] {
        fs::write(path, &text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let markdown = out_dir.join("latest.md");
    fs::write(&markdown, &table).with_context(|| format!("cannot write {}", markdown.display()))?;
    println!(
        "xtask bench: wrote {}, {} and {}",
        relative(root, &stamped),
        relative(root, &out_dir.join("latest.json")),
        relative(root, &markdown)
    );
    if !failed.is_empty() {
        bail!("workloads that could not run: {}", failed.join(", "));
    }
    Ok(())
}

/// Where cargo puts its output: `CARGO_TARGET_DIR`, else `target`.
fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    }
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root).unwrap_or(path).display().to_string()
}

/// The table's label of `workload`, over TLS or not.
fn label_of(workload: &Workload, tls: bool) -> String {
    if tls {
        format!("{}, TLS", workload.label)
    } else {
        workload.label.to_owned()
    }
}

/// One workload on a fresh cluster in `dir`, over TLS if `tls`.
fn run_workload(
    server: &Path,
    generator: &Path,
    dir: &Path,
    out_dir: &Path,
    workload: &Workload,
    options: &Plan,
    tls: bool,
) -> Result<Value> {
    let mut spec = ClusterSpec::new(server, dir, 3);
    spec.flags = vec!["--log-format".to_owned(), "json".to_owned()];
    spec.tls = tls;
    let mut cluster = Cluster::start(spec)?;
    let endpoints = cluster.endpoints().join(",");
    // The generator's TLS flags: the run's certificates, as their user.
    let certs: Vec<String> = match cluster.layout().certs_dir() {
        Some(dir) => vec!["--certs-dir".into(), dir.display().to_string(), "--user".into(), TLS_USER.into()],
        None => Vec::new(),
    };
    let certs: Vec<&str> = certs.iter().map(String::as_str).collect();
    let ready = generator_json(generator, &[&["ready", "--endpoints", &endpoints][..], &certs].concat())
        .with_context(|| format!("the cluster did not get ready; {}", log_tails(&cluster)))?;
    let leader_id = ready["leader_id"].as_u64().context("`ready` named no leader")?;

    let clients = workload.clients.to_string();
    let duration = format!("{}ms", options.duration.as_millis());
    let warmup = format!("{}ms", options.warmup.as_millis());
    let mut args = vec![
        "run",
        "--endpoints",
        &endpoints,
        "--clients",
        &clients,
        "--duration",
        &duration,
        "--warmup",
        &warmup,
        "--generator",
        &options.generator,
    ];
    args.extend_from_slice(workload.flags);
    args.extend_from_slice(&certs);

    let cpu_before = cpu_ticks(&cluster);
    let switches_before = context_switches(&cluster);
    let busy_before = machine_busy_ticks();
    let started = Instant::now();
    let child = spawn_generator(generator, &args)?;
    let perf = if options.perf {
        let name = if tls { format!("{}+tls", workload.name) } else { workload.name.to_owned() };
        Some(Profiler::start(&cluster, leader_id, out_dir, &name, options)?)
    } else {
        None
    };
    let output = child.wait_with_output().context("the load generator did not finish")?;
    let elapsed = started.elapsed();
    let cpu_after = cpu_ticks(&cluster);
    let switches_after = context_switches(&cluster);
    let busy_after = machine_busy_ticks();
    let perf = perf.map(Profiler::finish).transpose()?;
    if !output.status.success() {
        bail!("the load generator failed with {}; {}", output.status, log_tails(&cluster));
    }
    let generated: Value =
        serde_json::from_slice(&output.stdout).context("the load generator printed no JSON")?;
    // Process ids, to find each server in a `--perf` profile.
    let pids: Vec<Option<u32>> = cluster.ids().into_iter().map(|id| cluster.pid(id)).collect();
    let stats = stop(&mut cluster);

    let ticks_per_s = clock_ticks_per_second();
    let servers: Vec<Value> = cluster
        .ids()
        .into_iter()
        .zip(cpu_before.iter().zip(&cpu_after))
        .zip(stats.iter().zip(&pids))
        .zip(switches_before.iter().zip(&switches_after))
        .map(|(((id, (before, after)), (stats, pid)), switches)| {
            let cpu_s = match (before, after) {
                (Some(before), Some(after)) => Some((after.saturating_sub(*before)) as f64 / ticks_per_s),
                _ => None,
            };
            let switches_per_s = match switches {
                (Some(before), Some(after)) => {
                    Some((after.saturating_sub(*before) as f64 / elapsed.as_secs_f64()).round())
                }
                _ => None,
            };
            json!({
                "id": id,
                "pid": pid,
                "leader": id == leader_id,
                "cpu_s": cpu_s,
                "cores_used": cpu_s.map(|cpu| round2(cpu / elapsed.as_secs_f64())),
                "entries_applied": stats.entries_applied,
                "syncs": stats.syncs,
                // Voluntary and involuntary, summed over the server's threads
                // that were alive at both readings.
                "context_switches_per_s": switches_per_s,
            })
        })
        .collect();
    // Whatever else ran on the machine meanwhile (the machine is shared):
    // every busy tick that is neither a server's nor the generator's.
    let wall_s = elapsed.as_secs_f64();
    let ours_s = servers.iter().filter_map(|server| server["cpu_s"].as_f64()).sum::<f64>()
        + generated["generator_cpu_total_s"].as_f64().unwrap_or(0.0);
    let other_cores = match (busy_before, busy_after) {
        (Some(before), Some(after)) => {
            let busy_s = after.saturating_sub(before) as f64 / ticks_per_s;
            Some(round2(((busy_s - ours_s) / wall_s).max(0.0)))
        }
        _ => None,
    };
    Ok(json!({
        "name": if tls { format!("{}+tls", workload.name) } else { workload.name.to_owned() },
        "label": label_of(workload, tls),
        "tls": tls,
        "target": target_text(workload.target),
        "verdict": verdict(workload.target, &generated),
        "generator_wall_s": round2(elapsed.as_secs_f64()),
        "ready": ready,
        "generator": generated,
        "servers": servers,
        "other_processes_cores": other_cores,
        "perf": perf,
    }))
}

/// Runs the generator to its end and parses what it printed.
fn generator_json(generator: &Path, args: &[&str]) -> Result<Value> {
    let output =
        spawn_generator(generator, args)?.wait_with_output().context("fencelock-bench did not finish")?;
    if !output.status.success() {
        bail!("`fencelock-bench {}` failed with {}", args.join(" "), output.status);
    }
    serde_json::from_slice(&output.stdout)
        .with_context(|| format!("`fencelock-bench {}` printed no JSON", args.join(" ")))
}

/// The generator with its stdout captured (the JSON) and its stderr passed
/// through (its progress).
fn spawn_generator(generator: &Path, args: &[&str]) -> Result<Child> {
    Command::new(generator)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot run {}", generator.display()))
}

/// What a server logged when it stopped cleanly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct NodeStats {
    entries_applied: Option<u64>,
    syncs: Option<u64>,
}

/// Each server's context switches so far, summed over its threads.
fn context_switches(cluster: &Cluster) -> Vec<Option<u64>> {
    cluster
        .ids()
        .into_iter()
        .map(|id| {
            let pid = cluster.pid(id)?;
            let mut total = 0;
            for task in fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
                let text = fs::read_to_string(task.path().join("status")).unwrap_or_default();
                total += context_switches_of_status(&text);
            }
            Some(total)
        })
        .collect()
}

/// Each server's CPU time so far, in clock ticks.
fn cpu_ticks(cluster: &Cluster) -> Vec<Option<u64>> {
    cluster
        .ids()
        .into_iter()
        .map(|id| {
            let pid = cluster.pid(id)?;
            let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            cpu_ticks_of_stat(&text)
        })
        .collect()
}

/// Stops every server with SIGTERM (SIGKILL after [`STOP_GRACE`]) and reads
/// the counters each logged.
fn stop(cluster: &mut Cluster) -> Vec<NodeStats> {
    cluster.stop(STOP_GRACE);
    cluster.ids().into_iter().map(|id| node_stats(&cluster.layout().log(id))).collect()
}

/// The last lines of every node's log, for an error message.
fn log_tails(cluster: &Cluster) -> String {
    cluster.layout().log_tails(8)
}

/// The counters of the server's clean-stop line, in its JSON log.
fn node_stats(log: &str) -> NodeStats {
    log.lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["msg"] == STOPPED_MESSAGE)
        .map(|line| NodeStats {
            entries_applied: line["entries_applied"].as_u64(),
            syncs: line["syncs"].as_u64(),
        })
        .unwrap_or_default()
}

/// utime plus stime, in clock ticks, from the text of `/proc/<pid>/stat`;
/// the fields are counted after the command name, which may hold spaces.
fn cpu_ticks_of_stat(text: &str) -> Option<u64> {
    let fields: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The machine's busy time so far, all CPUs, in clock ticks: the first line
/// of `/proc/stat` less idle and I/O wait.
/// Voluntary plus involuntary context switches in a `/proc/.../status`.
fn context_switches_of_status(text: &str) -> u64 {
    text.lines()
        .filter_map(|line| {
            let value = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))?;
            value.trim().parse::<u64>().ok()
        })
        .sum()
}

fn machine_busy_ticks() -> Option<u64> {
    busy_ticks_of_proc_stat(&fs::read_to_string("/proc/stat").ok()?)
}

fn busy_ticks_of_proc_stat(text: &str) -> Option<u64> {
    let fields: Vec<u64> = text
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal (guest time is already
    // counted in user).
    let busy: u64 =
        fields.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, v)| v).sum();
    Some(busy)
}

/// USER_HZ, the unit of `/proc/<pid>/stat` times: `getconf CLK_TCK`, which
/// is 100 on every Linux this runs on.
fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .and_then(|text| text.trim().parse::<f64>().ok())
        .filter(|ticks| *ticks > 0.0)
        .unwrap_or(100.0)
}

/// `perf` during one workload's measured window: a system-wide profile with
/// call graphs, and per-server syscall counts.
struct Profiler {
    record: Child,
    stats: Vec<(u64, bool, PathBuf, Child)>,
    data: PathBuf,
}

impl Profiler {
    fn start(
        cluster: &Cluster,
        leader_id: u64,
        out_dir: &Path,
        name: &str,
        options: &Plan,
    ) -> Result<Profiler> {
        // The window opens after the warm-up; the client connections (and
        // the servers' threads serving them) exist by then.
        std::thread::sleep(options.warmup + Duration::from_millis(200));
        let seconds =
            format!("{:.1}", options.duration.saturating_sub(Duration::from_millis(400)).as_secs_f64());
        let data = out_dir.join(format!("perf-{name}.data"));
        let record = Command::new("perf")
            .args(["record", "-a", "-g", "-F", "499", "-o"])
            .arg(&data)
            .args(["--", "sleep", &seconds])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot run `perf record` (is perf installed?)")?;
        let events =
            SYSCALLS.iter().map(|call| format!("syscalls:sys_enter_{call}")).collect::<Vec<_>>().join(",");
        let mut stats = Vec::new();
        for id in cluster.ids() {
            let Some(pid) = cluster.pid(id) else { continue };
            let out = out_dir.join(format!("perf-{name}-node-{id}.stat"));
            let child = Command::new("perf")
                .args([
                    "stat",
                    "-x",
                    ",",
                    "-e",
                    &format!("{events},context-switches,task-clock"),
                    "-p",
                    &pid.to_string(),
                    "-o",
                ])
                .arg(&out)
                .args(["--", "sleep", &seconds])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("cannot run `perf stat`")?;
            stats.push((id, id == leader_id, out, child));
        }
        Ok(Profiler { record, stats, data })
    }

    fn finish(mut self) -> Result<Value> {
        self.record.wait().context("perf record did not finish")?;
        let mut nodes = Vec::new();
        for (id, leader, out, mut child) in self.stats {
            child.wait().context("perf stat did not finish")?;
            let counts = perf_stat_counts(&fs::read_to_string(&out).unwrap_or_default());
            nodes.push(json!({"id": id, "leader": leader, "counts": counts}));
        }
        Ok(json!({"data": self.data.display().to_string(), "nodes": nodes}))
    }
}

/// Event counts from `perf stat -x ,` output: `value,unit,event,...`.
fn perf_stat_counts(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            let value: f64 = fields.first()?.trim().parse().ok()?;
            let event = fields.get(2)?.trim();
            let event = event.strip_prefix("syscalls:sys_enter_").unwrap_or(event);
            Some((event.to_owned(), value))
        })
        .collect()
}

fn target_text(target: Target) -> String {
    match target {
        Target::None => "-".to_owned(),
        Target::Cycles(cycles) => format!(">= {} cycles/s", thousands(cycles)),
        Target::CyclesAndAcquireP99(cycles, p99_us) => {
            format!(">= {} cycles/s, acquire p99 <= {} ms", thousands(cycles), p99_us / 1000)
        }
        Target::CyclesAndFifo(cycles) => format!(">= {} cycles/s, FIFO", thousands(cycles)),
    }
}

/// Whether the generator's figures met `target`: `met`, `-` for no target,
/// or `missed: ...` naming the parts missed (and those met).
fn verdict(target: Target, generated: &Value) -> String {
    let cycles = generated["cycles_per_s"].as_f64().unwrap_or(0.0);
    let acquire_p99 = generated["latency_us"]["acquire"]["p99_us"].as_u64().unwrap_or(u64::MAX);
    let hot = &generated["hot_key"];
    // FIFO as far as clients can tell: never two holders, tokens in grant
    // order, and no grant overtaking an acquire sent over 1 ms earlier.
    let fifo = hot["granted_while_held"].as_u64() == Some(0)
        && hot["token_order_violations"].as_u64() == Some(0)
        && hot["fifo_inversions_over_1ms"].as_u64() == Some(0);
    let parts: Vec<(&str, bool)> = match target {
        Target::None => return "-".to_owned(),
        Target::Cycles(min) => vec![("throughput", cycles >= min)],
        Target::CyclesAndAcquireP99(min, p99_us) => {
            vec![("throughput", cycles >= min), ("acquire p99", acquire_p99 <= p99_us)]
        }
        Target::CyclesAndFifo(min) => vec![("throughput", cycles >= min), ("FIFO", fifo)],
    };
    let names =
        |ok: bool| parts.iter().filter(|(_, met)| *met == ok).map(|(name, _)| *name).collect::<Vec<_>>();
    let (missed, met) = (names(false), names(true));
    match (missed.is_empty(), met.is_empty()) {
        (true, _) => "met".to_owned(),
        (false, true) => format!("missed: {}", missed.join(", ")),
        (false, false) => format!("missed: {} ({} met)", missed.join(", "), met.join(", ")),
    }
}

/// The results as a Markdown table, with the batching and CPU figures and
/// the hot-key checks below it.
/// Each workload's TLS run against its plain one, run back to back.
fn tls_comparison(workloads: &[Value]) -> String {
    let mut out = String::from("\n| workload | plain | TLS | TLS / plain |\n|---|---:|---:|---:|\n");
    let rate = |workload: &Value| {
        let generated = &workload["generator"];
        match generated["renew"].as_object() {
            Some(renew) => renew.get("locks_renewed_per_s").and_then(Value::as_f64),
            None => generated["cycles_per_s"].as_f64(),
        }
    };
    for plain in workloads.iter().filter(|workload| workload["tls"].as_bool() == Some(false)) {
        let Some(name) = plain["name"].as_str() else { continue };
        let tls = workloads.iter().find(|workload| workload["name"].as_str() == Some(&format!("{name}+tls")));
        let (Some(plain_rate), Some(tls_rate)) = (rate(plain), tls.and_then(rate)) else { continue };
        let ratio = if plain_rate > 0.0 { format!("{:.2}", tls_rate / plain_rate) } else { "-".to_owned() };
        out.push_str(&format!(
            "| {name} | {} | {} | {ratio} |\n",
            thousands(plain_rate),
            thousands(tls_rate)
        ));
    }
    out
}

fn render(record: &Value) -> String {
    let mut out = String::new();
    let fsync = &record["fsync"]["sync_data_us"];
    let generator = match record["generator"].as_str() {
        Some("threads") => "a fencelock-client and thread per connection",
        _ => "one event loop for all connections (renewals: a thread per client)",
    };
    let where_ = match record["wakeup"]["across_cores"].as_bool() {
        Some(true) => "two threads on two cores",
        _ => "two threads",
    };
    let wakeup = &record["wakeup"]["round_trip_us"];
    let wakeup = match wakeup["p50_us"].as_u64() {
        Some(p50) => format!(
            "; loopback round trip between {where_} (1 byte, {}x): p50 {p50} us, p99 {} us",
            wakeup["count"].as_u64().unwrap_or(0),
            wakeup["p99_us"].as_u64().unwrap_or(0)
        ),
        None => String::new(),
    };
    out.push_str(&format!(
        "{} on {}; fsync (4 KiB append + sync_data, {}x): p50 {} us, p99 {} us{wakeup}; generator: {generator}\n\n",
        record["date_utc"].as_str().unwrap_or("?"),
        record["machine"]["summary"].as_str().unwrap_or("?"),
        fsync["count"].as_u64().unwrap_or(0),
        fsync["p50_us"].as_u64().unwrap_or(0),
        fsync["p99_us"].as_u64().unwrap_or(0),
    ));
    out.push_str("| workload | clients | throughput | acquire p50 / p99 / p99.9 (ms) | release p50 / p99 / p99.9 (ms) | target | |\n");
    out.push_str("|---|---:|---:|---|---|---|---|\n");
    let workloads = record["workloads"].as_array().cloned().unwrap_or_default();
    for workload in &workloads {
        let label = workload["label"].as_str().unwrap_or("?");
        if let Some(error) = workload["error"].as_str() {
            let first_line = error.lines().next().unwrap_or(error);
            out.push_str(&format!("| {label} | | failed: {first_line} | | | | |\n"));
            continue;
        }
        let generated = &workload["generator"];
        let latency = &generated["latency_us"];
        let (throughput, first, second) = match generated["renew"].as_object() {
            Some(renew) => (
                format!(
                    "{} locks renewed/s ({} requests/s)",
                    thousands(renew.get("locks_renewed_per_s").and_then(Value::as_f64).unwrap_or(0.0)),
                    thousands(renew.get("requests_per_s").and_then(Value::as_f64).unwrap_or(0.0)),
                ),
                format!("renew request: {}", percentiles(&latency["renew"])),
                "-".to_owned(),
            ),
            None => (
                format!("{} cycles/s", thousands(generated["cycles_per_s"].as_f64().unwrap_or(0.0))),
                percentiles(&latency["acquire"]),
                percentiles(&latency["release"]),
            ),
        };
        out.push_str(&format!(
            "| {label} | {} | {throughput} | {first} | {second} | {} | {} |\n",
            generated["clients"],
            workload["target"].as_str().unwrap_or("-"),
            workload["verdict"].as_str().unwrap_or("-"),
        ));
    }

    if record["tls"].as_bool() == Some(true) {
        out.push_str(&tls_comparison(&workloads));
    }
    out.push_str(
        "\n| workload | requests / entry | entries / sync (leader) | context switches / request (leader) | CPU cores used: leader, followers, generator | other processes (cores) | errors |\n",
    );
    out.push_str("|---|---:|---:|---:|---|---:|---|\n");
    for workload in workloads.iter().filter(|workload| workload["error"].is_null()) {
        let generated = &workload["generator"];
        let servers = workload["servers"].as_array().cloned().unwrap_or_default();
        let leader = servers.iter().find(|server| server["leader"] == true);
        let entries_per_sync = leader
            .and_then(|leader| Some(leader["entries_applied"].as_f64()? / leader["syncs"].as_f64()?.max(1.0)))
            .map_or("?".to_owned(), |ratio| format!("{ratio:.2}"));
        let requests_per_s = generated["cycles_per_s"].as_f64().unwrap_or(0.0) * 2.0;
        let switches_per_request = leader
            .and_then(|leader| leader["context_switches_per_s"].as_f64())
            .filter(|_| {
                requests_per_s > 0.0 && workload["name"].as_str().is_some_and(|name| name != "renew-10k")
            })
            .map_or("-".to_owned(), |switches| format!("{:.1}", switches / requests_per_s));
        let cores = |server: &Value| {
            server["cores_used"].as_f64().map_or("?".to_owned(), |cores| format!("{cores:.2}"))
        };
        let followers: Vec<String> =
            servers.iter().filter(|server| server["leader"] != true).map(cores).collect();
        let generator_cores = match (generated["generator_cpu_s"].as_f64(), generated["measured_s"].as_f64())
        {
            (Some(cpu), Some(wall)) if wall > 0.0 => format!("{:.2}", cpu / wall),
            _ => "?".to_owned(),
        };
        let errors = generated["errors"].as_object().filter(|errors| !errors.is_empty()).map_or(
            "0".to_owned(),
            |errors| {
                errors.iter().map(|(what, count)| format!("{what} {count}")).collect::<Vec<_>>().join(", ")
            },
        );
        out.push_str(&format!(
            "| {} | {} | {entries_per_sync} | {switches_per_request} | {}, {}, {generator_cores} | {} | {errors} |\n",
            workload["name"].as_str().unwrap_or("?"),
            generated["requests_per_entry"],
            leader.map_or("?".to_owned(), cores),
            followers.join(" + "),
            workload["other_processes_cores"].as_f64().map_or("?".to_owned(), |cores| format!("{cores:.2}")),
        ));
    }

    for workload in &workloads {
        let hot = &workload["generator"]["hot_key"];
        if hot.is_object() {
            out.push_str(&format!(
                "\nHot key: {} grants; granted while another held it: {}; tokens out of order: {}; \
                 FIFO inversions (send order vs. grant order): {} ({} with sends over 1 ms apart, \
                 largest gap {} us); grants per client {} to {}.\n",
                hot["grants"],
                hot["granted_while_held"],
                hot["token_order_violations"],
                hot["fifo_inversions"],
                hot["fifo_inversions_over_1ms"],
                hot["fifo_max_inversion_gap_us"],
                hot["grants_per_client_min"],
                hot["grants_per_client_max"],
            ));
        }
        let renew = &workload["generator"]["renew"];
        if renew.is_object() {
            out.push_str(&format!(
                "\nRenewals: {} locks held ({} per request, {} s to acquire them); {} renewals refused.\n",
                renew["locks_held"], renew["locks_per_request"], renew["setup_s"], renew["not_renewed"],
            ));
        }
    }
    let busiest_other = workloads
        .iter()
        .filter_map(|workload| workload["other_processes_cores"].as_f64())
        .fold(0.0, f64::max);
    if busiest_other > 0.25 {
        out.push_str(&format!(
            "\nWarning: other processes used up to {busiest_other:.2} cores during this run (the machine is \
             shared); these figures are lower than a quiet machine's.\n"
        ));
    }
    if record["profiled"] == true {
        out.push_str(
            "\nProfiled run (--perf): perf adds load, so these figures are lower than an unprofiled run's.\n",
        );
    }
    out
}

/// `p50 / p99 / p99.9` in milliseconds.
fn percentiles(summary: &Value) -> String {
    if summary["count"].as_u64().unwrap_or(0) == 0 {
        return "-".to_owned();
    }
    let ms = |key: &str| summary[key].as_f64().unwrap_or(0.0) / 1000.0;
    format!("{:.2} / {:.2} / {:.2}", ms("p50_us"), ms("p99_us"), ms("p999_us"))
}

/// `12345.6` as `12,346`.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

/// The machine: cores, CPU model, memory and kernel, as Linux reports them.
fn machine() -> Value {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| {
            line.strip_prefix("model name").and_then(|rest| rest.split_once(':')).map(|(_, name)| name.trim())
        })
        .unwrap_or("unknown CPU")
        .to_owned();
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_kib = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    let cores = std::thread::available_parallelism().map(usize::from).unwrap_or(0);
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned();
    let memory_gib = memory_kib.map(|kib| kib as f64 / (1024.0 * 1024.0));
    json!({
        "cores": cores,
        "cpu_model": model,
        "memory_kib": memory_kib,
        "kernel": kernel,
        "summary": format!(
            "{cores} cores ({model}), {} GiB memory, Linux {kernel}",
            memory_gib.map_or("?".to_owned(), |gib| format!("{gib:.1}"))
        ),
    })
}

/// The commit measured, and whether the tree had changes.
fn git_revision(root: &Path) -> Value {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|output| output.status.success())
            .and_then(|output| String::from_utf8(output.stdout).ok())
    };
    let commit = git(&["rev-parse", "HEAD"]).map(|text| text.trim().to_owned());
    let dirty = git(&["status", "--porcelain"]).map(|text| !text.trim().is_empty());
    json!({"commit": commit, "dirty": dirty})
}

/// `YYYY-MM-DD HH:MM UTC` for seconds since the Unix epoch.
fn utc_date(unix: u64) -> String {
    let days = i64::try_from(unix / 86_400).unwrap_or(0);
    let (year, month, day) = civil_from_days(days);
    let seconds = unix % 86_400;
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02} UTC", seconds / 3600, seconds % 3600 / 60)
}

/// Howard Hinnant's days-to-civil: the proleptic Gregorian date of a day
/// count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(list: &[&str]) -> Result<Plan, clap::Error> {
        use clap::Parser;
        let cli = crate::Cli::try_parse_from(["xtask", "bench"].iter().chain(list))?;
        match cli.task {
            Some(crate::Task::Bench(options)) => Ok(options.plan()),
            other => panic!("not bench: {other:?}"),
        }
    }

    #[test]
    fn options_parse_and_refuse() {
        let quick = parse(&["--quick", "--only", "distinct-1,hot-key-64"]).unwrap();
        assert_eq!(quick.duration, Duration::from_secs(3));
        assert_eq!(
            quick.selected().map(|workload| workload.name).collect::<Vec<_>>(),
            ["distinct-1", "hot-key-64"]
        );
        assert_eq!(parse(&["--duration", "2.5s"]).unwrap().duration, Duration::from_millis(2500));
        // The later of --quick and --duration wins, and a repeated flag keeps
        // its last value, as with the hand-written parser.
        assert_eq!(parse(&["--duration", "5", "--quick"]).unwrap().duration, Duration::from_secs(3));
        assert_eq!(parse(&["--quick", "--duration", "5"]).unwrap().duration, Duration::from_secs(5));
        assert_eq!(parse(&["--duration", "5", "--duration", "6"]).unwrap().duration, Duration::from_secs(6));
        assert_eq!(parse(&["--only", "distinct-1", "--only", "renew-10k"]).unwrap().only, ["renew-10k"]);
        let plain = parse(&[]).unwrap();
        assert_eq!(plain.selected().count(), WORKLOADS.len());
        assert_eq!(plain.duration, Duration::from_secs(10));
        assert_eq!(plain.warmup, Duration::from_secs(1));
        assert_eq!(plain.generator, "events");
        assert!(!plain.perf);
        assert!(parse(&["--perf", "--warmup", "0"]).unwrap().perf);
        assert_eq!(parse(&["--generator", "threads"]).unwrap().generator, "threads");
        for (bad, says) in [
            (&["--only", "everything"][..], "no workload `everything`; there are: distinct-1"),
            (&["--generator", "fibers"], "--generator is `events` or `threads`, not `fibers`"),
            (&["--duration", "soon"], "`soon` is not a number of seconds"),
            (&["--duration", "0"], "--duration must be positive"),
            (&["--warmup", "7200"], "7200 s is not between 0 and an hour"),
            (&["--fast"], "--fast"),
            (&["--duration"], "--duration"),
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn server_counters_come_from_the_clean_stop_line() {
        let log = concat!(
            r#"{"msg":"fencelockd serving","level":"INFO","node_id":1}"#,
            "\nnot json\n",
            r#"{"msg":"fencelockd stopped","level":"INFO","entries_applied":120,"syncs":40}"#,
            "\n"
        );
        assert_eq!(node_stats(log), NodeStats { entries_applied: Some(120), syncs: Some(40) });
        assert_eq!(node_stats("killed before it could say"), NodeStats::default());
    }

    #[test]
    fn verdicts_follow_the_targets() {
        let generated = json!({
            "cycles_per_s": 21_000.0,
            "latency_us": {"acquire": {"p99_us": 12_000}},
            "hot_key": {"granted_while_held": 0, "token_order_violations": 0, "fifo_inversions_over_1ms": 0},
        });
        assert_eq!(verdict(Target::Cycles(20_000.0), &generated), "met");
        assert_eq!(
            verdict(Target::CyclesAndAcquireP99(20_000.0, 10_000), &generated),
            "missed: acquire p99 (throughput met)"
        );
        assert_eq!(verdict(Target::CyclesAndFifo(3_000.0), &generated), "met");
        assert_eq!(verdict(Target::CyclesAndFifo(30_000.0), &generated), "missed: throughput (FIFO met)");
        assert_eq!(verdict(Target::Cycles(30_000.0), &json!({})), "missed: throughput");
        assert_eq!(verdict(Target::None, &generated), "-");
    }

    #[test]
    fn numbers_dates_and_perf_output_read_well() {
        assert_eq!(thousands(0.4), "0");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1_234_567.8), "1,234,568");
        assert_eq!(utc_date(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_date(1_709_210_096), "2024-02-29 12:34 UTC");
        let stat = "4242 (fencelockd) S 1 2 3 4 5 6 7 8 9 10 300 45 0 0";
        assert_eq!(cpu_ticks_of_stat(stat), Some(345));
        let status =
            "Name:\tfencelock-raft-\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t7\n";
        assert_eq!(context_switches_of_status(status), 127);
        let perf = "# started\n\n1234,,syscalls:sys_enter_fdatasync,10.0,100.00,,\n<not counted>,,x,0,0,,\n";
        assert_eq!(perf_stat_counts(perf).get("fdatasync"), Some(&1234.0));
        assert_eq!(
            percentiles(&json!({"count": 2, "p50_us": 1500, "p99_us": 2000, "p999_us": 2500})),
            "1.50 / 2.00 / 2.50"
        );
    }

    #[test]
    fn the_table_has_a_row_per_workload_and_survives_failures() {
        let record = json!({
            "date_utc": "2024-01-01 00:00 UTC",
            "machine": {"summary": "2 cores"},
            "fsync": {"sync_data_us": {"count": 1000, "p50_us": 140, "p99_us": 400}},
            "wakeup": {"across_cores": true, "round_trip_us": {"count": 2000, "p50_us": 83, "p99_us": 120}},
            "workloads": [
                {"name": "distinct-1", "label": "distinct keys", "target": ">= 1,000 cycles/s", "verdict": "met",
                 "generator": {"clients": 1, "cycles_per_s": 1500.0, "requests_per_entry": 1.0, "errors": {},
                               "latency_us": {"acquire": {"count": 5, "p50_us": 600, "p99_us": 900, "p999_us": 1200}}},
                 "servers": [{"leader": true, "entries_applied": 100, "syncs": 50, "cores_used": 0.5,
                              "context_switches_per_s": 9000.0}]},
                {"name": "hot-key-64", "label": "one hot key, waiting", "error": "no leader\nlogs"},
            ],
        });
        let table = render(&record);
        assert!(
            table.contains(
                "| distinct keys | 1 | 1,500 cycles/s | 0.60 / 0.90 / 1.20 | - | >= 1,000 cycles/s | met |"
            ),
            "{table}"
        );
        assert!(table.contains("| one hot key, waiting | | failed: no leader |"), "{table}");
        assert!(table.contains("fsync (4 KiB append + sync_data, 1000x): p50 140 us, p99 400 us; loopback round trip between two threads on two cores (1 byte, 2000x): p50 83 us, p99 120 us;"), "{table}");
        assert!(table.contains("| distinct-1 | 1.0 | 2.00 | 3.0 |"), "{table}");
        assert_eq!(busy_ticks_of_proc_stat("cpu  10 1 5 100 7 2 3 4 0 0\ncpu0 1 1 1 1 1 1 1 1\n"), Some(25));
        assert_eq!(busy_ticks_of_proc_stat("intr 1 2"), None);
    }
}
