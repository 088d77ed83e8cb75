//! The workspace's automation, in Rust: `cargo xtask <task>`.
//!
//! A bare `cargo xtask` lists the tasks. Each task is a few calls to cargo
//! with the repository root as the working directory, so it behaves the same
//! from any folder, on a developer's machine and in CI.

mod bench;
mod cluster;
mod suite;
mod tidy;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

const TASKS: &[(&str, &str)] = &[
    ("ci", "everything CI checks: format, clippy (warnings denied), tidy, build, all tests"),
    ("tidy", "architecture rules: dependency arrows, module docs, banned APIs in the cores"),
    ("bench", "throughput and latency of a real 3-node cluster (release build; --quick, --only, --perf)"),
    ("sim", "deterministic simulation sweep: --seeds N [--first F] | --seed S, [--nodes 3|5]"),
    ("cluster", "a local fencelockd cluster: start [--nodes 3|5] [--dir D] | stop | status"),
    ("suite", "real clusters under faults, checked: [NAME|all] [--duration D] [--seed N] [--nodes 3|5]"),
];

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = project_root();
    match args.first().map(String::as_str) {
        None | Some("help" | "-h" | "--help") => {
            print_tasks();
            Ok(())
        }
        Some("ci") => ci(&root),
        Some("tidy") => tidy::run(&root),
        Some("bench") => bench::run(&root, &args[1..]),
        Some("sim") => sim(&root, &args[1..]),
        Some("cluster") => cluster::run(&root, &args[1..]),
        Some("suite") => suite::run(&root, &args[1..]),
        Some(other) => {
            print_tasks();
            bail!("unknown task `{other}`")
        }
    }
}

fn print_tasks() {
    println!("Usage: cargo xtask <task>\n\nTasks:");
    for (name, about) in TASKS {
        println!("  {name:<8} {about}");
    }
}

fn ci(root: &Path) -> Result<()> {
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
    // A larger simulation sweep than `cargo test`'s, in release: about a
    // minute of wall time for 30,000 simulated seconds.
    sim(root, &["--seeds".to_owned(), SIM_SEEDS_CI.to_owned(), "--first".to_owned(), "1000".to_owned()])?;
    println!("xtask ci: all checks passed");
    Ok(())
}

/// Seeds of the simulation sweep in `cargo xtask ci`.
const SIM_SEEDS_CI: &str = "1000";

/// Runs the simulator in release mode with `args`.
fn sim(root: &Path, args: &[String]) -> Result<()> {
    let mut cargo_args = vec!["run", "--release", "--locked", "--quiet", "--package", "fencelock-sim", "--"];
    cargo_args.extend(args.iter().map(String::as_str));
    cargo(root, &cargo_args)
        .context("the simulation found a violation: the failing seed's replay command is above")
}

/// Runs cargo with `args` in `root`, failing when it fails.
fn cargo(root: &Path, args: &[&str]) -> Result<()> {
    eprintln!("$ cargo {}", args.join(" "));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = Command::new(cargo)
        .args(args)
        .current_dir(root)
        .status()
        .with_context(|| format!("cannot run `cargo {}`", args.join(" ")))?;
    if !status.success() {
        bail!("`cargo {}` failed with {status}", args.join(" "));
    }
    Ok(())
}

fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}
