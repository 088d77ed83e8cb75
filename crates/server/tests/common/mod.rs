//! What the process tests share: real `fencelockd` processes on 127.0.0.1,
//! started, killed and asked who leads.

// Each test binary uses part of this module.
#![allow(dead_code)]
// Test code: unwrapping is how a test fails.
#![allow(clippy::unwrap_used)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fencelock_client::{Client, ClientConfig};

pub const DEADLINE: Duration = Duration::from_secs(30);

pub struct Node {
    pub id: u64,
    pub peer_addr: String,
    pub client_addr: String,
    /// Flags added to the node's command line.
    pub extra_args: Vec<String>,
    pub child: Option<Child>,
}

/// A cluster of real server processes in a temporary directory.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub nodes: Vec<Node>,
}

/// A port for a node to listen on, never handed out twice in this process.
///
/// Binding port 0 and dropping the listener is not enough: two calls may
/// return the same port, and the kernel may give a returned port to an
/// outgoing connection (the nodes connect to their peers) before the node
/// binds it. So ports come from outside the kernel's ephemeral range, which
/// outgoing connections never take, starting at a block chosen by the process
/// id, so that test binaries running at the same time (in other worktrees,
/// say) start apart. Each is checked by binding it: one some other program
/// listens on is skipped.
pub fn free_port() -> u16 {
    static PORTS: OnceLock<Ports> = OnceLock::new();
    static HANDED_OUT: AtomicU32 = AtomicU32::new(0);
    let ports = PORTS.get_or_init(Ports::for_this_process);
    loop {
        let n = HANDED_OUT.fetch_add(1, Ordering::Relaxed);
        assert!(n < ports.len, "all {} ports from {} are taken", ports.len, ports.first);
        let port = ports.nth(n);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// The ports outside the ephemeral range, and where this process starts in
/// them.
struct Ports {
    first: u32,
    len: u32,
    start: u32,
}

impl Ports {
    /// More ports than one test binary takes, so that processes whose blocks
    /// differ never meet.
    const BLOCK_LEN: u32 = 128;
    /// Ports below this one need privileges.
    const UNPRIVILEGED_MIN: u32 = 1024;

    /// The larger of the two stretches outside the ephemeral range.
    fn for_this_process() -> Ports {
        let (ephemeral_min, ephemeral_max) = ephemeral_range();
        let below = (Ports::UNPRIVILEGED_MIN, ephemeral_min.saturating_sub(Ports::UNPRIVILEGED_MIN));
        let above = (ephemeral_max + 1, u32::from(u16::MAX) - ephemeral_max);
        let (first, len) = if below.1 >= above.1 { below } else { above };
        assert!(
            len >= Ports::BLOCK_LEN,
            "the ephemeral range {ephemeral_min}-{ephemeral_max} leaves no room for test ports"
        );
        let start = std::process::id() % (len / Ports::BLOCK_LEN) * Ports::BLOCK_LEN;
        Ports { first, len, start }
    }

    fn nth(&self, n: u32) -> u16 {
        u16::try_from(self.first + (self.start + n) % self.len).unwrap()
    }
}

/// The ports the kernel picks from for outgoing connections.
fn ephemeral_range() -> (u32, u32) {
    // Linux's default, for when the file cannot be read.
    const DEFAULT: (u32, u32) = (32768, 60999);
    let Ok(text) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range") else {
        return DEFAULT;
    };
    let mut numbers = text.split_whitespace().map(str::parse::<u32>);
    match (numbers.next(), numbers.next()) {
        (Some(Ok(min)), Some(Ok(max))) if min <= max && max <= u32::from(u16::MAX) => (min, max),
        _ => DEFAULT,
    }
}

impl Cluster {
    pub fn start(size: u64) -> Cluster {
        let mut cluster = Cluster::configure(size);
        for id in 1..=size {
            cluster.launch(id);
        }
        cluster
    }

    /// A cluster's configuration and directory, no node started yet.
    pub fn configure(size: u64) -> Cluster {
        let nodes = (1..=size)
            .map(|id| Node {
                id,
                peer_addr: format!("127.0.0.1:{}", free_port()),
                client_addr: format!("127.0.0.1:{}", free_port()),
                extra_args: Vec::new(),
                child: None,
            })
            .collect();
        Cluster { dir: tempfile::tempdir().unwrap(), nodes }
    }

    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}"))
    }

    pub fn log(&self, id: u64) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("node-{id}.log"))).unwrap_or_default()
    }

    fn peers(&self) -> String {
        self.nodes.iter().map(|node| format!("{}={}", node.id, node.peer_addr)).collect::<Vec<_>>().join(",")
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|node| node.client_addr.clone()).collect()
    }

    pub fn launch(&mut self, id: u64) {
        let peers = self.peers();
        let data_dir = self.data_dir(id);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("node-{id}.log")))
            .unwrap();
        let node = &mut self.nodes[(id - 1) as usize];
        assert!(node.child.is_none());
        let child = Command::new(env!("CARGO_BIN_EXE_fencelockd"))
            .args(["--id", &id.to_string(), "--peers", &peers, "--client-addr", &node.client_addr])
            .arg("--data-dir")
            .arg(&data_dir)
            .args([
                "--tick-ms",
                "20",
                "--election-ms",
                "200",
                "--heartbeat-ms",
                "40",
                "--lease-min-ms",
                "1000",
            ])
            .args(&node.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        node.child = Some(child);
    }

    /// kill -9.
    pub fn kill(&mut self, id: u64) {
        let mut child = self.nodes[(id - 1) as usize].child.take().expect("node is running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    pub fn client(&self) -> Client {
        let mut config = ClientConfig::new(self.endpoints());
        config.request_timeout = Duration::from_secs(2);
        config.retry_for = DEADLINE;
        Client::connect(config).unwrap()
    }

    pub fn client_addr(&self, id: u64) -> &str {
        &self.nodes[(id - 1) as usize].client_addr
    }

    pub fn peer_addr(&self, id: u64) -> &str {
        &self.nodes[(id - 1) as usize].peer_addr
    }

    /// Waits for a leader that the running nodes agree on.
    pub fn leader(&self, client: &Client) -> u64 {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let running: Vec<&Node> = self.nodes.iter().filter(|node| node.child.is_some()).collect();
            let statuses: Vec<_> =
                running.iter().filter_map(|node| client.status(&node.client_addr).ok()).collect();
            if statuses.len() == running.len() {
                let leader = statuses[0].leader_id;
                if leader != 0 && statuses.iter().all(|status| status.leader_id == leader) {
                    return leader;
                }
            }
            assert!(Instant::now() < deadline, "no leader: {}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn logs(&self) -> String {
        let mut text = String::new();
        for node in &self.nodes {
            let log = std::fs::read_to_string(self.dir.path().join(format!("node-{}.log", node.id)))
                .unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            text += &format!(
                "\n--- node {} ---\n{}",
                node.id,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        text
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
