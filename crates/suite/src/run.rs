//! One suite run from start to verdict: start the cluster behind its
//! proxies, run the workload, the monitor and the fault schedule together,
//! heal, watch the cluster converge, stop it, check the history, and write
//! the report.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use fencelock_client::Client;
use serde_json::json;

use crate::checker::{self, Check};
use crate::cluster::{self, Cluster, ClusterConfig};
use crate::converge;
use crate::nemesis::{self, Fault, FaultKind};
use crate::report::{self, LeaderSample};
use crate::rng::SplitMix64;
use crate::workload::{self, Shared, WorkloadConfig};

/// A suite: a name and the fault kinds its schedule draws from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suite {
    pub name: String,
    pub about: String,
    pub kinds: Vec<FaultKind>,
}

/// The suites `all` runs, in order.
pub fn suites() -> Vec<Suite> {
    use FaultKind::*;
    let suite = |name: &str, about: &str, kinds: &[FaultKind]| Suite {
        name: name.to_owned(),
        about: about.to_owned(),
        kinds: kinds.to_vec(),
    };
    // The membership changes stay out of the combined suite: partitions,
    // bridges and clock skew name nodes by the initial ids.
    let combined: Vec<FaultKind> =
        FaultKind::ALL.into_iter().filter(|kind| !kind.changes_membership()).collect();
    vec![
        suite(
            "kill",
            "kill -9 and restart of the leader, of a random node, and of all nodes at once",
            &[KillLeader, KillRandom, KillAll],
        ),
        suite(
            "pause",
            "SIGSTOP/SIGCONT of the leader; a lock holder paused past its lease",
            &[PauseLeader, PauseHolder],
        ),
        suite(
            "partition",
            "majority/minority, the leader isolated, and a bridge, through the proxies",
            &[PartitionHalves, IsolateLeader, Bridge],
        ),
        suite(
            "clock-skew",
            "every node restarted with its own clock rate, a majority fast (libfaketime)",
            &[ClockSkew],
        ),
        suite(
            "lose-data",
            "kill -9 of a node and deletion of its data directory; it restarts blank and rejoins",
            &[LoseData],
        ),
        suite(
            "client-resets",
            "clients hang up on each acquire before its answer and retry it on another connection",
            &[ResetClients],
        ),
        suite(
            "membership",
            "nodes join, are promoted and removed, and a killed node is replaced, mixed with kill -9, \
             partitions and lost data directories (a node whose --peers went stale rejoins)",
            &[GrowShrink, ReplaceNode, KillRandom, PartitionHalves, IsolateLeader, LoseData],
        ),
        suite("combined", "every fault above but the membership changes, dealt in a seeded order", &combined),
    ]
}

/// The suites a name selects: `all`, a suite's name, or one fault kind's
/// name (a suite of that fault alone).
pub fn select(name: &str) -> Option<Vec<Suite>> {
    if name == "all" {
        return Some(suites());
    }
    if let Some(suite) = suites().into_iter().find(|suite| suite.name == name) {
        return Some(vec![suite]);
    }
    FaultKind::from_name(name)
        .map(|kind| vec![Suite { name: name.to_owned(), about: format!("{name} alone"), kinds: vec![kind] }])
}

/// What every run of one invocation shares.
#[derive(Clone, Debug)]
pub struct Settings {
    pub server: PathBuf,
    pub out: PathBuf,
    pub seed: u64,
    pub nodes: u64,
    pub duration: Duration,
    pub converge_within: Duration,
    /// libfaketime, for clock skew; `None` when it is not installed.
    pub faketime: Option<PathBuf>,
    /// Clusters and clients speak TLS.
    pub tls: bool,
}

/// How one suite ended.
#[derive(Debug)]
pub struct Verdict {
    pub name: String,
    pub passed: bool,
    /// Why the suite did not run, if it did not (not a failure).
    pub skipped: Option<String>,
    pub report: Option<PathBuf>,
    pub replay: String,
}

