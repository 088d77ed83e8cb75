//! The workspace's automation, in Rust: `cargo xtask <task>`.
//!
//! A bare `cargo xtask` lists the tasks. Each task is a few calls to cargo
//! with the repository root as the working directory, so it behaves the same
//! from any folder, on a developer's machine and in CI.

mod bench;
mod canaries;
mod cluster;
mod python;
mod suite;
mod tidy;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::{Args, CommandFactory, Parser, Subcommand};

/// `cargo xtask`: the command line. Every task's flags are its own struct,
/// beside the task's code.
#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "The workspace's automation: cargo xtask <task>",
    // As the hand-written parsers did: a flag given twice keeps its last value.
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    task: Option<Task>,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Everything CI checks: format, clippy (warnings denied), tidy, build, all tests,
    /// every suite briefly, the Python client's tests, a 10,000-seed simulation sweep
    Ci,
    /// Architecture rules: dependency arrows, module docs, banned APIs in the cores
    Tidy,
    /// Throughput and latency of a real 3-node cluster (release build)
    Bench(bench::Options),
    /// Deterministic simulation sweep: --seeds N [--first F] | --seed S, [--nodes 3|5] [--jobs N]
    Sim(SimOptions),
    /// A local fencelockd cluster: start [--nodes 3|5] [--dir D] | stop | status
    Cluster(cluster::Options),
    /// Real clusters under faults, checked: [NAME|all] [--duration D] [--seed N] [--nodes 3|5]
    Suite(suite::Options),
    /// Deliberate bugs applied to a scratch copy of HEAD, each of which its test must catch
    /// (not part of ci)
    Canaries,
    /// The Python client's tests (clients/python) against real fencelockd processes
    Python,
}

/// `cargo xtask sim`: every argument goes to the `fencelock-sim` binary.
#[derive(Debug, Args)]
#[command(after_help = "\
Every argument goes to the fencelock-sim binary, built in release:
  --seeds N      seeds to sweep (100)          --first F     the sweep's first seed (0)
  --seed S       replay one seed               --nodes 3|5   (default: 3 for even seeds, 5 for odd)
  --fault-ms T   simulated ms of faults        --heal-ms T   simulated ms of healing
  --jobs N       threads (default: all cores)
`cargo xtask sim -- --help` prints fencelock-sim's own help.")]
struct SimOptions {
    /// Arguments for fencelock-sim
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
    args: Vec<String>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = project_root();
    match cli.task {
        None => {
            // A closed pipe (`cargo xtask | head`) is not the reader's error.
            let _ = Cli::command().print_help();
            Ok(())
        }
        Some(Task::Ci) => ci(&root),
        Some(Task::Tidy) => tidy::run(&root),
        Some(Task::Bench(options)) => bench::run(&root, options),
        Some(Task::Sim(options)) => sim(&root, &options.args),
        Some(Task::Cluster(options)) => cluster::run(&root, options),
        Some(Task::Suite(options)) => suite::run(&root, options),
        Some(Task::Canaries) => canaries::run(&root),
        Some(Task::Python) => python::run(&root),
    }
}

/// Prints the help of one task, for the tasks that pass their flags on and
/// so see a `--help` only after clap has parsed.
fn print_task_help(task: &str) -> Result<()> {
    let mut command = Cli::command();
    command.build();
    let task = command.find_subcommand_mut(task).with_context(|| format!("no task `{task}`"))?;
    // A closed pipe (`| head`) is not the reader's error.
    let _ = task.print_help();
    Ok(())
}

fn ci(root: &Path) -> Result<()> {
    // Chosen before the long steps, so that a failed sweep can be run again
    // from this line of the log even if the run is cut short.
    let first = sim_first_seed(std::env::var(SIM_FIRST_ENV))?;
    eprintln!(
        "xtask ci: the simulation sweep will start at seed {first} ({SIM_FIRST_ENV}={first} repeats it)"
    );
    cargo(root, &["fmt", "--all", "--", "--check"])
        .context("code is not formatted: run `cargo fmt --all`")?;
    cargo(root, &["clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings"])?;
    tidy::run(root)?;
    // The process tests run the binaries (fencelockd, fencelock) from the
    // target directory: build them all first.
    cargo(root, &["build", "--workspace", "--bins", "--locked"])?;
    cargo(root, &["test", "--workspace", "--locked"])?;
    // Every multi-process suite briefly, with the debug binaries built above.
    suite::ci(root)?;
    // The Python client's tests, against the debug binaries built above.
    python::ci(root)?;
    // A larger simulation sweep than `cargo test`'s, in release, on every
    // core, from a first seed that differs from run to run so that CI
    // explores new seeds each time.
    eprintln!("xtask ci: simulation sweep of {SIM_SEEDS_CI} seeds from seed {first} ({SIM_FIRST_ENV}={first} repeats it)");
    sim(root, &["--seeds".to_owned(), SIM_SEEDS_CI.to_string(), "--first".to_owned(), first.to_string()])
        .with_context(|| {
            format!("the sweep from seed {first} failed ({SIM_FIRST_ENV}={first} repeats it)")
        })?;
    println!("xtask ci: all checks passed");
    Ok(())
}

