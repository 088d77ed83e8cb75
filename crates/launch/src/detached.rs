//! Nodes started detached by an earlier process (`cargo xtask cluster
//! start`), known only by their pid and data directory: whether one still
//! runs, and a graceful stop of them all.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::process::signal_pid;

/// How often a stop looks whether the nodes have exited.
const EXIT_POLL: Duration = Duration::from_millis(50);

/// A node another process started and left running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetachedNode {
    pub id: u64,
    pub pid: u32,
    pub data_dir: PathBuf,
}

/// What [`stop_detached`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DetachedStop {
    /// The nodes that were running, by id.
    pub running: Vec<u64>,
    /// Those still up at the deadline, which got SIGKILL.
    pub killed: Vec<u64>,
}

impl DetachedNode {
    /// True while the process is up and is still the `fencelockd` started
    /// on this node's data directory (a pid can be reused once it exits).
    pub fn is_running(&self) -> bool {
        let Ok(cmdline) = fs::read(format!("/proc/{}/cmdline", self.pid)) else { return false };
        let args: Vec<String> =
            cmdline.split(|byte| *byte == 0).map(|arg| String::from_utf8_lossy(arg).into_owned()).collect();
        let data_dir = self.data_dir.display().to_string();
        let exited = fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
            .unwrap_or(true);
        !exited
            && args.first().is_some_and(|program| program.ends_with("fencelockd"))
            && args.contains(&data_dir)
    }
}

/// Stops every node of `nodes` that still runs: SIGTERM, then SIGKILL to
/// those still up after `within`. Only processes that are still the node
/// ([`DetachedNode::is_running`]) are signalled; one already gone is fine.
pub fn stop_detached(nodes: &[DetachedNode], within: Duration) -> DetachedStop {
    let running: Vec<&DetachedNode> = nodes.iter().filter(|node| node.is_running()).collect();
    for node in &running {
        // Gone since the look above: nothing to stop.
        let _ = signal_pid(node.id, node.pid, Signal::SIGTERM);
    }
    let deadline = Instant::now() + within;
    while running.iter().any(|node| node.is_running()) && Instant::now() < deadline {
        std::thread::sleep(EXIT_POLL);
    }
    let mut killed = Vec::new();
    for node in running.iter().filter(|node| node.is_running()) {
        let _ = signal_pid(node.id, node.pid, Signal::SIGKILL);
        killed.push(node.id);
    }
    DetachedStop { running: running.iter().map(|node| node.id).collect(), killed }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_that_is_not_fencelockd_is_never_running_as_a_node() {
        // This test's own process: alive, but not a fencelockd.
        let me = DetachedNode { id: 1, pid: std::process::id(), data_dir: "/nowhere".into() };
        assert!(!me.is_running());
        assert_eq!(stop_detached(&[me], Duration::ZERO), DetachedStop::default());
    }
}
