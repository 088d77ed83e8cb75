//! `cargo xtask suite [NAME|all] [--duration 60s] [--seed N] [--nodes 3|5]
//! [--release]`: real clusters under faults, with a fencing checker.
//!
//! It builds `fencelockd` and `fencelock-suite` (debug unless `--release`)
//! and runs the suite binary from the repository root, which starts the
//! clusters, injects the faults, checks the history and writes each run's
//! report to `target/suites/<suite>-<seed>/`. Every flag but `--release`
//! passes through; `docs/suites.md` describes the suites.
//!
//! `cargo xtask ci` runs every suite briefly (then the kill suite over
//! TLS) with the debug binaries its build step already made: those suites
//! are bound by faults and timeouts, not by CPU, so a release build would
//! cost more minutes than it saves. The hostile-clients suite, which is
//! bound by CPU, runs last with release binaries.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cargo;

/// Each suite's run in `cargo xtask ci`: eight suites (clock skew is skipped
/// where libfaketime is missing), about 25 s of wall time each with the
/// cluster's start, healing and checking.
const CI_DURATION: &str = "15s";

/// `cargo xtask suite`'s arguments: `--release`, and the rest for
/// `fencelock-suite`. They pass through rather than being declared here, so
/// that a flag the suite binary gains works at once.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Arguments: [NAME|all] [--duration 60s] [--seed N] [--nodes 3|5] [--converge-within 20s] [--list]

Suites: kill, pause, partition, clock-skew, lose-data, client-resets, membership, combined; or one
fault alone: kill-leader, kill-random, kill-all, pause-leader, pause-holder, partition-halves,
isolate-leader, bridge, clock-skew, lose-data, reset-clients, grow-shrink, replace-node. And `hostile` (not in `all`): floods of
waiters, partial frames, idle connections and locks, a client that never reads, peer-port garbage and
a log flood, beside well-behaved clients. Reports go to target/suites/. See docs/suites.md.")]
pub struct Options {
    /// Build and run release binaries instead of debug ones
    #[arg(long)]
    pub(crate) release: bool,
    /// The suite to run and fencelock-suite's flags
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
    pub(crate) args: Vec<String>,
}

/// Runs every suite briefly, as `cargo xtask ci` does.
pub fn ci(root: &Path) -> Result<()> {
    let args = ["all", "--duration", CI_DURATION].map(str::to_owned).to_vec();
    run(root, Options { release: false, args })?;
    // The kill suite again, every node and client over TLS.
    let args = ["kill", "--tls", "--duration", CI_DURATION].map(str::to_owned).to_vec();
    run(root, Options { release: false, args })?;
    // Clients that break the rules (not part of `all`): about 25 s, with
    // release binaries. Unlike the other suites it is bound by CPU: it
    // measures how well a node serves its good clients while it does the
    // work tens of thousands of hostile requests ask for, which a debug
    // build does ten times slower (under the waiters flood, good clients
    // got under a lock a second on CI's two cores, against 30 and more in
    // release).
    let args = ["hostile", "--duration", CI_DURATION].map(str::to_owned).to_vec();
    run(root, Options { release: true, args })
}

pub fn run(root: &Path, options: Options) -> Result<()> {
    // Once the suite's name or a flag of fencelock-suite is read, clap takes
    // the rest as they are: `--help` and `--release` may be among them.
    if options.args.iter().any(|arg| matches!(arg.as_str(), "-h" | "--help")) {
        return crate::print_task_help("suite");
    }
    let release = options.release || options.args.iter().any(|arg| arg == "--release");
    let passed: Vec<&str> =
        options.args.iter().map(String::as_str).filter(|arg| *arg != "--release").collect();
    let mut build = vec!["build", "--locked", "--bin", "fencelockd", "--bin", "fencelock-suite"];
    if release {
        build.push("--release");
    }
    cargo(root, &build)?;
    let binaries = target_dir(root).join(if release { "release" } else { "debug" });
    let suite = binaries.join("fencelock-suite");
    let server = binaries.join("fencelockd");
    let out = target_dir(root).join("suites");
    eprintln!(
        "$ {} {} --server {} --out {}",
        suite.display(),
        passed.join(" "),
        server.display(),
        out.display()
    );
    let status = Command::new(&suite)
        .args(&passed)
        .arg("--server")
        .arg(&server)
        .arg("--out")
        .arg(&out)
        .current_dir(root)
        .status()
        .with_context(|| format!("cannot run {}", suite.display()))?;
    if !status.success() {
        bail!("the suites found a violation or could not run ({status}): the replay commands are above");
    }
    Ok(())
}

/// Where cargo puts its output: `CARGO_TARGET_DIR`, else `target`.
pub(crate) fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    }
}
