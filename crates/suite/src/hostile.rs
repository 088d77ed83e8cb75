//! `fencelock-suite hostile`: a cluster of real `fencelockd` processes
//! under clients that break the rules, one attack after another, while
//! well-behaved clients keep taking locks beside them.
//!
//! The attacks ([`attacks::Attack`]) each take a slice of `--duration`: a
//! flood of waiting acquires, partial frames that never finish, a client
//! that never reads, thousands of idle connections, garbage on the peer
//! ports, decode bombs on the peer ports, a flood of long-keyed locks, and a flood of refused connections
//! aimed at the logs. Every one of them meets a limit of docs/limits.md.
//! What the suite checks, whatever the attack:
//!
//! - no node dies;
//! - no node's resident memory passes [`RSS_MAX_BYTES`];
//! - the good clients get at least one lock per second each, on average,
//!   during every attack (their p50 and p99 are reported);
//! - leases run out on time: probe locks taken with no renewal are free
//!   within their lease plus [`PROBE_GRACE`];
//! - a follower killed before the attacks and started again for the last
//!   one catches up (applied index and lock count) within
//!   [`CATCH_UP_WITHIN`];
//! - and each attack's own expectations (the server refuses the excess,
//!   closes the worst holders, keeps its leader, keeps its log short).
//!
//! docs/suites.md ("The hostile-clients suite") has the figures of a run.

mod attacks;
mod raw;
mod watch;

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::json;

use crate::cluster::{Cluster, ClusterConfig};
use crate::rng::SplitMix64;
use crate::run::Settings;
use attacks::{Attack, Limits, Outcome, Target};
use watch::{Call, GoodConfig, Memory, Phase, Pids, Probe, ProbeConfig};

/// The most resident memory any node may reach, in bytes. Debug builds
/// measured 120 to 190 MiB at their worst here (the partial-frames attack
/// and the follower's catch-up). What the limits let clients park on one
/// node is 64 MiB of partial requests (`--max-input-bytes`) plus 256 MiB of
/// unsent answers (`--max-output-bytes`); with the measured peak on top and
/// room for allocator slack, 768 MiB. A node without those limits would
/// hold the 360 MB of partial frames alone.
pub const RSS_MAX_BYTES: u64 = 768 << 20;

/// The shortest slice an attack gets, whatever `--duration`.
const ATTACK_MIN: Duration = Duration::from_secs(2);

/// The quiet phase before the attacks: the good clients' baseline.
const QUIET: Duration = Duration::from_secs(1);

/// The restarted follower's deadline to catch up, from its restart.
const CATCH_UP_WITHIN: Duration = Duration::from_secs(30);

/// The good clients' fewest locks per second each, during any attack.
const GRANTS_PER_CLIENT_S_MIN: f64 = 1.0;

/// How much past its lease a probe lock may still be seen held.
const PROBE_GRACE: Duration = Duration::from_secs(2);

/// Lines a node's log may grow by during the log flood.
const LOG_LINES_MAX: usize = 200;

/// Locks put in the table before the attacks, so that a `list` answer is
/// large (about 6.5 MB).
const FILL_LOCKS: u64 = 5_000;

/// Snapshots more often than the default (10,000 entries), so that the
/// leader has compacted its log past the killed follower before it comes
/// back in every run: it must catch up from a snapshot of the full table.
const SNAPSHOT_INTERVAL_ENTRIES: usize = 2_000;

/// The phase after the attacks, while the follower catches up.
const CATCH_UP: &str = "catch-up";

/// How often the sampler reads each node's memory.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// The limits the cluster is started with. All but the lock quotas are
/// fencelockd's defaults, given explicitly so that the attacks meet the
/// values they expect. The quotas are small: the table flood must meet its
/// identity's quota (`--max-locks-per-owner`) within a slice, and the table
/// (`--max-locks`) must keep room for everyone else.
const LIMITS: Limits = Limits {
    max_in_flight: 4_096,
    max_waiters_per_key: 4_096,
    max_connections_per_address: 1_024,
    max_input_bytes: 64 << 20,
    max_output_bytes: 256 << 20,
    max_locks: 20_000,
    max_locks_per_owner: 10_000,
};

