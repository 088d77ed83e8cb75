//! `cargo xtask cluster start --nodes 3|5 [--dir D]`, `stop [--dir D]` and
//! `status [--dir D]`: a local cluster of real `fencelockd` processes to try
//! things on.
//!
//! `start` builds `fencelockd` and the `fencelock` CLI, starts the nodes on
//! free 127.0.0.1 ports with their data and logs in D (`target/cluster` by
//! default), waits for a leader and prints the endpoints. The processes
//! outlive the command, in their own process group so that a Ctrl-C in the
//! terminal does not reach them; `D/cluster.json` records them for `stop`
//! and `status`. `stop` sends SIGTERM (a clean stop) and SIGKILL to any
//! node still up after 10 s, and signals only processes that are still the
//! `fencelockd` it started on that data directory.

use std::fs;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
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

    /// True while the process is up and is still the `fencelockd` started on
    /// this node's data directory (a pid can be reused once it exits).
    fn is_ours(&self) -> bool {
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

    // Every port is held until all are chosen, so none repeats.
    let count = usize::try_from(size * 2)?;
    let listeners =
        (0..count).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<std::io::Result<Vec<_>>>()?;
    let addrs = listeners.iter().map(TcpListener::local_addr).collect::<std::io::Result<Vec<_>>>()?;
    drop(listeners);
    let size_usize = usize::try_from(size)?;
    let peers = (0..size_usize).map(|i| format!("{}={}", i + 1, addrs[i])).collect::<Vec<_>>().join(",");
    let mut nodes = Vec::new();
    for i in 0..size_usize {
        let id = i as u64 + 1;
        let client_addr = addrs[size_usize + i].to_string();
        let data_dir = dir.join(format!("node-{id}"));
        let log = dir.join(format!("node-{id}.log"));
        let log_file = fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let child = Command::new(&server)
            .args(["--id", &id.to_string(), "--peers", &peers, "--client-addr", &client_addr])
            .arg("--data-dir")
            .arg(&data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {}", server.display()))?;
        let pid = i32::try_from(child.id()).context("process id out of range")?;
        nodes.push(NodeRecord { id, pid, client_addr, peer_addr: addrs[i].to_string(), data_dir, log });
        // Recorded at once, so that `stop` finds every node even if the next
        // one fails to start.
        write_state(dir, &nodes)?;
    }

    let endpoints = nodes.iter().map(|node| node.client_addr.as_str()).collect::<Vec<_>>().join(",");
    let cli = crate::suite::target_dir(root).join("debug").join("fencelock");
    let deadline = Instant::now() + LEADER_WITHIN;
    let leader = loop {
        if let Some(dead) = nodes.iter().find(|node| !node.is_ours()) {
            bail!("node {} exited; its log ({}):\n{}", dead.id, dead.log.display(), tail(&dead.log, 10));
        }
        if let Some(leader) = leader_of(&cli, &endpoints) {
            break leader;
        }
        if Instant::now() >= deadline {
            bail!("no leader within {LEADER_WITHIN:?}; logs in {}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(100));
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

/// The leader's id, as the first node that answers names it.
fn leader_of(cli: &Path, endpoints: &str) -> Option<u64> {
    let output = Command::new(cli)
        .args(["--endpoints", endpoints, "--json", "--timeout", "1s", "status"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let value: Value = serde_json::from_slice(&output.stdout).ok()?;
    value["nodes"]
        .as_array()?
        .iter()
        .find(|node| node["role"].as_str() == Some("leader"))
        .and_then(|node| node["node_id"].as_u64())
}

fn stop(dir: &Path) -> Result<()> {
    let Some(nodes) = read_state(dir)? else {
        println!("no cluster recorded in {}", dir.display());
        return Ok(());
    };
    let running: Vec<&NodeRecord> = nodes.iter().filter(|node| node.is_ours()).collect();
    for node in &running {
        // Already gone is fine.
        let _ = kill(Pid::from_raw(node.pid), Signal::SIGTERM);
    }
    let deadline = Instant::now() + STOP_WITHIN;
    while running.iter().any(|node| node.is_ours()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for node in running.iter().filter(|node| node.is_ours()) {
        eprintln!("node {} did not stop within {STOP_WITHIN:?}: SIGKILL", node.id);
        let _ = kill(Pid::from_raw(node.pid), Signal::SIGKILL);
    }
    let path = dir.join(STATE_FILE);
    fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    println!("stopped {} node(s); data and logs stay in {}", running.len(), dir.display());
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

fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
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
