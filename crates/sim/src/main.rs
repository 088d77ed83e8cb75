//! `fencelock-sim`: runs seeds of the simulation and reports each failure,
//! with the command that replays it. `cargo xtask sim` calls it.
//!
//! Usage: `fencelock-sim [--seeds N] [--first F] [--seed S] [--nodes 3|5] [--fault-ms T] [--heal-ms T] [--founding-level L] [--membership always|never|seed] [--jobs N]`
//!
//! A sweep runs its seeds on `--jobs` threads (every core by default). Each
//! seed is still one single-threaded, deterministic run: the threads only
//! share out the seeds, and a failure replays alone with `--seed`.

use std::num::NonZeroUsize;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use fencelock_sim::{run, Report, SimConfig};

/// Runs seeds of the whole-cluster simulation.
#[derive(Debug, Parser)]
#[command(
    name = "fencelock-sim",
    // As the hand-written parser did: a flag given twice keeps its last value.
    args_override_self = true
)]
struct Options {
    /// Seeds to sweep
    #[arg(long, value_name = "N", default_value_t = 100)]
    seeds: u64,
    /// The sweep's first seed
    #[arg(long, value_name = "F", default_value_t = 0)]
    first: u64,
    /// Runs this one seed and prints its report, instead of a sweep
    #[arg(long, value_name = "S")]
    seed: Option<u64>,
    /// Cluster size: 3 or 5 [default: 3 for even seeds, 5 for odd ones]
    #[arg(long, value_name = "3|5", value_parser = parse_nodes)]
    nodes: Option<usize>,
    /// Simulated milliseconds of faults [default: SimConfig's]
    #[arg(long, value_name = "T")]
    fault_ms: Option<u64>,
    /// Simulated milliseconds of healing [default: SimConfig's]
    #[arg(long, value_name = "T")]
    heal_ms: Option<u64>,
    /// The command level every seed founds its cluster at, 1 to this
    /// build's [default: drawn from the seed: 1 or 2 for one seed in eight
    /// each, else this build's]
    #[arg(long, value_name = "L", value_parser = parse_level)]
    founding_level: Option<u32>,
    /// Whether an operator changes the membership during the faults: on
    /// every seed, on none, or as each seed draws (one in seven, the
    /// default)
    #[arg(long, value_name = "WHEN", value_enum, default_value_t = Membership::Seed)]
    membership: Membership,
    /// Threads that run seeds [default: the available parallelism]
    #[arg(long, value_name = "N")]
    jobs: Option<NonZeroUsize>,
}

/// When seeds change their cluster's membership.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Membership {
    Always,
    Never,
    Seed,
}

/// Every this many seeds, a long sweep says how far it got.
const PROGRESS_EVERY: u64 = 1_000;

fn main() -> ExitCode {
    let options = Options::parse();
    let (first, count) = match options.seed {
        Some(seed) => (seed, 1),
        None => (options.first, options.seeds),
    };
    if first.checked_add(count).is_none() {
        eprintln!(
            "fencelock-sim: --first {first} with --seeds {count} runs past the last seed, {}",
            u64::MAX
        );
        return ExitCode::from(2);
    }
    let jobs = options
        .jobs
        .or_else(|| std::thread::available_parallelism().ok())
        .map_or(1, NonZeroUsize::get)
        .min(usize::try_from(count).unwrap_or(usize::MAX))
        .max(1);

    let started = Instant::now();
    let mut sim_ms = 0;
    let mut done = 0;
    let mut failed = 0;
    // How often each check judged something, over the sweep.
    let mut judged: Vec<(&'static str, u64)> = Vec::new();
    // Seeds by the command level they founded their cluster at.
    let mut founded = vec![0u64; fencelock_types::LEVEL as usize + 1];
    // Seeds with an operator, and the members it added and removed.
    let (mut changing, mut added, mut removed) = (0u64, 0u64, 0u64);
    let next = AtomicU64::new(0);
    let (sender, reports) = mpsc::channel::<Report>();
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            let (sender, next, options) = (sender.clone(), &next, &options);
            scope.spawn(move || loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= count {
                    break;
                }
                // The receiver lives until every sender is gone.
                if sender.send(run(options.config(first + index))).is_err() {
                    break;
                }
            });
        }
        drop(sender);
        // Reports come in as seeds finish, in no fixed order.
        for report in reports {
            done += 1;
            sim_ms += report.sim_ms;
            if let Some(seeds) = founded.get_mut(report.founding_level as usize) {
                *seeds += 1;
            }
            if report.membership {
                changing += 1;
                added += report.members_added;
                removed += report.members_removed;
            }
            for (check, count) in &report.judged {
                match judged.iter_mut().find(|(name, _)| name == check) {
                    Some((_, total)) => *total += count,
                    None => judged.push((check, *count)),
                }
            }
            if report.result.is_err() {
                failed += 1;
            }
            if report.result.is_err() || options.seed.is_some() {
                println!("{report}");
            }
            if count >= 2 * PROGRESS_EVERY && done % PROGRESS_EVERY == 0 && done < count {
                eprintln!(
                    "sim: {done} of {count} seeds, {failed} failed, {:.0} s",
                    started.elapsed().as_secs_f64()
                );
            }
        }
    });

    let wall = started.elapsed().as_secs_f64();
    println!(
        "{} seeds, {} failed; {:.0} simulated s in {:.1} wall s: {:.0}x real time",
        done,
        failed,
        sim_ms as f64 / 1_000.0,
        wall,
        sim_ms as f64 / 1_000.0 / wall.max(1e-9)
    );
    let judged: Vec<String> = judged.iter().map(|(check, count)| format!("{count} {check}")).collect();
    println!("checks judged: {}", judged.join(", "));
    let founded: Vec<String> = founded
        .iter()
        .enumerate()
        .skip(1)
        .map(|(level, seeds)| format!("{seeds} at level {level}"))
        .collect();
    println!("clusters founded: {}", founded.join(", "));
    println!("membership changed in {changing} seeds: {added} members added, {removed} removed");
    println!("sim: {} passed, {} failed", done - failed, failed);
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