const GOOD: GoodConfig = GoodConfig {
    clients: 8,
    lease: Duration::from_secs(2),
    request_timeout: Duration::from_secs(2),
    retry_for: Duration::from_secs(5),
};

const PROBES: ProbeConfig = ProbeConfig {
    probers: 2,
    lease: Duration::from_secs(2),
    grace: PROBE_GRACE,
    poll: Duration::from_millis(50),
    request_timeout: Duration::from_millis(500),
};

/// One enforced expectation and how it went.
#[derive(Clone, Debug, Serialize)]
struct Check {
    name: &'static str,
    passed: bool,
    detail: String,
}

/// One phase of the run: the quiet start, an attack, or the catch-up.
#[derive(Clone, Debug, Serialize)]
struct PhaseRecord {
    name: &'static str,
    start_s: f64,
    end_s: f64,
    /// How many times the host's listen queues overflowed during the
    /// phase (TcpExt ListenOverflows: a SYN dropped, tried again 1 s later).
    #[serde(skip_serializing_if = "Option::is_none")]
    listen_overflows: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<Outcome>,
}

/// The good clients' figures in one phase.
#[derive(Clone, Debug, Default, Serialize)]
struct Service {
    acquires: u64,
    acquires_failed: u64,
    releases: u64,
    releases_failed: u64,
    grants_per_client_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// The longest time in the phase in which no good client got a lock.
    longest_gap_ms: u64,
    first_error: Option<String>,
}

/// Runs the suite; `Ok(false)` when a check failed.
pub fn run(settings: &Settings) -> Result<bool> {
    if settings.tls {
        bail!("the hostile suite speaks plain TCP on both ports; run it without --tls");
    }
    raise_open_files();
    let dir = settings.out.join(format!("hostile-{}", settings.seed));
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let slice = (settings.duration / Attack::ALL.len() as u32).max(ATTACK_MIN);
    eprintln!(
        "suite hostile: {} attacks of {:.1}s each against {} nodes (seed {})",
        Attack::ALL.len(),
        slice.as_secs_f64(),
        settings.nodes,
        settings.seed
    );
    let flags = server_flags();
    let mut cluster = Cluster::start_with_flags(
        &ClusterConfig {
            server: settings.server.clone(),
            dir: dir.clone(),
            nodes: settings.nodes,
            node_env: Vec::new(),
            tls: false,
        },
        &flags,
    )?;
    let result = attack_cluster(&mut cluster, settings, slice);
    cluster.stop();
    let run = match result {
        Ok(run) => run,
        Err(err) => bail!("{err:#}\n{}", cluster.log_tails(10)),
    };
    let passed = run.checks.iter().all(|check| check.passed);
    let table = run.table();
    let report_path = dir.join("report.json");
    let report = json!({
        "suite": "hostile",
        "passed": passed,
        "seed": settings.seed,
        "nodes": settings.nodes,
        "duration_s": settings.duration.as_secs_f64(),
        "slice_s": slice.as_secs_f64(),
        "started_unix": SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        "server": settings.server.display().to_string(),
        "server_flags": flags,
        "limits": LIMITS,
        "rss_max_bytes": RSS_MAX_BYTES,
        "good_clients": GOOD.clients,
        "phases": run.phases,
        "service": run.service,
        "memory": run.memory,
        "probes": run.probes,
        "catch_up": run.catch_up,
        "log_lines": run.log_lines,
        "checks": run.checks,
        "table": table,
        "files": {
            "logs": cluster.log_paths().iter().map(|path| path.display().to_string()).collect::<Vec<_>>(),
        },
    });
    fs::write(&report_path, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("cannot write {}", report_path.display()))?;
    println!(
        "suite hostile (seed {}, {} nodes, {:.0}s, {:.1}s per attack): {}",
        settings.seed,
        settings.nodes,
        settings.duration.as_secs_f64(),
        slice.as_secs_f64(),
        if passed { "ok" } else { "FAILED" }
    );
    for line in &table {
        println!("  {line}");
    }
    for phase in &run.phases {
        if let Some(outcome) = &phase.outcome {
            println!("  {}: {}", phase.name, outcome.summary);
        }
    }
    for check in &run.checks {
        println!(
            "  check {:<22} {} {}",
            check.name,
            if check.passed { "ok    " } else { "FAILED" },
            check.detail
        );
    }
    println!("  report: {}", report_path.display());
    if passed {
        cluster.remove_data();
    }
    Ok(passed)
}

