//! fencelock-suite: real `fencelockd` clusters on 127.0.0.1 under faults,
//! with a fenced store and a checker of the recorded history.
//!
//! `cargo xtask suite [NAME|all] [--duration 60s] [--seed N] [--nodes 3|5]`
//! builds the binaries and runs this one; it can also run by hand:
//!
//! ```text
//! fencelock-suite all --server target/debug/fencelockd --duration 15s
//! fencelock-suite partition --server target/debug/fencelockd --seed 42 --nodes 5
//! fencelock-suite --list
//! ```
//!
//! Each suite starts a fresh cluster behind fault-injecting proxies, runs
//! client threads that take locks and write to a fenced store while a seeded
//! nemesis kills, pauses, partitions or skews nodes or cuts the clients'
//! connections, heals, watches the cluster converge, and checks the
//! history. It prints a summary, writes a JSON report, and exits 1 on any
//! violation, printing the command that replays the run's schedule.
//! `docs/suites.md` describes it all.

mod checker;
mod cluster;
mod converge;
mod hangup;
mod history;
mod hostile;
mod nemesis;
mod proxy;
mod report;
mod rng;
mod run;
mod store;
mod tls;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Result};
use clap::Parser;

use crate::run::Settings;

#[derive(Debug, Parser)]
#[command(
    name = "fencelock-suite",
    about = "Runs real fencelockd clusters under faults and checks that fencing tokens keep a resource safe."
)]
struct Cli {
    /// `all`, a suite (kill, pause, partition, clock-skew, lose-data,
    /// client-resets, membership, combined), or one fault alone
    /// (kill-leader, kill-random, kill-all, pause-leader, pause-holder,
    /// partition-halves, isolate-leader, bridge, clock-skew, lose-data,
    /// reset-clients, grow-shrink, replace-node); or
    /// `hostile`: clients that break the rules, run on its own (not in
    /// `all`).
    #[arg(default_value = "all")]
    name: String,
    /// The fencelockd binary.
    #[arg(long, default_value = "target/debug/fencelockd")]
    server: PathBuf,
    /// How long the workload runs under the fault schedule, per suite.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// The seed of every random choice; a fresh one when not given.
    #[arg(long)]
    seed: Option<u64>,
    /// Cluster size: 3 or 5.
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Where each run's directory (logs, history, report) goes.
    #[arg(long, default_value = "target/suites")]
    out: PathBuf,
    /// How long the healed cluster may take to serve again and converge.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    converge_within: Duration,
    /// Every cluster speaks TLS on both ports (certificates made for the
    /// run); the clients too. Not for client-resets, whose raw connections
    /// speak plain TCP.
    #[arg(long)]
    tls: bool,
    /// Lists the suites and faults, and exits.
    #[arg(long)]
    list: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(err) => {
            eprintln!("fencelock-suite: {err:#}");
            ExitCode::from(1)
        }
    }
}

/// True when every suite passed (or was skipped).
fn run(cli: &Cli) -> Result<bool> {
    if cli.list {
        for suite in run::suites() {
            let kinds: Vec<&str> = suite.kinds.iter().map(|kind| kind.name()).collect();
            println!("{:<13} {} [{}]", suite.name, suite.about, kinds.join(", "));
        }
        println!(
            "{:<13} floods of waiters, partial frames, a client that never reads, idle connections, peer-port \
             garbage, a lock-table flood and a log flood, beside well-behaved clients (not in `all`)",
            "hostile"
        );
        return Ok(true);
    }
    if !matches!(cli.nodes, 3 | 5) {
        bail!("--nodes must be 3 or 5");
    }
    if cli.duration < Duration::from_secs(5) {
        bail!("--duration must be at least 5s: the schedule keeps quiet time at both ends");
    }
    if !cli.server.exists() {
        bail!("{} does not exist: build it first (cargo build --bin fencelockd)", cli.server.display());
    }
    if cli.name == "hostile" {
        let settings = Settings {
            server: cli.server.clone(),
            out: cli.out.clone(),
            seed: cli.seed.unwrap_or_else(fresh_seed),
            nodes: cli.nodes,
            duration: cli.duration,
            converge_within: cli.converge_within,
            faketime: None,
            tls: cli.tls,
        };
        return hostile::run(&settings);
    }
    let Some(suites) = run::select(&cli.name) else {
        bail!("no suite or fault named `{}`; `--list` shows them", cli.name);
    };
    if cli.tls {
        let cannot: Vec<String> = suites
            .iter()
            .filter(|suite| suite.kinds.iter().any(|kind| kind.needs_plain_peers()))
            .map(|suite| suite.name.clone())
            .collect();
        if !cannot.is_empty() {
            bail!(
                "--tls does not go with partitions, client resets or membership changes (the proxies read peer \
                 hellos, the resets speak plain TCP, an added node has no certificate): {}",
                cannot.join(", ")
            );
        }
    }
    let seed = cli.seed.unwrap_or_else(fresh_seed);
    let settings = Settings {
        server: cli.server.clone(),
        out: cli.out.clone(),
        seed,
        nodes: cli.nodes,
        duration: cli.duration,
        converge_within: cli.converge_within,
        faketime: run::find_faketime(),
        tls: cli.tls,
    };
    let mut verdicts = Vec::new();
    for suite in &suites {
        let verdict = match run::run(suite, &settings) {
            Ok(verdict) => verdict,
            Err(err) => {
                eprintln!("suite {}: could not run: {err:#}", suite.name);
                run::Verdict {
                    name: suite.name.clone(),
                    passed: false,
                    skipped: None,
                    report: None,
                    replay: run::replay_command(&suite.name, &settings),
                }
            }
        };
        if let Some(reason) = &verdict.skipped {
            println!("suite {}: skipped: {reason}\n", suite.name);
        } else {
            println!();
        }
        verdicts.push(verdict);
    }
    let failed: Vec<&run::Verdict> = verdicts.iter().filter(|verdict| !verdict.passed).collect();
    let ran = verdicts.iter().filter(|verdict| verdict.skipped.is_none()).count();
    println!(
        "fencelock-suite: {} of {ran} suites passed, {} skipped (seed {seed})",
        ran - failed.len(),
        verdicts.len() - ran
    );
    for verdict in &failed {
        let report =
            verdict.report.as_ref().map(|path| format!(" (report {})", path.display())).unwrap_or_default();
        println!("  FAILED {}{report}; replay: {}", verdict.name, verdict.replay);
    }
    Ok(failed.is_empty())
}

/// A seed from the clock, for runs that do not name one.
fn fresh_seed() -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    // Mixed so that runs started close together differ in every bit.
    rng::SplitMix64::new(nanos as u64 ^ u64::from(std::process::id())).next_u64() % 1_000_000_000
}
