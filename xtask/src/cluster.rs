//! `cargo xtask cluster start --nodes 3|5 [--dir D]`, `stop [--dir D]` and
//! `status [--dir D]`: a local cluster of real `fencelockd` processes to try
//! things on.
//!
//! `start` builds `fencelockd` and the `fencelock` CLI, starts the nodes
//! (through `fencelock-launch`) on free 127.0.0.1 ports with their data and
//! logs in D (`target/cluster` by default), waits for a leader and prints
//! the endpoints. The processes outlive the command, detached in their own
//! process group so that a Ctrl-C in the terminal does not reach them;
//! `D/cluster.json` records them for `stop` and `status`. `stop` sends
//! SIGTERM (a clean stop) and SIGKILL to any node still up after 10 s, and
//! signals only processes that are still the `fencelockd` it started on
//! that data directory.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use fencelock_launch::{stop_detached, Cluster, ClusterSpec, DetachedNode, LaunchError};
use serde_json::{json, Value};

use crate::cargo;

const STATE_FILE: &str = "cluster.json";

/// How long `start` waits for a leader, and `stop` for a clean exit.
const LEADER_WITHIN: Duration = Duration::from_secs(20);
const STOP_WITHIN: Duration = Duration::from_secs(10);

/// One started node, as `cluster.json` records it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NodeRecord {
    id: u64,
    pid: i32,
    client_addr: String,
    peer_addr: String,
    data_dir: PathBuf,
    log: PathBuf,
}

impl NodeRecord {
    fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "pid": self.pid,
            "client_addr": self.client_addr,
            "peer_addr": self.peer_addr,
            "data_dir": self.data_dir.display().to_string(),
            "log": self.log.display().to_string(),
        })
    }

    fn from_json(value: &Value) -> Result<NodeRecord> {
        let text = |field: &str| {
            value[field]
                .as_str()
                .map(str::to_owned)
                .with_context(|| format!("cluster.json: node without {field}"))
        };
        Ok(NodeRecord {
            id: value["id"].as_u64().context("cluster.json: node without id")?,
            pid: value["pid"]
                .as_i64()
                .and_then(|pid| i32::try_from(pid).ok())
                .context("cluster.json: bad pid")?,
            client_addr: text("client_addr")?,
            peer_addr: text("peer_addr")?,
            data_dir: PathBuf::from(text("data_dir")?),
            log: PathBuf::from(text("log")?),
        })
    }

    /// The node as the launcher knows a process another run started.
    fn detached(&self) -> DetachedNode {
        // A pid recorded by `start` is a process id; a negative one is no
        // process of ours.
        let pid = u32::try_from(self.pid).unwrap_or(0);
        DetachedNode { id: self.id, pid, data_dir: self.data_dir.clone() }
    }

    /// True while the process is up and is still the `fencelockd` started on
    /// this node's data directory (a pid can be reused once it exits).
    fn is_ours(&self) -> bool {
        self.detached().is_running()
    }
}

/// `cargo xtask cluster`'s action and flags. The flags may come before or
/// after the action, and `stop` and `status` take `--nodes` and ignore it, as
/// the hand-written parser did.
#[derive(Debug, PartialEq, Eq, clap::Args)]
pub struct Options {
    #[command(subcommand)]
    action: Action,
    /// Nodes to start: 3 or 5
    #[arg(long, global = true, value_name = "3|5", value_parser = parse_nodes, default_value = "3")]
    nodes: u64,
    /// The cluster's data, logs and cluster.json [default: target/cluster]
    #[arg(long, global = true, value_name = "D")]
    dir: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::Subcommand)]
enum Action {
    /// Builds fencelockd, starts the nodes, waits for a leader and prints the endpoints
    Start,
    /// Stops the nodes (SIGTERM, SIGKILL after 10 s); data and logs stay
    Stop,
    /// Lists the nodes and asks the cluster for its status
    Status,
}

fn parse_nodes(text: &str) -> Result<u64> {
    let nodes = text.parse().context("--nodes takes a number")?;
    if !matches!(nodes, 3 | 5) {
        bail!("--nodes must be 3 or 5");
    }
    Ok(nodes)
}