/// fencelockd's flags for this suite: the limits the attacks meet.
fn server_flags() -> Vec<String> {
    [
        ("--max-in-flight", LIMITS.max_in_flight),
        ("--max-waiters-per-key", LIMITS.max_waiters_per_key),
        ("--max-connections-per-address", LIMITS.max_connections_per_address),
        ("--max-input-bytes", LIMITS.max_input_bytes),
        ("--max-output-bytes", LIMITS.max_output_bytes),
        ("--max-locks", LIMITS.max_locks),
        ("--max-locks-per-owner", LIMITS.max_locks_per_owner),
        ("--snapshot-interval-entries", SNAPSHOT_INTERVAL_ENTRIES),
    ]
    .into_iter()
    .flat_map(|(flag, value)| [flag.to_owned(), value.to_string()])
    .collect()
}

/// Everything a run measured.
#[derive(Debug)]
struct RunRecord {
    nodes: Vec<u64>,
    phases: Vec<PhaseRecord>,
    service: Vec<Service>,
    memory: Memory,
    probes: Vec<Probe>,
    catch_up: serde_json::Value,
    log_lines: BTreeMap<u64, usize>,
    checks: Vec<Check>,
}

/// What the run shares with the threads that watch it.
struct Watchers {
    phase: Arc<Phase>,
    pids: Arc<Pids>,
    stop_clients: Arc<AtomicBool>,
    stop_sampler: Arc<AtomicBool>,
}

