//! fencelock-launch: clusters of real `fencelockd` processes on 127.0.0.1,
//! the one launcher behind the server's process tests, the suites
//! (`crates/suite`), `cargo xtask bench` and `cargo xtask cluster`.
//!
//! What it owns:
//! - ports ([`free_port`]): outside the kernel's ephemeral range, from a
//!   block chosen by the process id, never twice in one process;
//! - the layout of a cluster ([`ClusterSpec`] → [`Layout`]): each node's peer
//!   and client address, its data directory `node-N` and log `node-N.log`,
//!   the cluster's and its own flags, its environment, and an advertised
//!   peer address that differs from the one it listens on (a proxy in front
//!   of it), from which each node's `--peers` is made;
//! - the processes ([`Process`], kept per node by [`Cluster`]): start and
//!   restart, kill -9, SIGSTOP and SIGCONT, a graceful stop (SIGTERM, then
//!   SIGKILL at a deadline), a wiped data directory; nodes started detached
//!   by an earlier process, known by pid ([`DetachedNode`],
//!   [`stop_detached`]);
//! - waiting, by polling with a deadline, until a node answers `status` or
//!   the nodes agree on a leader ([`probe`], over the raw client protocol:
//!   the vocabulary's messages in net's frames, no client library).
//!
//! What it does not: decide anything about the cluster's behaviour. It
//! knows no faults beyond signals and a deleted directory (the suites' proxy
//! and nemeses are theirs), no workload, no report and no file format of
//! its callers (`cargo xtask cluster`'s `cluster.json` is xtask's). It
//! depends only on the vocabulary, net's framing, `thiserror` and `nix`, so
//! that xtask can build on it.
//!
//! ```no_run
//! use std::time::Duration;
//! use fencelock_launch::{Cluster, ClusterSpec};
//!
//! let mut spec = ClusterSpec::new("target/debug/fencelockd", "/tmp/try", 3);
//! spec.flags = vec!["--log-format".into(), "json".into()];
//! let mut cluster = Cluster::start(spec)?;
//! let leader = cluster.wait_for_leader(Duration::from_secs(20))?;
//! cluster.kill9(leader)?;
//! cluster.launch(leader)?;
//! cluster.stop(Duration::from_secs(10));
//! # Ok::<(), fencelock_launch::LaunchError>(())
//! ```

mod cluster;
mod detached;
mod ports;
pub mod probe;
mod process;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

pub use cluster::{Cluster, ClusterSpec, Layout, NodeSpec, TLS_USER};
pub use detached::{stop_detached, DetachedNode, DetachedStop};
pub use ports::{free_addr, free_port};
pub use process::{Process, Stopped};

/// Why a cluster or a node could not be launched, signalled or waited for.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("the ephemeral port range {min}-{max} leaves no room for ports of our own")]
    NoPortRange { min: u32, max: u32 },
    #[error("all {len} ports from {first} are taken")]
    PortsExhausted { first: u32, len: u32 },
    #[error("certificates: {0}")]
    Certificates(String),
    #[error("no node {0}")]
    NoNode(u64),
    #[error("node {0} is already running")]
    Running(u64),
    #[error("node {0} is not running")]
    NotRunning(u64),
    #[error("cannot {action} {path}: {source}")]
    File { action: &'static str, path: PathBuf, source: std::io::Error },
    #[error("cannot start {server}: {source}")]
    Spawn { server: PathBuf, source: std::io::Error },
    #[error("cannot send {signal} to node {node}: {source}")]
    Signal { node: u64, signal: nix::sys::signal::Signal, source: nix::Error },
    #[error("process id {pid} of node {node} is out of range")]
    Pid { node: u64, pid: u32 },
    #[error("cannot kill node {node}: {source}")]
    Kill { node: u64, source: std::io::Error },
    #[error("cannot reap node {node}: {source}")]
    Wait { node: u64, source: std::io::Error },
    #[error("node {id} exited ({status})")]
    Exited { id: u64, status: ExitStatus },
    #[error("no status from {addr}: {reason}")]
    Status { addr: SocketAddr, reason: String },
    #[error("no leader within {within:?}")]
    NoLeader { within: Duration },
    #[error("node {id} did not answer within {within:?}")]
    NoAnswer { id: u64, within: Duration },
}

impl LaunchError {
    fn file(action: &'static str, path: &Path, source: std::io::Error) -> LaunchError {
        LaunchError::File { action, path: path.to_path_buf(), source }
    }
}
