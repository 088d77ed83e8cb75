//! `cargo xtask python`: the Python client's tests (`clients/python`),
//! which start real `fencelockd` processes.
//!
//! They run with the `python3` on the PATH, which needs the client and
//! pytest installed (`python3 -m pip install ./clients/python pytest`, as
//! `.ci/run` does); the tests themselves import the client from the source
//! tree. `FENCELOCKD` names the debug server binary, and the TLS test finds
//! the `fencelock` CLI beside it. `cargo xtask ci` runs them after the
//! suites, with the binaries its build step made; the task alone builds
//! those two first.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cargo;
use crate::suite::target_dir;

/// What to run when the Python side is missing.
const INSTALL_HINT: &str = "python3 -m pip install ./clients/python pytest";

/// `cargo xtask python`: builds the debug binaries the tests start, then
/// runs the tests.
pub fn run(root: &Path) -> Result<()> {
    cargo(root, &["build", "--locked", "--bin", "fencelockd", "--bin", "fencelock"])?;
    ci(root)
}

/// Runs the Python client's tests against the debug binaries built already.
pub fn ci(root: &Path) -> Result<()> {
    let check = Command::new("python3")
        .args(["-c", "import fencelock, pytest"])
        .current_dir(root)
        .output()
        .with_context(|| format!("cannot run python3, which these tests need ({INSTALL_HINT})"))?;
    if !check.status.success() {
        bail!(
            "python3 cannot import the fencelock client or pytest: run `{INSTALL_HINT}` first\n{}",
            String::from_utf8_lossy(&check.stderr).trim()
        );
    }
    let server = target_dir(root).join("debug").join("fencelockd");
    eprintln!("$ FENCELOCKD={} python3 -m pytest -q clients/python/tests", server.display());
    let status = Command::new("python3")
        .args(["-m", "pytest", "-q", "clients/python/tests"])
        .env("FENCELOCKD", &server)
        .current_dir(root)
        .status()
        .context("cannot run python3 -m pytest")?;
    if !status.success() {
        bail!("the Python client's tests failed ({status}): see above");
    }
    Ok(())
}