/// Seeds of the simulation sweep in `cargo xtask ci`: 300,000 simulated
/// seconds, about 1.5 minutes on two cores (110 seeds/s in release).
const SIM_SEEDS_CI: u64 = 10_000;

/// Names the first seed of `cargo xtask ci`'s sweep, instead of a random one.
const SIM_FIRST_ENV: &str = "FENCELOCK_SIM_FIRST";

/// The first seed of `cargo xtask ci`'s sweep: [`SIM_FIRST_ENV`] if set, else
/// random. The randomness is drawn here, never in the simulator, whose runs
/// are a function of their seed alone.
fn sim_first_seed(env: Result<String, std::env::VarError>) -> Result<u64> {
    match env {
        Ok(text) => text
            .trim()
            .parse()
            .with_context(|| format!("{SIM_FIRST_ENV} must be a seed (a whole number), not `{text}`")),
        Err(std::env::VarError::NotPresent) => Ok(random_first_seed()),
        Err(err) => Err(err).with_context(|| format!("cannot read {SIM_FIRST_ENV}")),
    }
}

/// A random seed below 2^32: short enough to read and type, and far from
/// running out of sweeps.
fn random_first_seed() -> u64 {
    let mut bytes = [0u8; 8];
    let random = match std::fs::File::open("/dev/urandom").and_then(|mut file| file.read_exact(&mut bytes)) {
        Ok(()) => u64::from_le_bytes(bytes),
        // Without /dev/urandom, the clock's nanoseconds differ enough from
        // run to run.
        Err(_) => SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_nanos() as u64),
    };
    random >> 32
}

/// Runs the simulator in release mode with `args`.
fn sim(root: &Path, args: &[String]) -> Result<()> {
    let mut cargo_args = vec!["run", "--release", "--locked", "--quiet", "--package", "fencelock-sim", "--"];
    cargo_args.extend(args.iter().map(String::as_str));
    let status = cargo_status(root, &cargo_args)?;
    match status.code() {
        Some(0) => Ok(()),
        // clap's code for arguments it refused; it said why above.
        Some(2) => bail!("fencelock-sim refused its arguments: `cargo xtask sim --help` lists them"),
        _ => bail!(
            "the simulation found a violation: the failing seed's replay command is above \
             (`cargo {}` failed with {status})",
            cargo_args.join(" ")
        ),
    }
}

/// Runs cargo with `args` in `root`, failing when it fails.
fn cargo(root: &Path, args: &[&str]) -> Result<()> {
    let status = cargo_status(root, args)?;
    if !status.success() {
        bail!("`cargo {}` failed with {status}", args.join(" "));
    }
    Ok(())
}

/// Runs cargo with `args` in `root`, and tells how it ended.
fn cargo_status(root: &Path, args: &[&str]) -> Result<ExitStatus> {
    eprintln!("$ cargo {}", args.join(" "));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    Command::new(cargo)
        .args(args)
        .current_dir(root)
        .status()
        .with_context(|| format!("cannot run `cargo {}`", args.join(" ")))
}

fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Task {
        let cli = Cli::try_parse_from(["xtask"].iter().chain(args)).unwrap();
        cli.task.unwrap()
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
        assert!(Cli::try_parse_from(["xtask"]).unwrap().task.is_none());
        assert!(Cli::try_parse_from(["xtask", "nope"]).is_err());
    }

    #[test]
    fn sim_and_suite_pass_their_arguments_on_as_given() {
        let Task::Sim(sim) = parse(&["sim", "--seeds", "5", "--first", "7", "--jobs", "2"]) else { panic!() };
        assert_eq!(sim.args, ["--seeds", "5", "--first", "7", "--jobs", "2"]);
        let Task::Sim(sim) = parse(&["sim", "--", "--help"]) else { panic!() };
        assert_eq!(sim.args, ["--help"]);
        let Task::Suite(suite) = parse(&["suite", "--release", "kill", "--duration", "5s", "--release"])
        else {
            panic!()
        };
        assert!(suite.release);
        assert_eq!(suite.args, ["kill", "--duration", "5s", "--release"]);
        let Task::Suite(suite) = parse(&["suite", "--duration", "5s", "all"]) else { panic!() };
        assert!(!suite.release);
        assert_eq!(suite.args, ["--duration", "5s", "all"]);
    }

    #[test]
    fn the_first_seed_is_random_unless_named() {
        use std::env::VarError;
        assert_eq!(sim_first_seed(Ok("1234".to_owned())).unwrap(), 1234);
        assert_eq!(sim_first_seed(Ok(" 7\n".to_owned())).unwrap(), 7);
        for bad in ["", "-1", "seed", "1e9"] {
            let err = sim_first_seed(Ok(bad.to_owned())).unwrap_err().to_string();
            assert!(err.contains("FENCELOCK_SIM_FIRST must be a seed"), "{bad:?}: {err}");
        }
        assert!(sim_first_seed(Err(VarError::NotPresent)).unwrap() < 1 << 32);
        // Two draws of 32 random bits agree once in four billion runs.
        assert_ne!(random_first_seed(), random_first_seed());
        assert!(random_first_seed() < 1 << 32);
    }
}