/// Where libfaketime usually lives, or `$FENCELOCK_FAKETIME`.
pub fn find_faketime() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("FENCELOCK_FAKETIME") {
        let path = PathBuf::from(path);
        return path.exists().then_some(path);
    }
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|path| path.exists())
}

/// The environment that makes a node's clocks (monotonic ones included)
/// run at `rate` times real time.
fn skew_env(faketime: &Path, rate: f64) -> Vec<(String, String)> {
    vec![
        ("LD_PRELOAD".to_owned(), faketime.display().to_string()),
        ("FAKETIME".to_owned(), format!("+0 x{rate}")),
        // Fake CLOCK_MONOTONIC too: leases are measured on it.
        ("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "0".to_owned()),
        ("FAKETIME_NO_CACHE".to_owned(), "1".to_owned()),
    ]
}

/// The command that replays a run's schedule. The duration is one word
/// (`90s`, not humantime's `1m 30s`), so that it pastes into a shell.
pub fn replay_command(name: &str, settings: &Settings) -> String {
    let duration = if settings.duration.subsec_millis() == 0 {
        format!("{}s", settings.duration.as_secs())
    } else {
        format!("{}ms", settings.duration.as_millis())
    };
    format!(
        "cargo xtask suite {name} --seed {} --duration {duration} --nodes {}{}",
        settings.seed,
        settings.nodes,
        if settings.tls { " --tls" } else { "" }
    )
}

/// Runs `suite` and writes its report; an error means the run itself could
/// not be carried out (no leader at the start, a process that would not
/// start), which also fails.
pub fn run(suite: &Suite, settings: &Settings) -> Result<Verdict> {
    let replay = replay_command(&suite.name, settings);
    let mut kinds = suite.kinds.clone();
    if settings.faketime.is_none() && kinds.contains(&FaultKind::ClockSkew) {
        kinds.retain(|kind| *kind != FaultKind::ClockSkew);
        if kinds.is_empty() {
            let reason =
                "libfaketime is not installed (apt-get install libfaketime, or set FENCELOCK_FAKETIME), \
                          and fencelockd has no test clock of its own: see docs/suites.md"
                    .to_owned();
            return Ok(Verdict {
                name: suite.name.clone(),
                passed: true,
                skipped: Some(reason),
                report: None,
                replay,
            });
        }
    }
    let dir = settings.out.join(format!("{}-{}", suite.name, settings.seed));
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    eprintln!(
        "suite {}: {} ({} nodes, {:?}, seed {})",
        suite.name, suite.about, settings.nodes, settings.duration, settings.seed
    );

    let mut rng = SplitMix64::new(settings.seed);
    let mut schedule_rng = rng.fork();
    let mut workload_rng = rng.fork();
    let workload_config = WorkloadConfig::new(settings.nodes);
    let duration_ms = u64::try_from(settings.duration.as_millis()).unwrap_or(u64::MAX);
    let steps =
        nemesis::schedule(&kinds, settings.nodes, workload_config.clients, duration_ms, &mut schedule_rng);

    let mut cluster = Cluster::start(&ClusterConfig {
        server: settings.server.clone(),
        dir: dir.clone(),
        nodes: settings.nodes,
        node_env: Vec::new(),
        tls: settings.tls,
    })?;
    cluster.wait_for_leader(Duration::from_secs(30))?;

    let start = Instant::now();
    let deadline = start + settings.duration;
    let shared = Arc::new(Shared::new(start, workload_config.clients));
    let endpoints = cluster.endpoints();
    let clients = workload::spawn(&workload_config, &endpoints, &shared, deadline, &mut workload_rng)?;
    let stop_monitor = Arc::new(AtomicBool::new(false));
    let monitor = spawn_monitor(&endpoints, cluster.watched(), &shared, deadline, &stop_monitor)?;

    let faketime = settings.faketime.clone();
    let skew = move |rate: f64| faketime.as_deref().map(|lib| skew_env(lib, rate));
    let records = nemesis::run(&steps, &mut cluster, start, &shared.recorder, &shared.faults, &skew);
    let heal_error = cluster.heal_all().err();
    for client in clients {
        let _ = client.join();
    }
    let run_us = shared.recorder.now_us();
    stop_monitor.store(true, Ordering::SeqCst);
    let samples = monitor.join().unwrap_or_default();

    let convergence = converge::watch(
        &cluster,
        &workload_config.keys,
        "suite/",
        &shared.recorder,
        settings.converge_within,
        workload_config.clients,
    );
    cluster.stop();

    let ops = shared.recorder.ops();
    let store = shared.store.log();
    let skew_windows: Vec<(u64, u64)> = records
        .iter()
        .filter(|record| matches!(record.fault, Fault::ClockSkew { .. }))
        .map(|record| (record.begin_us, record.end_us))
        .collect();
    let input = checker::Input {
        ops: &ops,
        store: &store,
        listing: convergence.listing.as_ref(),
        convergence: Some(&convergence),
        skew_windows: &skew_windows,
    };
    let mut checks = checker::check(&input);
    let membership_failures: Vec<String> = records
        .iter()
        .filter(|record| record.kind.changes_membership())
        .filter_map(|record| record.error.as_ref().map(|error| format!("{}: {error}", record.kind.name())))
        .collect();
    if kinds.iter().any(|kind| kind.changes_membership()) {
        checks.push(Check {
            name: "membership",
            about: "every join, promotion and removal was done, and every removed node stopped with code 3",
            enforced: true,
            violations: membership_failures.len(),
            examples: membership_failures.into_iter().take(5).collect(),
        });
    }
    if let Some(error) = heal_error {
        checks.push(Check {
            name: "heal",
            about: "every fault could be undone at the end",
            enforced: true,
            violations: 1,
            examples: vec![format!("{error:#}")],
        });
    }
    let figures = report::figures(&ops, &records, &samples, run_us);
    let passed = !checks.iter().any(Check::fails_run);
    let duration_s = settings.duration.as_secs_f64();
    let summary = report::summary(
        &suite.name,
        settings.seed,
        settings.nodes,
        duration_s,
        &records,
        &figures,
        &convergence,
        &checks,
    );

    let history_path = dir.join("history.json");
    let history = json!({ "ops": ops, "store": store, "faults": records, "leader_samples": samples });
    fs::write(&history_path, serde_json::to_vec(&history)?)
        .with_context(|| format!("cannot write {}", history_path.display()))?;
    let report_path = dir.join("report.json");
    let report = json!({
        "suite": suite.name,
        "about": suite.about,
        "passed": passed,
        "seed": settings.seed,
        "replay": replay,
        "nodes": settings.nodes,
        "duration_s": duration_s,
        "started_unix": SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        "server": settings.server.display().to_string(),
        "cluster": {
            "tick_ms": cluster::TICK_MS,
            "election_ms": cluster::ELECTION_MS,
            "heartbeat_ms": cluster::HEARTBEAT_MS,
            "lease_min_ms": cluster::LEASE_MIN_MS,
        },
        "workload": {
            "clients": workload_config.clients,
            "keys": workload_config.keys,
            "lease_ms": workload_config.lease_ms,
            "wait_ms": workload_config.wait_ms,
            "overstay_chance": workload_config.overstay_chance,
            "reset_hold_ms": workload_config.reset_hold_ms,
        },
        "kinds": kinds,
        "nodes_addrs": cluster.describe(),
        "schedule": steps,
        "faults": records,
        "proxy": {
            "connections_refused": cluster.rules.refused.load(Ordering::Relaxed),
            "connections_cut": cluster.rules.cut.load(Ordering::Relaxed),
        },
        "figures": figures,
        "convergence": convergence,
        "checks": checks,
        "files": {
            "history": history_path.display().to_string(),
            "logs": cluster.log_paths().iter().map(|path| path.display().to_string()).collect::<Vec<_>>(),
        },
    });
    fs::write(&report_path, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("cannot write {}", report_path.display()))?;

    println!("{summary}  report: {}", report_path.display());
    if passed {
        // The data directories are only needed to look into a failure.
        cluster.remove_data();
    } else {
        println!("  replay: {replay}");
    }
    Ok(Verdict { name: suite.name.clone(), passed, skipped: None, report: Some(report_path), replay })
}

/// Polls every node's status until `deadline` or `stop`, recording who led.
fn spawn_monitor(
    endpoints: &[String],
    watched: cluster::Watched,
    shared: &Arc<Shared>,
    deadline: Instant,
    stop: &Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<Vec<LeaderSample>>> {
    let mut config = crate::tls::client_config(endpoints.iter().cloned());
    config.request_timeout = cluster::STATUS_TIMEOUT;
    config.retry_for = Duration::ZERO;
    config.owner = Some(crate::tls::owner("suite-monitor").into_bytes());
    let client = Client::connect(config)?;
    let shared = Arc::clone(shared);
    let stop = Arc::clone(stop);
    std::thread::Builder::new()
        .name("monitor".into())
        .spawn(move || {
            let mut samples = Vec::new();
            while Instant::now() < deadline && !stop.load(Ordering::SeqCst) {
                let nodes = watched.lock().unwrap_or_else(PoisonError::into_inner).clone();
                let statuses: Vec<_> =
                    nodes.iter().map(|(id, endpoint)| (*id, client.status(endpoint).ok())).collect();
                // Stamped when the last answer is in: a paused node makes a
                // round take its whole timeout, and the leader it names was
                // seen by then at the latest.
                let at_us = shared.recorder.now_us();
                let leader = cluster::leader_of(&statuses);
                samples.push(LeaderSample {
                    at_us,
                    leader: leader.map(|(id, _)| id),
                    term: leader.map(|(_, term)| term),
                });
                // The sampling period, not a wait for a condition.
                std::thread::sleep(Duration::from_millis(100));
            }
            samples
        })
        .context("cannot start the monitor thread")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_select_all_a_suite_or_one_fault() {
        let all = select("all").unwrap();
        assert_eq!(
            all.iter().map(|suite| suite.name.as_str()).collect::<Vec<_>>(),
            [
                "kill",
                "pause",
                "partition",
                "clock-skew",
                "lose-data",
                "client-resets",
                "membership",
                "combined"
            ]
        );
        let combined = &all[all.len() - 1].kinds;
        assert!(combined.iter().all(|kind| !kind.changes_membership()));
        assert_eq!(combined.len(), FaultKind::ALL.len() - 2);
        // Every fault kind belongs to some suite besides the combined one.
        for kind in FaultKind::ALL {
            assert!(all[..all.len() - 1].iter().any(|suite| suite.kinds.contains(&kind)), "{kind:?}");
        }
        assert_eq!(select("partition").unwrap()[0].kinds.len(), 3);
        assert_eq!(select("bridge").unwrap()[0].kinds, vec![FaultKind::Bridge]);
        assert!(select("nope").is_none());
    }

    #[test]
    fn the_replay_command_names_everything_the_schedule_depends_on() {
        let settings = Settings {
            tls: false,
            server: PathBuf::from("fencelockd"),
            out: PathBuf::from("out"),
            seed: 42,
            nodes: 5,
            duration: Duration::from_secs(90),
            converge_within: Duration::from_secs(20),
            faketime: None,
        };
        assert_eq!(
            replay_command("kill", &settings),
            "cargo xtask suite kill --seed 42 --duration 90s --nodes 5"
        );
    }

    #[test]
    fn a_skewed_node_fakes_its_monotonic_clock_too() {
        let env = skew_env(Path::new("/lib/libfaketime.so.1"), 1.5);
        assert!(env.contains(&("FAKETIME".to_owned(), "+0 x1.5".to_owned())));
        assert!(env.contains(&("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "0".to_owned())));
        assert!(env.contains(&("LD_PRELOAD".to_owned(), "/lib/libfaketime.so.1".to_owned())));
    }
}
