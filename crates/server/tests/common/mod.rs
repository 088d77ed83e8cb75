//! What the process tests share: real `fencelockd` processes on 127.0.0.1,
//! started, killed and asked who leads, through `fencelock-launch` (its
//! ports, layout, processes and waits); what is left here is the tests' own
//! view of a cluster.

// Each test binary uses part of this module.
#![allow(dead_code)]
// Test code: unwrapping is how a test fails.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use fencelock_client::{Client, ClientConfig};
use fencelock_launch::{ClusterSpec, Layout, Process};

pub const DEADLINE: Duration = Duration::from_secs(30);

/// The `fencelock` CLI built beside `fencelockd`.
pub fn cli_binary() -> PathBuf {
    let path = std::path::Path::new(env!("CARGO_BIN_EXE_fencelockd")).with_file_name("fencelock");
    assert!(
        path.exists(),
        "{} is missing: build the CLI first (`cargo build --bins`; `cargo xtask ci` does)",
        path.display()
    );
    path
}

/// Runs the CLI with `args` and no stdin.
pub fn fencelock(args: &[&str]) -> std::process::Output {
    std::process::Command::new(cli_binary()).args(args).stdin(std::process::Stdio::null()).output().unwrap()
}

/// Fast elections, so that the tests see a leader soon.
const FLAGS: &[&str] =
    &["--tick-ms", "20", "--election-ms", "200", "--heartbeat-ms", "40", "--lease-min-ms", "1000"];

pub struct Node {
    pub id: u64,
    pub peer_addr: String,
    pub client_addr: String,
    /// Flags added to the node's command line.
    pub extra_args: Vec<String>,
    pub child: Option<Process>,
}

/// A cluster of real server processes in a temporary directory.
pub struct Cluster {
    /// Before `dir`, so that dropping the cluster kills the processes
    /// before their directory goes.
    pub nodes: Vec<Node>,
    pub dir: tempfile::TempDir,
    layout: Layout,
}

/// A port for a node to listen on, never handed out twice in this process:
/// outside the kernel's ephemeral range, from a block chosen by the process
/// id (`fencelock_launch::free_port` says why).
pub fn free_port() -> u16 {
    fencelock_launch::free_port().unwrap()
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
        let dir = tempfile::tempdir().unwrap();
        let mut spec = ClusterSpec::new(env!("CARGO_BIN_EXE_fencelockd"), dir.path(), size);
        spec.flags = FLAGS.iter().map(|flag| (*flag).to_owned()).collect();
        let layout = Layout::new(spec).unwrap();
        let nodes = layout
            .nodes()
            .iter()
            .map(|node| Node {
                id: node.id,
                peer_addr: node.peer_addr.to_string(),
                client_addr: node.client_addr.to_string(),
                extra_args: Vec::new(),
                child: None,
            })
            .collect();
        Cluster { nodes, dir, layout }
    }

    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.layout.node(id).unwrap().data_dir.clone()
    }

    pub fn log(&self, id: u64) -> String {
        self.layout.log(id)
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.layout.endpoints()
    }

    pub fn launch(&mut self, id: u64) {
        let node = &mut self.nodes[(id - 1) as usize];
        assert!(node.child.is_none());
        self.layout.node_mut(id).unwrap().flags = node.extra_args.clone();
        node.child = Some(self.layout.spawn(id).unwrap());
    }

    /// kill -9.
    pub fn kill(&mut self, id: u64) {
        let child = self.nodes[(id - 1) as usize].child.take().expect("node is running");
        child.kill9().unwrap();
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

    /// Waits for a leader that the running nodes agree on. (The launcher
    /// asks them on connections of its own; `_client` stays for the tests
    /// that pass theirs.)
    pub fn leader(&self, _client: &Client) -> u64 {
        let running: Vec<_> = self
            .nodes
            .iter()
            .filter(|node| node.child.is_some())
            .map(|node| self.layout.node(node.id).unwrap().client_addr)
            .collect();
        fencelock_launch::probe::wait_for_leader(&running, DEADLINE)
            .unwrap_or_else(|err| panic!("{err}: {}", self.logs()))
    }

    /// Every node's whole log.
    pub fn logs_all(&self) -> String {
        self.nodes.iter().map(|node| self.log(node.id)).collect::<Vec<_>>().join("\n")
    }

    /// The last lines of every node's log, for a failure message.
    pub fn logs(&self) -> String {
        self.layout.log_tails(15)
    }
}

/// Sends `request` to `addr` and returns the whole answer.
pub fn http(addr: &str, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(request).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// The value of the sample named `name` (labels included) in a scrape.
pub fn sample(scrape: &str, name: &str) -> Option<f64> {
    scrape.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}