fn attack_cluster(cluster: &mut Cluster, settings: &Settings, slice: Duration) -> Result<RunRecord> {
    cluster.wait_for_leader(Duration::from_secs(30))?;
    let start = Instant::now();
    let since = |at: Instant| at.saturating_duration_since(start).as_secs_f64();
    let nodes = cluster.ids();
    let watchers = Watchers {
        phase: Arc::new(Phase::default()),
        pids: Arc::new(Pids::default()),
        stop_clients: Arc::new(AtomicBool::new(false)),
        stop_sampler: Arc::new(AtomicBool::new(false)),
    };
    for &id in &nodes {
        watchers.pids.lock().insert(id, cluster.pid(id));
    }
    let sampler =
        watch::spawn_sampler(&watchers.pids, &watchers.phase, &watchers.stop_sampler, SAMPLE_EVERY)?;
    let endpoints = cluster.endpoints();

    // The table: locks with the longest keys and owners, so that a `list`
    // is big; and the keys the waiters queue on, held by another owner.
    fill_table(cluster)?;
    let holder = watch::good_client(&GOOD, &endpoints, "holder/0")?;
    for index in 0..attacks::HELD_KEYS {
        holder
            .acquire_raw(
                b"holder/0",
                attacks::held_key(index),
                Duration::from_millis(attacks::LONG_LEASE_MS),
                Duration::ZERO,
            )
            .context("holding the waiters' keys")?;
    }

    // The lagging follower: down from now until the last attack.
    let leader = cluster.wait_for_leader(Duration::from_secs(10))?;
    let follower = nodes.iter().copied().find(|&id| id != leader).context("no follower")?;
    {
        let mut pids = watchers.pids.lock();
        pids.insert(follower, None);
        cluster.kill9(follower)?;
    }

    let clients = watch::spawn_good_clients(&GOOD, &endpoints, &watchers.phase, &watchers.stop_clients)?;
    let probers = watch::spawn_probers(PROBES, &GOOD, &endpoints, &watchers.phase, &watchers.stop_clients)?;
    let mut phases = vec![PhaseRecord {
        name: "quiet",
        start_s: since(Instant::now()),
        end_s: 0.0,
        listen_overflows: None,
        outcome: None,
    }];
    std::thread::sleep(QUIET);

    let mut rng = SplitMix64::new(settings.seed);
    let mut checks = Vec::new();
    let mut log_lines = BTreeMap::new();
    let mut restarted = None;
    for (index, attack) in Attack::ALL.into_iter().enumerate() {
        let lines_before = line_counts(cluster);
        let overflows_before = listen_overflows();
        if attack == Attack::LogFlood {
            let mut pids = watchers.pids.lock();
            cluster.launch(follower)?;
            pids.insert(follower, cluster.pid(follower));
            restarted = Some(Instant::now());
        }
        // Found while the last phase is still on: a leader still busy with
        // the last attack's aftermath delays this one, and the good clients'
        // figures of that while belong to the last.
        let target = target(cluster)?;
        let leader_before = cluster.leader();
        let now = Instant::now();
        if let Some(last) = phases.last_mut() {
            last.end_s = since(now);
        }
        watchers.phase.set(index + 1);
        let deadline = now + slice;
        let mut outcome = attacks::run(attack, &target, deadline, &mut rng).unwrap_or_else(|err| Outcome {
            summary: format!("could not run: {err:#}"),
            figures: serde_json::Value::Null,
            failures: vec![format!("the attack could not run: {err:#}")],
        });
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(left);
        match attack {
            Attack::PeerGarbage => {
                let leader_after = cluster.leader();
                if leader_after != leader_before || leader_after.is_none() {
                    outcome.failures.push(format!(
                        "the leader (node, term) changed from {leader_before:?} to {leader_after:?}"
                    ));
                }
            }
            Attack::LogFlood => {
                // The log writer is asynchronous: give it a moment.
                std::thread::sleep(Duration::from_millis(300));
                for (id, after) in line_counts(cluster) {
                    let grew = after.saturating_sub(lines_before.get(&id).copied().unwrap_or(0));
                    log_lines.insert(id, grew);
                    if grew > LOG_LINES_MAX {
                        outcome.failures.push(format!(
                            "node {id}'s log grew by {grew} lines in the slice; the bound is {LOG_LINES_MAX}"
                        ));
                    }
                }
            }
            _ => {}
        }
        checks.push(Check {
            name: attack.name(),
            passed: outcome.failures.is_empty(),
            detail: if outcome.failures.is_empty() { "ok".to_owned() } else { outcome.failures.join("; ") },
        });
        eprintln!("  {}: {}", attack.name(), outcome.summary);
        let listen_overflows = match (overflows_before, listen_overflows()) {
            (Some(before), Some(after)) => Some(after.saturating_sub(before)),
            _ => None,
        };
        phases.push(PhaseRecord {
            name: attack.name(),
            start_s: since(now),
            end_s: 0.0,
            listen_overflows,
            outcome: Some(outcome),
        });
    }
    let catch_up_start = Instant::now();
    if let Some(last) = phases.last_mut() {
        last.end_s = since(catch_up_start);
    }
    let catch_up_phase = Attack::ALL.len() + 1;
    watchers.phase.set(catch_up_phase);
    watchers.stop_clients.store(true, Ordering::SeqCst);

    let restarted = restarted.context("the follower was never restarted")?;
    let catch_up = catch_up(cluster, follower, restarted);
    let mut calls: Vec<Call> = Vec::new();
    for thread in clients {
        calls.extend(thread.join().map_err(|_| anyhow::anyhow!("a good client panicked"))?);
    }
    let mut probes = Vec::new();
    for thread in probers {
        probes.extend(thread.join().map_err(|_| anyhow::anyhow!("a prober panicked"))?);
    }
    phases.push(PhaseRecord {
        name: CATCH_UP,
        start_s: since(catch_up_start),
        end_s: since(Instant::now()),
        listen_overflows: None,
        outcome: None,
    });

    // Every node must still be up: the Cluster API fails at once if a
    // process exited.
    let mut down = Vec::new();
    for &id in &nodes {
        if let Err(err) = cluster.wait_until_answers(id, Duration::from_secs(5)) {
            down.push(format!("node {id}: {err:#}"));
        }
    }
    watchers.stop_sampler.store(true, Ordering::SeqCst);
    let memory = sampler.join().map_err(|_| anyhow::anyhow!("the memory sampler panicked"))?;
    down.extend(memory.deaths.iter().cloned());

    let service = service(&calls, &phases, start)?;
    let mut all_checks = vec![
        Check {
            name: "nodes-alive",
            passed: down.is_empty(),
            detail: if down.is_empty() {
                format!("all {} nodes ran to the end", nodes.len())
            } else {
                down.join("; ")
            },
        },
        rss_check(&memory),
        service_check(&service, &phases),
        probe_check(&probes),
        catch_up.0,
    ];
    all_checks.extend(checks);
    Ok(RunRecord {
        nodes,
        phases,
        service,
        memory,
        probes,
        catch_up: catch_up.1,
        log_lines,
        checks: all_checks,
    })
}

