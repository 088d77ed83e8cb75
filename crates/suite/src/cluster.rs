//! A cluster of real `fencelockd` processes on 127.0.0.1, each behind a
//! [`PeerProxy`], with the faults the nemeses need: kill -9 and restart,
//! SIGSTOP and SIGCONT, and cut links.
//!
//! Each node gets a real peer port, a client port, a data directory and a
//! JSON log in the run's directory. A node's `--peers` names its own real
//! peer port (where it listens) and the other nodes' proxies, so every byte
//! between nodes passes through the suite. Dropping the cluster kills
//! whatever still runs (paused processes included: SIGKILL works on a
//! stopped process).

use std::fs;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fencelock_client::{Client, ClientConfig, NodeStatus};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::proxy::{PeerProxy, Rules};

/// Server timing: fast elections so that a short run sees many of them.
/// The lease floor must be at least twice the longest election timeout
/// (2 × 2 × election).
pub const TICK_MS: u64 = 20;
pub const ELECTION_MS: u64 = 200;
pub const HEARTBEAT_MS: u64 = 40;
pub const LEASE_MIN_MS: u64 = 1_000;

/// How long one status request to one node may take: a paused node never
/// answers, and the suite must not wait on it for long.
pub const STATUS_TIMEOUT: Duration = Duration::from_millis(300);

/// How a cluster is started.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub server: PathBuf,
    pub dir: PathBuf,
    pub nodes: u64,
    /// Extra environment per node id (1-based index = id - 1), for a node
    /// whose clock runs at another rate.
    pub node_env: Vec<Vec<(String, String)>>,
}

/// One node: its ports, files and process.
#[derive(Debug)]
pub struct Node {
    pub id: u64,
    pub client_addr: String,
    pub peer_addr: SocketAddr,
    proxy: PeerProxy,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
    env: Vec<(String, String)>,
}

/// The running cluster.
#[derive(Debug)]
pub struct Cluster {
    pub nodes: Vec<Node>,
    pub rules: Arc<Rules>,
    server: PathBuf,
    /// A client used only for `status`, with a short timeout.
    status_client: Client,
}