pub fn run(root: &Path, options: Options) -> Result<()> {
    let dir = match &options.dir {
        Some(dir) if dir.is_absolute() => dir.clone(),
        Some(dir) => std::env::current_dir()?.join(dir),
        None => root.join("target").join("cluster"),
    };
    match options.action {
        Action::Start => start(root, &dir, options.nodes),
        Action::Stop => stop(&dir),
        Action::Status => status(root, &dir),
    }
}

fn read_state(dir: &Path) -> Result<Option<Vec<NodeRecord>>> {
    let path = dir.join(STATE_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err).with_context(|| format!("cannot read {}", path.display())),
    };
    let value: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let nodes = value["nodes"].as_array().with_context(|| format!("{} lists no nodes", path.display()))?;
    nodes.iter().map(NodeRecord::from_json).collect::<Result<Vec<_>>>().map(Some)
}

fn write_state(dir: &Path, nodes: &[NodeRecord]) -> Result<()> {
    let endpoints: Vec<&str> = nodes.iter().map(|node| node.client_addr.as_str()).collect();
    let state = json!({
        "endpoints": endpoints.join(","),
        "nodes": nodes.iter().map(NodeRecord::to_json).collect::<Vec<_>>(),
    });
    let path = dir.join(STATE_FILE);
    fs::write(&path, serde_json::to_vec_pretty(&state)?)
        .with_context(|| format!("cannot write {}", path.display()))
}

fn start(root: &Path, dir: &Path, size: u64) -> Result<()> {
    if let Some(nodes) = read_state(dir)? {
        if nodes.iter().any(NodeRecord::is_ours) {
            bail!("a cluster is already running in {}: `cargo xtask cluster stop` first", dir.display());
        }
    }
    cargo(root, &["build", "--locked", "--bin", "fencelockd", "--bin", "fencelock"])?;
    let server = crate::suite::target_dir(root).join("debug").join("fencelockd");
    // A fresh cluster: the data and logs of a stopped one go.
    if dir.exists() {
        for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
            let path = entry?.path();
            let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
            if name.starts_with("node-") || name == STATE_FILE {
                if path.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) }
                    .with_context(|| format!("cannot remove {}", path.display()))?;
            }
        }
    }
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;

    let mut spec = ClusterSpec::new(server, dir, size);
    spec.detached = true;
    let mut cluster = Cluster::configure(spec)?;
    let mut nodes = Vec::new();
    for id in cluster.ids() {
        cluster.launch(id)?;
        let node = cluster.layout().node(id)?;
        let pid =
            cluster.pid(id).and_then(|pid| i32::try_from(pid).ok()).context("process id out of range")?;
        nodes.push(NodeRecord {
            id,
            pid,
            client_addr: node.client_addr.to_string(),
            peer_addr: node.peer_addr.to_string(),
            data_dir: node.data_dir.clone(),
            log: node.log.clone(),
        });
        // Recorded at once, so that `stop` finds every node even if the next
        // one fails to start.
        write_state(dir, &nodes)?;
    }

    let endpoints = nodes.iter().map(|node| node.client_addr.as_str()).collect::<Vec<_>>().join(",");
    let cli = crate::suite::target_dir(root).join("debug").join("fencelock");
    let leader = match cluster.wait_for_leader(LEADER_WITHIN) {
        Ok(leader) => leader,
        Err(LaunchError::Exited { id, .. }) => {
            let log = &cluster.layout().node(id)?.log;
            bail!("node {id} exited; its log ({}):\n{}", log.display(), cluster.layout().log_tail(id, 10));
        }
        Err(LaunchError::NoLeader { .. }) => {
            bail!("no leader within {LEADER_WITHIN:?}; logs in {}", dir.display());
        }
        Err(err) => return Err(err.into()),
    };
    println!(
        "fencelock cluster of {size} nodes running, node {leader} leads (data and logs in {})",
        dir.display()
    );
    for node in &nodes {
        println!(
            "  node {}  client {}  peer {}  pid {}",
            node.id, node.client_addr, node.peer_addr, node.pid
        );
    }
    println!("\nexport FENCELOCK_ENDPOINTS={endpoints}");
    println!("{} acquire jobs/a --ttl 30s", cli.display());
    println!("{} status", cli.display());
    println!("\nStop it with `cargo xtask cluster stop`.");
    Ok(())
}

