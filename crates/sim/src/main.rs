//! `fencelock-sim`: runs seeds of the simulation and reports each, with the
//! command that replays a failure. `cargo xtask sim` calls it.
//!
//! Usage: `fencelock-sim [--seeds N] [--first F] [--seed S] [--nodes 3|5] [--fault-ms T] [--heal-ms T]`

use std::process::ExitCode;
use std::time::Instant;

use fencelock_sim::{run, SimConfig};

fn main() -> ExitCode {
    let mut seeds = 100u64;
    let mut first = 0u64;
    let mut single = None;
    let mut nodes = None;
    let mut fault_ms = None;
    let mut heal_ms = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> Option<u64> {
            let parsed = args.next().and_then(|v| v.parse().ok());
            if parsed.is_none() {
                eprintln!("fencelock-sim: {name} takes a number");
            }
            parsed
        };
        match arg.as_str() {
            "--seeds" => match value("--seeds") {
                Some(n) => seeds = n,
                None => return ExitCode::from(1),
            },
            "--first" => match value("--first") {
                Some(n) => first = n,
                None => return ExitCode::from(1),
            },
            "--seed" => match value("--seed") {
                Some(n) => single = Some(n),
                None => return ExitCode::from(1),
            },
            "--fault-ms" => match value("--fault-ms") {
                Some(n) => fault_ms = Some(n),
                None => return ExitCode::from(1),
            },
            "--heal-ms" => match value("--heal-ms") {
                Some(n) => heal_ms = Some(n),
                None => return ExitCode::from(1),
            },
            "--nodes" => match value("--nodes") {
                Some(n @ (3 | 5)) => nodes = Some(n as usize),
                _ => {
                    eprintln!("fencelock-sim: --nodes is 3 or 5");
                    return ExitCode::from(1);
                }
            },
            other => {
                eprintln!("fencelock-sim: unknown argument `{other}`\nusage: fencelock-sim [--seeds N] [--first F] [--seed S] [--nodes 3|5] [--fault-ms T] [--heal-ms T]");
                return ExitCode::from(1);
            }
        }
    }
    let seeds: Vec<u64> = match single {
        Some(seed) => vec![seed],
        None => (first..first + seeds).collect(),
    };
    let started = Instant::now();
    let mut sim_ms = 0;
    let mut failed = 0;
    for seed in &seeds {
        let nodes = nodes.unwrap_or(if seed % 2 == 0 { 3 } else { 5 });
        let mut config = SimConfig::new(*seed, nodes);
        config.fault_ms = fault_ms.unwrap_or(config.fault_ms);
        config.heal_ms = heal_ms.unwrap_or(config.heal_ms);
        let report = run(config);
        sim_ms += report.sim_ms;
        if report.result.is_err() {
            failed += 1;
        }
        if report.result.is_err() || single.is_some() {
            println!("{report}");
        }
    }
    let wall = started.elapsed().as_secs_f64();
    println!(
        "{} seeds, {} failed; {:.0} simulated s in {:.1} wall s: {:.0}x real time",
        seeds.len(),
        failed,
        sim_ms as f64 / 1_000.0,
        wall,
        sim_ms as f64 / 1_000.0 / wall.max(1e-9)
    );
    println!("sim: {} passed, {} failed", seeds.len() - failed, failed);
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