impl Cluster {
    pub fn start(config: &ClusterConfig) -> Result<Cluster> {
        fs::create_dir_all(&config.dir).with_context(|| format!("cannot create {}", config.dir.display()))?;
        let rules = Arc::new(Rules::default());
        // Every port is held until all are chosen, so none repeats; the
        // servers bind them a moment later.
        let count = usize::try_from(config.nodes * 2)?;
        let listeners =
            (0..count).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<std::io::Result<Vec<_>>>()?;
        let addrs = listeners.iter().map(TcpListener::local_addr).collect::<std::io::Result<Vec<_>>>()?;
        drop(listeners);
        let mut nodes = Vec::new();
        for id in 1..=config.nodes {
            let index = usize::try_from(id - 1)?;
            let peer_addr = addrs[2 * index];
            let proxy = PeerProxy::start(id, peer_addr, Arc::clone(&rules))?;
            nodes.push(Node {
                id,
                client_addr: addrs[2 * index + 1].to_string(),
                peer_addr,
                proxy,
                data_dir: config.dir.join(format!("node-{id}")),
                log: config.dir.join(format!("node-{id}.log")),
                child: None,
                paused: false,
                env: config.node_env.get(index).cloned().unwrap_or_default(),
            });
        }
        let mut status_config = ClientConfig::new(nodes.iter().map(|node| node.client_addr.clone()));
        status_config.request_timeout = STATUS_TIMEOUT;
        status_config.retry_for = Duration::ZERO;
        status_config.owner = Some(b"suite-status".to_vec());
        let status_client = Client::connect(status_config)?;
        let mut cluster = Cluster { nodes, rules, server: config.server.clone(), status_client };
        for id in 1..=config.nodes {
            cluster.launch(id)?;
        }
        Ok(cluster)
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|node| node.id).collect()
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|node| node.client_addr.clone()).collect()
    }

    fn node(&self, id: u64) -> Result<&Node> {
        self.nodes.iter().find(|node| node.id == id).with_context(|| format!("no node {id}"))
    }

    fn node_mut(&mut self, id: u64) -> Result<&mut Node> {
        self.nodes.iter_mut().find(|node| node.id == id).with_context(|| format!("no node {id}"))
    }

    /// The `--peers` of node `id`: its own real peer port, where it
    /// listens, and every other node's proxy, so that each byte it sends
    /// to a peer passes a proxy. Only the ids must agree between nodes; the
    /// addresses are each node's own business.
    fn peers_of(&self, id: u64) -> String {
        self.nodes
            .iter()
            .map(|node| {
                let addr = if node.id == id { node.peer_addr } else { node.proxy.listen_addr() };
                format!("{}={addr}", node.id)
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts node `id`'s process (again), on its data directory.
    pub fn launch(&mut self, id: u64) -> Result<()> {
        let server = self.server.clone();
        let peers = self.peers_of(id);
        let node = self.node_mut(id)?;
        if node.child.is_some() {
            bail!("node {id} is already running");
        }
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .with_context(|| format!("cannot open {}", node.log.display()))?;
        let child = Command::new(&server)
            .args(["--id", &id.to_string(), "--peers", &peers, "--client-addr", &node.client_addr])
            .arg("--data-dir")
            .arg(&node.data_dir)
            .args(["--tick-ms", &TICK_MS.to_string()])
            .args(["--election-ms", &ELECTION_MS.to_string()])
            .args(["--heartbeat-ms", &HEARTBEAT_MS.to_string()])
            .args(["--lease-min-ms", &LEASE_MIN_MS.to_string()])
            .args(["--log-format", "json"])
            .envs(node.env.iter().map(|(key, value)| (key.as_str(), value.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", server.display()))?;
        node.child = Some(child);
        node.paused = false;
        Ok(())
    }

    /// The extra environment node `id` starts with from its next launch on
    /// (empty: none).
    pub fn set_env(&mut self, id: u64, env: Vec<(String, String)>) -> Result<()> {
        self.node_mut(id)?.env = env;
        Ok(())
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.node(id).is_ok_and(|node| node.child.is_some())
    }

    /// kill -9, and reaps the process.
    pub fn kill9(&mut self, id: u64) -> Result<()> {
        let node = self.node_mut(id)?;
        let Some(mut child) = node.child.take() else {
            return Ok(());
        };
        child.kill().with_context(|| format!("cannot kill node {id}"))?;
        child.wait().with_context(|| format!("cannot reap node {id}"))?;
        node.paused = false;
        Ok(())
    }

    fn signal(&self, id: u64, signal: Signal) -> Result<()> {
        let node = self.node(id)?;
        let child = node.child.as_ref().with_context(|| format!("node {id} is not running"))?;
        let pid = i32::try_from(child.id()).context("process id out of range")?;
        kill(Pid::from_raw(pid), signal).with_context(|| format!("cannot send {signal} to node {id}"))
    }

    /// SIGSTOP: the process freezes, its sockets stay open.
    pub fn pause(&mut self, id: u64) -> Result<()> {
        self.signal(id, Signal::SIGSTOP)?;
        self.node_mut(id)?.paused = true;
        Ok(())
    }

    /// SIGCONT.
    pub fn resume(&mut self, id: u64) -> Result<()> {
        if !self.node(id)?.paused {
            return Ok(());
        }
        self.signal(id, Signal::SIGCONT)?;
        self.node_mut(id)?.paused = false;
        Ok(())
    }

    /// Undoes every fault: links restored, paused nodes resumed, stopped
    /// nodes started again.
    pub fn heal_all(&mut self) -> Result<()> {
        self.rules.heal();
        for id in self.ids() {
            if !self.is_running(id) {
                self.launch(id)?;
            } else {
                self.resume(id)?;
            }
        }
        Ok(())
    }

    /// Each running node's status, one short attempt each; `None` for a
    /// node that did not answer.
    pub fn statuses(&self) -> Vec<(u64, Option<NodeStatus>)> {
        self.nodes
            .iter()
            .map(|node| {
                let status = if node.child.is_some() && !node.paused {
                    self.status_client.status(&node.client_addr).ok()
                } else {
                    None
                };
                (node.id, status)
            })
            .collect()
    }

    /// The node that says it leads, with the highest term among those that
    /// do (a deposed leader cut off from the rest may still think it leads).
    pub fn leader(&self) -> Option<(u64, u64)> {
        leader_of(&self.statuses())
    }

    /// Deletes node `id`'s data directory (the node must be stopped): a
    /// lost disk.
    pub fn wipe(&mut self, id: u64) -> Result<()> {
        let node = self.node(id)?;
        if node.child.is_some() {
            bail!("node {id} is running");
        }
        match fs::remove_dir_all(&node.data_dir) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(err).with_context(|| format!("cannot delete {}", node.data_dir.display())),
        }
    }

    /// Waits up to `within` for node `id` to answer a status that says it
    /// is no longer rejoining, and for a leader.
    pub fn wait_for_rejoin(&self, id: u64, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let statuses = self.statuses();
            let caught_up = statuses
                .iter()
                .any(|(node, status)| *node == id && status.as_ref().is_some_and(|status| !status.rejoining));
            if caught_up && leader_of(&statuses).is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("node {id} did not rejoin within {within:?}; {}", self.log_tails(8));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits up to `within` for a leader.
    pub fn wait_for_leader(&self, within: Duration) -> Result<u64> {
        let deadline = Instant::now() + within;
        loop {
            if let Some((leader, _)) = self.leader() {
                return Ok(leader);
            }
            if Instant::now() >= deadline {
                bail!("no leader within {within:?}; {}", self.log_tails(8));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops every node with SIGTERM (SIGKILL after 10 s) and the proxies.
    pub fn stop(&mut self) {
        for node in &mut self.nodes {
            if let Some(child) = &node.child {
                if let Ok(pid) = i32::try_from(child.id()) {
                    if node.paused {
                        let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
                    }
                    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for node in &mut self.nodes {
            let Some(mut child) = node.child.take() else { continue };
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
            node.paused = false;
        }
        for node in &mut self.nodes {
            node.proxy.stop();
        }
    }

    /// Removes the nodes' data directories (their logs stay).
    pub fn remove_data(&self) {
        for node in &self.nodes {
            let _ = fs::remove_dir_all(&node.data_dir);
        }
    }

    /// The last `lines` lines of each node's log, for an error message.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut text = String::from("server logs:");
        for node in &self.nodes {
            text.push_str(&format!("\n--- node {} ({})", node.id, node.log.display()));
            let log = fs::read_to_string(&node.log).unwrap_or_default();
            let all: Vec<&str> = log.lines().collect();
            for line in &all[all.len().saturating_sub(lines)..] {
                text.push_str("\n  ");
                text.push_str(line);
            }
        }
        text
    }

    /// Each node's addresses, for the report.
    pub fn describe(&self) -> Vec<serde_json::Value> {
        self.nodes
            .iter()
            .map(|node| {
                serde_json::json!({
                    "id": node.id,
                    "client_addr": node.client_addr,
                    "peer_addr": node.peer_addr.to_string(),
                    "proxy_addr": node.proxy.listen_addr().to_string(),
                })
            })
            .collect()
    }

    pub fn log_paths(&self) -> Vec<&Path> {
        self.nodes.iter().map(|node| node.log.as_path()).collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The node that says it leads with the highest term, and that term.
pub fn leader_of(statuses: &[(u64, Option<NodeStatus>)]) -> Option<(u64, u64)> {
    statuses
        .iter()
        .filter_map(|(id, status)| status.as_ref().map(|status| (*id, status)))
        .filter(|(_, status)| status.role == "leader")
        .max_by_key(|(_, status)| status.term)
        .map(|(id, status)| (id, status.term))
}