fn stop(dir: &Path) -> Result<()> {
    let Some(nodes) = read_state(dir)? else {
        println!("no cluster recorded in {}", dir.display());
        return Ok(());
    };
    let detached: Vec<DetachedNode> = nodes.iter().map(NodeRecord::detached).collect();
    let stopped = stop_detached(&detached, STOP_WITHIN);
    for id in &stopped.killed {
        eprintln!("node {id} did not stop within {STOP_WITHIN:?}: SIGKILL");
    }
    let path = dir.join(STATE_FILE);
    fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    println!("stopped {} node(s); data and logs stay in {}", stopped.running.len(), dir.display());
    Ok(())
}

fn status(root: &Path, dir: &Path) -> Result<()> {
    let Some(nodes) = read_state(dir)? else {
        bail!("no cluster recorded in {}: `cargo xtask cluster start` first", dir.display());
    };
    for node in &nodes {
        let state = if node.is_ours() { "running" } else { "not running" };
        println!(
            "node {}  pid {}  {state}  client {}  log {}",
            node.id,
            node.pid,
            node.client_addr,
            node.log.display()
        );
    }
    let endpoints = nodes.iter().map(|node| node.client_addr.as_str()).collect::<Vec<_>>().join(",");
    println!("\nexport FENCELOCK_ENDPOINTS={endpoints}\n");
    let cli = crate::suite::target_dir(root).join("debug").join("fencelock");
    let status = Command::new(&cli)
        .args(["--endpoints", &endpoints, "--timeout", "1s", "status"])
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("cannot run {}", cli.display()))?;
    if !nodes.iter().any(NodeRecord::is_ours) || !status.success() {
        bail!("the cluster in {} is not serving", dir.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Options, clap::Error> {
        use clap::Parser;
        let cli =
            crate::Cli::try_parse_from(["xtask", "cluster"].into_iter().chain(text.split_whitespace()))?;
        match cli.task {
            Some(crate::Task::Cluster(options)) => Ok(options),
            other => panic!("not cluster: {other:?}"),
        }
    }

    #[test]
    fn parses_the_actions_and_flags() {
        let options = parse("start --nodes 5 --dir /tmp/c").unwrap();
        assert_eq!(options, Options { action: Action::Start, nodes: 5, dir: Some("/tmp/c".into()) });
        // Flags before the action, as before clap.
        assert_eq!(parse("--nodes 5 --dir /tmp/c start").unwrap(), options);
        assert_eq!(parse("stop").unwrap(), Options { action: Action::Stop, nodes: 3, dir: None });
        assert_eq!(parse("status --nodes 5").unwrap().action, Action::Status);
        for (bad, says) in [
            ("start --nodes 4", "--nodes must be 3 or 5"),
            ("start --nodes x", "--nodes takes a number"),
            ("", "Usage"),
            ("start stop", "stop"),
            ("restart", "restart"),
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn node_records_round_trip_through_json() {
        let node = NodeRecord {
            id: 2,
            pid: 1234,
            client_addr: "127.0.0.1:7102".into(),
            peer_addr: "127.0.0.1:7002".into(),
            data_dir: "/tmp/c/node-2".into(),
            log: "/tmp/c/node-2.log".into(),
        };
        assert_eq!(NodeRecord::from_json(&node.to_json()).unwrap(), node);
        assert!(NodeRecord::from_json(&json!({"id": 1})).is_err());
    }

    #[test]
    fn a_process_that_is_not_fencelockd_is_never_ours() {
        // This test's own process: alive, but not a fencelockd.
        let me = NodeRecord {
            id: 1,
            pid: i32::try_from(std::process::id()).unwrap(),
            client_addr: String::new(),
            peer_addr: String::new(),
            data_dir: "/nowhere".into(),
            log: "/nowhere.log".into(),
        };
        assert!(!me.is_ours());
    }
}