/// Puts [`FILL_LOCKS`] locks of the longest keys and owners in the table,
/// pipelined on one connection to the leader. A round cut short by a
/// change of leader is sent again whole to the new one: an acquire
/// repeated by its owner is answered with the lock it already holds.
fn fill_table(cluster: &Cluster) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let leader = cluster.wait_for_leader(deadline.saturating_duration_since(Instant::now()))?;
        let fill = raw::pipeline(client_addr(cluster, leader)?, 512, deadline, true, |id| {
            (id <= FILL_LOCKS).then(|| {
                let key = raw::padded(&format!("fill/{id:08}/"), fencelock_types::KEY_LEN_MAX, b'k');
                let owner = raw::padded(&format!("fill/{id}/"), fencelock_types::OWNER_LEN_MAX, b'o');
                raw::acquire(id, &key, &owner, attacks::LONG_LEASE_MS, 0)
            })
        })?;
        if fill.answers.tally.granted == FILL_LOCKS {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("filling the table: {FILL_LOCKS} acquires, {fill:?}");
        }
        // Not a wait for a condition: the next round asks for a leader.
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Where the attacks aim now: the leader and the running nodes.
fn target(cluster: &Cluster) -> Result<Target> {
    let leader = match cluster.leader() {
        Some((id, _)) => id,
        None => cluster.wait_for_leader(Duration::from_secs(5))?,
    };
    let running: Vec<_> = cluster.addrs().into_iter().filter(|(id, _, _)| cluster.is_running(*id)).collect();
    Ok(Target {
        leader: client_addr(cluster, leader)?,
        leader_pid: cluster.pid(leader),
        clients: running.iter().map(|(_, client, _)| *client).collect(),
        pids: running.iter().map(|(id, _, _)| cluster.pid(*id)).collect(),
        peers: running.iter().map(|(_, _, peer)| *peer).collect(),
        endpoints: cluster.endpoints(),
        good: GOOD,
        limits: LIMITS,
    })
}

fn client_addr(cluster: &Cluster, id: u64) -> Result<SocketAddr> {
    cluster
        .addrs()
        .into_iter()
        .find(|(node, _, _)| *node == id)
        .map(|(_, client, _)| client)
        .with_context(|| format!("no node {id}"))
}

/// Each node's log length in lines.
fn line_counts(cluster: &Cluster) -> BTreeMap<u64, usize> {
    cluster.ids().into_iter().zip(cluster.log_paths()).map(|(id, path)| (id, count_lines(path))).collect()
}