impl Options {
    fn config(&self, seed: u64) -> SimConfig {
        let nodes = self.nodes.unwrap_or(if seed.is_multiple_of(2) { 3 } else { 5 });
        let mut config = SimConfig::new(seed, nodes);
        config.fault_ms = self.fault_ms.unwrap_or(config.fault_ms);
        config.heal_ms = self.heal_ms.unwrap_or(config.heal_ms);
        config.founding_level = self.founding_level.unwrap_or(config.founding_level);
        config.membership = match self.membership {
            Membership::Always => true,
            Membership::Never => false,
            Membership::Seed => fencelock_sim::membership_changes(seed),
        };
        config
    }
}

fn parse_level(text: &str) -> Result<u32, String> {
    match text.parse() {
        Ok(level @ 1..=fencelock_types::LEVEL) => Ok(level),
        _ => Err(format!("--founding-level is a level from 1 to {}", fencelock_types::LEVEL)),
    }
}

fn parse_nodes(text: &str) -> Result<usize, String> {
    match text.parse() {
        Ok(nodes @ (3 | 5)) => Ok(nodes),
        _ => Err("--nodes is 3 or 5".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Options::try_parse_from(["fencelock-sim"].iter().chain(args))
    }

    #[test]
    fn flags_keep_their_meaning() {
        use clap::CommandFactory;
        Options::command().debug_assert();
        let plain = parse(&[]).unwrap();
        assert_eq!(
            (plain.seeds, plain.first, plain.seed, plain.nodes, plain.jobs, plain.founding_level),
            (100, 0, None, None, None, None)
        );
        assert_eq!(plain.config(4).founding_level, fencelock_sim::founding_level(4));
        assert_eq!(plain.membership, Membership::Seed);
        for seed in 0..20 {
            assert_eq!(plain.config(seed).membership, fencelock_sim::membership_changes(seed));
        }
        assert!((0..100).any(|seed| plain.config(seed).membership), "the default changes no member");
        let drawn = parse(&["--membership", "seed"]).unwrap();
        for seed in 0..20 {
            assert_eq!(drawn.config(seed).membership, fencelock_sim::membership_changes(seed));
        }
        assert!(parse(&["--membership", "always"]).unwrap().config(4).membership);
        assert!(!parse(&["--membership", "never"]).unwrap().config(10).membership);
        assert_eq!(plain.config(4).nodes, 3);
        assert_eq!(plain.config(5).nodes, 5);
        let given = parse(&[
            "--seeds",
            "7",
            "--first",
            "9",
            "--nodes",
            "5",
            "--fault-ms",
            "100",
            "--heal-ms",
            "200",
            "--jobs",
            "3",
            "--founding-level",
            "1",
        ])
        .unwrap();
        assert_eq!((given.seeds, given.first, given.jobs.map(NonZeroUsize::get)), (7, 9, Some(3)));
        let config = given.config(4);
        assert_eq!((config.seed, config.nodes, config.fault_ms, config.heal_ms), (4, 5, 100, 200));
        assert_eq!(config.founding_level, 1);
        assert_eq!(parse(&["--seed", "1", "--seed", "2"]).unwrap().seed, Some(2));
        for (bad, says) in [
            (&["--nodes", "4"][..], "--nodes is 3 or 5"),
            (&["--seeds", "many"], "--seeds"),
            (&["--jobs", "0"], "--jobs"),
            (&["--founding-level", "0"], "--founding-level is a level from 1 to"),
            (&["--founding-level", "9"], "--founding-level is a level from 1 to"),
            (&["--membership", "sometimes"], "--membership"),
            (&["--first"], "--first"),
            (&["--replay"], "--replay"),
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }
}
