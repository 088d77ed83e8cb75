//! Throughput of a 3-node in-process cluster (real drivers, raft-engine on
//! disk with fsync, channels instead of sockets) under 256 concurrent
//! proposers, each doing acquire then release on its own keys.
//!
//! `cargo bench -p fencelock-raft --bench throughput` prints commands per
//! second and how well proposals batch: requests per entry and per fsync.
//! `FENCELOCK_BENCH_SECS` sets the measuring time (default 5) and
//! `FENCELOCK_BENCH_PROPOSERS` the concurrency (default 256).

#[path = "../tests/it/harness.rs"]
mod harness;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fencelock_raft::Response;
use fencelock_types::ApplyResult;
use harness::{grant, release, Cluster};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass
    // nothing useful either way, so a bare run measures.
    let seconds = env_or("FENCELOCK_BENCH_SECS", 5);
    let proposers = env_or("FENCELOCK_BENCH_PROPOSERS", 256);
    let cluster = Cluster::start_with(3, |config| config.raft.snapshot_interval_entries = 50_000);
    let leader = cluster.leader();
    let commands = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let warmup = Duration::from_secs(1);
    let started = Instant::now();
    let mut measured_from = 0;
    std::thread::scope(|scope| {
        for proposer in 0..proposers {
            let (cluster, commands, stop) = (&cluster, &commands, &stop);
            scope.spawn(move || {
                let owner = format!("proposer-{proposer}");
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("bench/{proposer}/{}", round % 16);
                    round += 1;
                    let Ok(Response::Applied(results)) = cluster.propose(leader, vec![grant(&name, &owner)])
                    else {
                        continue;
                    };
                    let [ApplyResult::Granted { token, .. }] = results.as_slice() else {
                        continue;
                    };
                    commands.fetch_add(1, Ordering::Relaxed);
                    if cluster.propose(leader, vec![release(&name, Some(*token))]).is_ok() {
                        commands.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        std::thread::sleep(warmup);
        measured_from = commands.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs(seconds));
        stop.store(true, Ordering::Relaxed);
    });
    let elapsed = started.elapsed() - warmup;
    let measured = commands.load(Ordering::Relaxed) - measured_from;
    let leader_stats = {
        let status = cluster.status(leader).expect("leader still running");
        assert_eq!(status.role, fencelock_raft::Role::Leader, "leadership moved during the run");
        let mut cluster = cluster;
        cluster.crash(leader).expect("leader stops cleanly")
    };
    println!("3 nodes, {proposers} proposers, raft-engine with fsync, {seconds} s measured");
    println!("commands/s (acquire + release each count one): {:.0}", measured as f64 / elapsed.as_secs_f64());
    println!(
        "leader: {} requests in {} entries over {} syncs: {:.1} requests/entry, {:.1} requests/fsync",
        leader_stats.requests_proposed,
        leader_stats.entries_proposed,
        leader_stats.syncs,
        leader_stats.requests_proposed as f64 / leader_stats.entries_proposed.max(1) as f64,
        leader_stats.requests_proposed as f64 / leader_stats.syncs.max(1) as f64,
    );
}