fn count_lines(path: &Path) -> usize {
    fs::read(path).map(|bytes| bytes.iter().filter(|&&byte| byte == b'\n').count()).unwrap_or(0)
}

/// Waits for the restarted follower to catch up with the leader: its
/// applied index at least the leader's commit index, and the same number
/// of locks (read while the leader's applied index stood still).
fn catch_up(cluster: &Cluster, follower: u64, restarted: Instant) -> (Check, serde_json::Value) {
    let deadline = restarted + CATCH_UP_WITHIN;
    let mut last = json!(null);
    loop {
        let statuses = cluster.statuses();
        let leader = crate::cluster::leader_of(&statuses).map(|(id, _)| id);
        let status_of = |id: u64| statuses.iter().find(|(node, _)| *node == id).and_then(|(_, s)| s.clone());
        if let (Some(leader_id), Some(follower_status)) = (leader, status_of(follower)) {
            if let Some(leader_status) = status_of(leader_id) {
                let caught_up = follower_status.applied_index >= leader_status.commit_index
                    && follower_status.locks == leader_status.locks;
                last = json!({
                    "leader": leader_id,
                    "leader_commit_index": leader_status.commit_index,
                    "leader_locks": leader_status.locks,
                    "leader_snapshot_index": leader_status.snapshot_index,
                    "leader_snapshot_bytes": leader_status.snapshot_bytes,
                    "follower": follower,
                    "follower_applied_index": follower_status.applied_index,
                    "follower_locks": follower_status.locks,
                    "follower_snapshot_index": follower_status.snapshot_index,
                });
                if caught_up {
                    let after = restarted.elapsed();
                    last["caught_up_after_ms"] = json!(watch::millis(after));
                    let detail = format!(
                        "node {follower} caught up {:.1}s after its restart: applied {} >= commit {}, {} locks; \
                         the leader's snapshot is {:.1} MiB (index {})",
                        after.as_secs_f64(),
                        follower_status.applied_index,
                        leader_status.commit_index,
                        follower_status.locks,
                        leader_status.snapshot_bytes as f64 / f64::from(1 << 20),
                        leader_status.snapshot_index
                    );
                    return (Check { name: "follower-catches-up", passed: true, detail }, last);
                }
            }
        }
        if Instant::now() >= deadline {
            let detail = format!("node {follower} did not catch up within {CATCH_UP_WITHIN:?}: {last}");
            return (Check { name: "follower-catches-up", passed: false, detail }, last);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The good clients' figures per phase.
fn service(calls: &[Call], phases: &[PhaseRecord], start: Instant) -> Result<Vec<Service>> {
    let mut services = Vec::new();
    for (index, phase) in phases.iter().enumerate() {
        let from = start + Duration::from_secs_f64(phase.start_s);
        let to = start + Duration::from_secs_f64(phase.end_s);
        let mut grants: Vec<Instant> = calls
            .iter()
            .filter(|call| call.acquire && call.error.is_none() && (from..=to).contains(&call.done))
            .map(|call| call.done)
            .collect();
        grants.sort();
        grants.push(to);
        let mut gap = Duration::ZERO;
        let mut previous = from;
        for grant in grants {
            gap = gap.max(grant.saturating_duration_since(previous));
            previous = grant;
        }
        let mut histogram =
            Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).context("histogram bounds")?;
        let mut service = Service { longest_gap_ms: watch::millis(gap), ..Service::default() };
        for call in calls.iter().filter(|call| call.phase == index) {
            histogram.saturating_record(call.latency_us.max(1));
            match (call.acquire, &call.error) {
                (true, None) => service.acquires += 1,
                (true, Some(error)) => {
                    service.acquires_failed += 1;
                    service.first_error.get_or_insert_with(|| error.clone());
                }
                (false, None) => service.releases += 1,
                (false, Some(error)) => {
                    service.releases_failed += 1;
                    service.first_error.get_or_insert_with(|| error.clone());
                }
            }
        }
        let seconds = (phase.end_s - phase.start_s).max(0.001);
        service.grants_per_client_s = round1(service.acquires as f64 / (GOOD.clients as f64 * seconds));
        if !histogram.is_empty() {
            service.p50_ms = round1(histogram.value_at_quantile(0.5) as f64 / 1000.0);
            service.p99_ms = round1(histogram.value_at_quantile(0.99) as f64 / 1000.0);
            service.max_ms = round1(histogram.max() as f64 / 1000.0);
        }
        services.push(service);
    }
    Ok(services)
}

fn service_check(services: &[Service], phases: &[PhaseRecord]) -> Check {
    let slow: Vec<String> = phases
        .iter()
        .zip(services)
        .filter(|(phase, _)| phase.outcome.is_some())
        .filter(|(_, service)| service.grants_per_client_s < GRANTS_PER_CLIENT_S_MIN)
        .map(|(phase, service)| {
            format!(
                "{}: {} locks/s per client ({})",
                phase.name,
                service.grants_per_client_s,
                service.first_error.as_deref().unwrap_or("no error")
            )
        })
        .collect();
    let worst = phases
        .iter()
        .zip(services)
        .filter(|(phase, _)| phase.outcome.is_some())
        .map(|(_, service)| service.grants_per_client_s)
        .fold(f64::INFINITY, f64::min);
    Check {
        name: "good-clients-served",
        passed: slow.is_empty(),
        detail: if slow.is_empty() {
            format!("at least {worst} locks/s per client in every attack (bound {GRANTS_PER_CLIENT_S_MIN})")
        } else {
            slow.join("; ")
        },
    }
}

fn rss_check(memory: &Memory) -> Check {
    let over: Vec<String> = memory
        .hwm_kib
        .iter()
        .filter(|(_, &kib)| kib * 1024 > RSS_MAX_BYTES)
        .map(|(node, kib)| format!("node {node} reached {} MiB", kib / 1024))
        .collect();
    let peak = memory.hwm_kib.values().copied().max().unwrap_or(0);
    Check {
        name: "memory-bounded",
        passed: over.is_empty() && memory.samples > 0,
        detail: if over.is_empty() {
            format!(
                "peak {} MiB (bound {} MiB), {} samples",
                peak / 1024,
                RSS_MAX_BYTES >> 20,
                memory.samples
            )
        } else {
            over.join("; ")
        },
    }
}

fn probe_check(probes: &[Probe]) -> Check {
    let taken: Vec<&Probe> = probes.iter().filter(|probe| probe.taken).collect();
    let late: Vec<String> = taken
        .iter()
        .filter_map(|probe| probe.error.as_ref().map(|error| format!("{}: {error}", probe.key)))
        .collect();
    let freed: Vec<u64> = taken.iter().filter_map(|probe| probe.freed_after_ms).collect();
    let untaken = probes.len() - taken.len();
    Check {
        name: "leases-expire",
        passed: late.is_empty() && !freed.is_empty(),
        detail: if late.is_empty() {
            format!(
                "{} probe locks of {} ms seen free {}..{} ms after their grant was answered (every read sent \
                 more than {} ms after it found the lock gone); {untaken} could not be taken",
                freed.len(),
                PROBES.lease.as_millis(),
                freed.iter().min().copied().unwrap_or(0),
                freed.iter().max().copied().unwrap_or(0),
                (PROBES.lease + PROBES.grace).as_millis()
            )
        } else {
            late.join("; ")
        },
    }
}

impl RunRecord {
    /// The table printed and kept in the report: per phase, each node's
    /// peak resident memory and the good clients' service.
    fn table(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let nodes: String = self.nodes.iter().map(|id| format!("{:>8}", format!("node-{id}"))).collect();
        lines.push(format!(
            "{:<17}{nodes} {:>9} {:>10} {:>8} {:>8} {:>8} {:>7}",
            "phase (RSS MiB)", "locks", "/client/s", "p50 ms", "p99 ms", "gap ms", "errors"
        ));
        for (index, (phase, service)) in self.phases.iter().zip(&self.service).enumerate() {
            let rss: String = self
                .nodes
                .iter()
                .map(|id| match self.memory.rss_kib.get(&index).and_then(|nodes| nodes.get(id)) {
                    Some(kib) => format!("{:>8}", kib / 1024),
                    None => format!("{:>8}", "down"),
                })
                .collect();
            if phase.name == CATCH_UP {
                // The good clients have stopped.
                lines.push(format!("{:<17}{rss}", phase.name));
                continue;
            }
            lines.push(format!(
                "{:<17}{rss} {:>9} {:>10} {:>8} {:>8} {:>8} {:>7}",
                phase.name,
                service.acquires,
                service.grants_per_client_s,
                service.p50_ms,
                service.p99_ms,
                service.longest_gap_ms,
                service.acquires_failed + service.releases_failed
            ));
        }
        let peaks: String = self
            .nodes
            .iter()
            .map(|id| format!("{:>8}", self.memory.hwm_kib.get(id).map(|kib| kib / 1024).unwrap_or(0)))
            .collect();
        lines.push(format!("{:<17}{peaks}", "peak (VmHWM)"));
        lines
    }
}

/// The host's count of listen queue overflows (`TcpExt: ListenOverflows`
/// in /proc/net/netstat), if it can be read.
fn listen_overflows() -> Option<u64> {
    let text = fs::read_to_string("/proc/net/netstat").ok()?;
    let mut lines = text.lines().filter(|line| line.starts_with("TcpExt:"));
    let (names, values) = (lines.next()?, lines.next()?);
    let at = names.split_whitespace().position(|name| name == "ListenOverflows")?;
    values.split_whitespace().nth(at)?.parse().ok()
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Raises this process's open-file limit to its hard limit: the idle
/// connections attack holds 4,096 sockets. Best effort; an attack that
/// runs out of descriptors reports it.
fn raise_open_files() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limit_the_attacks_expect_is_passed_to_the_nodes() {
        let flags = server_flags();
        assert_eq!(flags.len(), 16);
        let at = flags.iter().position(|flag| flag == "--max-locks-per-owner").unwrap();
        assert_eq!(flags[at + 1], LIMITS.max_locks_per_owner.to_string());
        assert!(LIMITS.max_locks_per_owner + FILL_LOCKS as usize + 1_000 < LIMITS.max_locks);
    }

    #[test]
    fn service_counts_locks_per_client_second_and_the_longest_gap() {
        let start = Instant::now();
        let phases = vec![PhaseRecord {
            name: "quiet",
            start_s: 0.0,
            end_s: 2.0,
            listen_overflows: None,
            outcome: None,
        }];
        let call = |done_ms: u64, acquire: bool, error: Option<&str>| Call {
            phase: 0,
            acquire,
            done: start + Duration::from_millis(done_ms),
            latency_us: 1_000 * done_ms.min(10),
            error: error.map(str::to_owned),
        };
        let mut calls: Vec<Call> = (0..16).map(|i| call(100 + i * 10, true, None)).collect();
        calls.push(call(300, true, Some("cluster unavailable")));
        calls.push(call(400, false, None));
        calls.push(call(1_500, true, None));
        let service = &service(&calls, &phases, start).unwrap()[0];
        assert_eq!((service.acquires, service.acquires_failed, service.releases), (17, 1, 1));
        // 17 locks, 8 clients, 2 s.
        assert_eq!(service.grants_per_client_s, 1.1);
        // From the last early grant (250 ms) to the one at 1,500 ms.
        assert_eq!(service.longest_gap_ms, 1_250);
        assert_eq!(service.first_error.as_deref(), Some("cluster unavailable"));
    }

    #[test]
    fn the_hosts_listen_overflows_are_read() {
        assert!(listen_overflows().is_some());
    }
}
