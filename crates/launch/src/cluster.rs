//! A cluster's layout (who listens where, what each node is told, where its
//! data and log go, what it runs with) and the cluster of processes started
//! from it.

use std::fs;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ports::free_addr;
use crate::probe;
use crate::process::{Process, Stopped};
use crate::LaunchError;

/// How a cluster is laid out and started.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// The `fencelockd` binary.
    pub server: PathBuf,
    /// Node N's data goes to `dir/node-N`, its stderr to `dir/node-N.log`
    /// (appended to, so a restarted node's log goes on).
    pub dir: PathBuf,
    /// Nodes 1 to `nodes`.
    pub nodes: u64,
    /// Flags every node gets after `--id`, `--peers`, `--client-addr` and
    /// `--data-dir` (timings, `--log-format json`), before its own.
    pub flags: Vec<String>,
    /// Each node in a process group of its own (a Ctrl-C in the terminal
    /// does not reach it), left running when its handle is dropped.
    pub detached: bool,
    /// TLS on both ports: certificates are made in `dir/certs` (a CA, each
    /// node's for 127.0.0.1, and the user [`TLS_USER`]'s), and every node
    /// starts with `--certs-dir`.
    pub tls: bool,
}

/// The user a TLS cluster's certificates are made for.
pub const TLS_USER: &str = "fencelock";

impl ClusterSpec {
    /// `nodes` nodes of `server` in `dir`, with fencelockd's default flags,
    /// killed when dropped.
    pub fn new(server: impl Into<PathBuf>, dir: impl Into<PathBuf>, nodes: u64) -> ClusterSpec {
        ClusterSpec {
            server: server.into(),
            dir: dir.into(),
            nodes,
            flags: Vec::new(),
            detached: false,
            tls: false,
        }
    }
}

/// One node's part of the layout. Changes take effect at its next start.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub id: u64,
    /// Where it listens for peers: its own entry in its `--peers`.
    pub peer_addr: SocketAddr,
    /// What the other nodes are told its peer address is, when that is not
    /// `peer_addr`: a proxy in front of it.
    pub advertised_peer_addr: Option<SocketAddr>,
    pub client_addr: SocketAddr,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    /// Its own flags, after the cluster's.
    pub flags: Vec<String>,
    /// Extra environment (libfaketime's, for a clock at another rate).
    pub env: Vec<(String, String)>,
    /// Added to the running cluster ([`Layout::add_node`]): its `--peers`
    /// names only itself (it learns the members by joining), and the
    /// initial nodes' `--peers` do not name it.
    pub joined: bool,
}

impl NodeSpec {
    /// Node `id` in `dir`, on two free ports, with no flags of its own.
    fn fresh(dir: &Path, id: u64, joined: bool) -> Result<NodeSpec, LaunchError> {
        Ok(NodeSpec {
            id,
            peer_addr: free_addr()?,
            advertised_peer_addr: None,
            client_addr: free_addr()?,
            data_dir: dir.join(format!("node-{id}")),
            log: dir.join(format!("node-{id}.log")),
            flags: Vec::new(),
            env: Vec::new(),
            joined,
        })
    }
}

/// Where every node of a cluster listens and keeps its files, and how each
/// is started. It owns no process: [`Layout::spawn`] hands the started one
/// to the caller, and [`Cluster`] keeps them.
#[derive(Clone, Debug)]
pub struct Layout {
    server: PathBuf,
    dir: PathBuf,
    flags: Vec<String>,
    detached: bool,
    nodes: Vec<NodeSpec>,
    /// With TLS: the certificates directory and [`TLS_USER`]'s client
    /// configuration, for probes.
    tls: Option<(PathBuf, Arc<rustls::ClientConfig>)>,
}

impl Layout {
    /// Chooses every node's two ports ([`crate::free_port`]) and creates
    /// `spec.dir`.
    pub fn new(spec: ClusterSpec) -> Result<Layout, LaunchError> {
        fs::create_dir_all(&spec.dir).map_err(|source| LaunchError::file("create", &spec.dir, source))?;
        let nodes = (1..=spec.nodes)
            .map(|id| NodeSpec::fresh(&spec.dir, id, false))
            .collect::<Result<_, LaunchError>>()?;
        let tls = if spec.tls { Some(make_certs(&spec.dir.join("certs"), spec.nodes)?) } else { None };
        let mut flags = spec.flags;
        if let Some((certs, _)) = &tls {
            flags.push("--certs-dir".into());
            flags.push(certs.display().to_string());
        }
        Ok(Layout { server: spec.server, dir: spec.dir, flags, detached: spec.detached, nodes, tls })
    }

    /// With TLS, the certificates directory, where [`TLS_USER`]'s
    /// certificate is.
    pub fn certs_dir(&self) -> Option<&Path> {
        self.tls.as_ref().map(|(dir, _)| dir.as_path())
    }

    /// With TLS, [`TLS_USER`]'s client configuration.
    pub fn client_tls(&self) -> Option<&Arc<rustls::ClientConfig>> {
        self.tls.as_ref().map(|(_, config)| config)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn server(&self) -> &Path {
        &self.server
    }

    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|node| node.id).collect()
    }

    pub fn node(&self, id: u64) -> Result<&NodeSpec, LaunchError> {
        self.nodes.iter().find(|node| node.id == id).ok_or(LaunchError::NoNode(id))
    }

    pub fn node_mut(&mut self, id: u64) -> Result<&mut NodeSpec, LaunchError> {
        self.nodes.iter_mut().find(|node| node.id == id).ok_or(LaunchError::NoNode(id))
    }

    /// Every node's client address, in id order.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|node| node.client_addr.to_string()).collect()
    }

    /// A node for the running cluster, with the next id and ports of its
    /// own, not started: its flags (`--join`, say) are the caller's to set.
    /// Without TLS only: the certificates are made for the initial nodes.
    pub fn add_node(&mut self) -> Result<u64, LaunchError> {
        if self.tls.is_some() {
            return Err(LaunchError::Certificates("a node added to a TLS cluster has no certificate".into()));
        }
        let id = self.nodes.iter().map(|node| node.id).max().unwrap_or(0) + 1;
        self.nodes.push(NodeSpec::fresh(&self.dir, id, true)?);
        Ok(id)
    }

    /// The `--peers` of node `id`: its own peer address, where it listens,
    /// and the address every other node is advertised at. Only the ids must
    /// agree between nodes; the addresses are each node's own business. The
    /// initial nodes name the initial nodes; a node added later names only
    /// itself.
    pub fn peers_of(&self, id: u64) -> String {
        let joined = self.node(id).is_ok_and(|node| node.joined);
        self.nodes
            .iter()
            .filter(|node| if joined { node.id == id } else { !node.joined })
            .map(|node| {
                let addr = match node.advertised_peer_addr {
                    Some(advertised) if node.id != id => advertised,
                    _ => node.peer_addr,
                };
                format!("{}={addr}", node.id)
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts node `id`'s process on its data directory, stderr appended to
    /// its log. The caller owns what it returns.
    pub fn spawn(&self, id: u64) -> Result<Process, LaunchError> {
        let node = self.node(id)?;
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .map_err(|source| LaunchError::file("open", &node.log, source))?;
        let mut command = Command::new(&self.server);
        command
            .args(["--id", &id.to_string(), "--peers", &self.peers_of(id)])
            .args(["--client-addr", &node.client_addr.to_string()])
            .arg("--data-dir")
            .arg(&node.data_dir)
            .args(&self.flags)
            .args(&node.flags)
            .envs(node.env.iter().map(|(key, value)| (key.as_str(), value.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if self.detached {
            command.process_group(0);
        }
        let child =
            command.spawn().map_err(|source| LaunchError::Spawn { server: self.server.clone(), source })?;
        Ok(Process::new(id, child, self.detached))
    }

    /// Deletes node `id`'s data directory, a lost disk; one already gone is
    /// fine. The node should not be running.
    pub fn wipe(&self, id: u64) -> Result<(), LaunchError> {
        let data_dir = &self.node(id)?.data_dir;
        match fs::remove_dir_all(data_dir) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(LaunchError::file("delete", data_dir, source)),
        }
    }

    /// Node `id`'s log so far; empty if it has none.
    pub fn log(&self, id: u64) -> String {
        self.node(id).map(|node| fs::read_to_string(&node.log).unwrap_or_default()).unwrap_or_default()
    }

    /// The last `lines` lines of node `id`'s log.
    pub fn log_tail(&self, id: u64, lines: usize) -> String {
        let log = self.log(id);
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The last `lines` lines of every node's log, for an error message.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut text = String::from("server logs:");
        for node in &self.nodes {
            text.push_str(&format!("\n--- node {} ({})", node.id, node.log.display()));
            for line in self.log_tail(node.id, lines).lines() {
                text.push_str("\n  ");
                text.push_str(line);
            }
        }
        text
    }
}

/// A [`Layout`] and the processes started from it. Dropping it kills every
/// process that is not detached (paused ones too: SIGKILL works on a stopped
/// process).
#[derive(Debug)]
pub struct Cluster {
    layout: Layout,
    /// By node index (id - 1).
    processes: Vec<Option<Process>>,
}

impl Cluster {
    /// The layout, no node started yet.
    pub fn configure(spec: ClusterSpec) -> Result<Cluster, LaunchError> {
        let layout = Layout::new(spec)?;
        let processes = layout.nodes.iter().map(|_| None).collect();
        Ok(Cluster { layout, processes })
    }

    /// The layout, and every node started.
    pub fn start(spec: ClusterSpec) -> Result<Cluster, LaunchError> {
        let mut cluster = Cluster::configure(spec)?;
        for id in cluster.layout.ids() {
            cluster.launch(id)?;
        }
        Ok(cluster)
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The layout to change (flags, environment, advertised peer address);
    /// a change takes effect at a node's next start.
    pub fn layout_mut(&mut self) -> &mut Layout {
        &mut self.layout
    }

    pub fn ids(&self) -> Vec<u64> {
        self.layout.ids()
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.layout.endpoints()
    }

    /// Starts node `id` (again), on its data directory.
    pub fn launch(&mut self, id: u64) -> Result<(), LaunchError> {
        if self.slot(id)?.is_some() {
            return Err(LaunchError::Running(id));
        }
        let process = self.layout.spawn(id)?;
        *self.slot(id)? = Some(process);
        Ok(())
    }

    /// Adds a node to the layout ([`Layout::add_node`]), not started.
    pub fn add_node(&mut self) -> Result<u64, LaunchError> {
        let id = self.layout.add_node()?;
        self.processes.push(None);
        Ok(id)
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.process(id).is_some()
    }

    /// Waits up to `within` for node `id`'s process to exit on its own (a
    /// removed node does) and reaps it; `None` if it still runs.
    pub fn wait_exit(&mut self, id: u64, within: Duration) -> Result<Option<ExitStatus>, LaunchError> {
        let deadline = Instant::now() + within;
        loop {
            let slot = self.slot(id)?;
            let process = slot.as_mut().ok_or(LaunchError::NotRunning(id))?;
            if let Some(status) =
                process.try_wait().map_err(|source| LaunchError::Wait { node: id, source })?
            {
                *slot = None;
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn is_paused(&self, id: u64) -> bool {
        self.process(id).is_some_and(Process::is_paused)
    }

    /// The running node's process id.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.process(id).map(Process::id)
    }

    /// kill -9 of node `id`, reaped; nothing if it is not running.
    pub fn kill9(&mut self, id: u64) -> Result<(), LaunchError> {
        match self.slot(id)?.take() {
            Some(process) => process.kill9().map(|_| ()),
            None => Ok(()),
        }
    }

    /// SIGSTOP of node `id`.
    pub fn pause(&mut self, id: u64) -> Result<(), LaunchError> {
        self.slot(id)?.as_mut().ok_or(LaunchError::NotRunning(id))?.pause()
    }

    /// SIGCONT of node `id`, if it is paused (one that is not running is
    /// not).
    pub fn resume(&mut self, id: u64) -> Result<(), LaunchError> {
        match self.slot(id)? {
            Some(process) => process.resume(),
            None => Ok(()),
        }
    }

    /// A graceful stop of node `id`: SIGTERM, SIGKILL after `within`.
    pub fn stop_node(&mut self, id: u64, within: Duration) -> Result<Stopped, LaunchError> {
        self.slot(id)?.take().ok_or(LaunchError::NotRunning(id))?.stop(within)
    }

    /// A graceful stop of every running node: SIGTERM to all at once, then
    /// SIGKILL to those still up after `within`. Best effort; returns the
    /// ids that had to be killed.
    pub fn stop(&mut self, within: Duration) -> Vec<u64> {
        for process in self.processes.iter_mut().flatten() {
            // Already gone is fine: its log tells.
            let _ = process.terminate();
        }
        let deadline = Instant::now() + within;
        let mut killed = Vec::new();
        for process in self.processes.iter_mut().filter_map(Option::take) {
            let id = process.node();
            if !matches!(process.wait_until(deadline), Ok(Stopped::Exited(_))) {
                killed.push(id);
            }
        }
        killed
    }

    /// Deletes node `id`'s data directory; the node must be stopped.
    pub fn wipe(&mut self, id: u64) -> Result<(), LaunchError> {
        if self.is_running(id) {
            return Err(LaunchError::Running(id));
        }
        self.layout.wipe(id)
    }

    /// Waits up to `within` until every running node that is not paused
    /// answers `status` and all name the same leader; fails at once if a
    /// node's process exits.
    pub fn wait_for_leader(&mut self, within: Duration) -> Result<u64, LaunchError> {
        let tls = self.layout.client_tls().cloned();
        probe::poll_until(within, LaunchError::NoLeader { within }, || {
            self.check_alive()?;
            Ok(probe::agreed_leader_over(&self.answering_addrs(), tls.as_ref()))
        })
    }

    /// Waits up to `within` until node `id` answers `status`; fails at once
    /// if its process exits.
    pub fn wait_until_answers(&mut self, id: u64, within: Duration) -> Result<(), LaunchError> {
        let addr = self.layout.node(id)?.client_addr;
        let tls = self.layout.client_tls().cloned();
        probe::poll_until(within, LaunchError::NoAnswer { id, within }, || {
            self.check_alive()?;
            Ok(probe::status_over(addr, probe::STATUS_TIMEOUT, tls.as_ref()).ok().map(|_| ()))
        })
    }

    /// An error for the first running node whose process has exited.
    fn check_alive(&mut self) -> Result<(), LaunchError> {
        for process in self.processes.iter_mut().flatten() {
            let node = process.node();
            if let Some(status) = process.try_wait().map_err(|source| LaunchError::Wait { node, source })? {
                return Err(LaunchError::Exited { id: node, status });
            }
        }
        Ok(())
    }

    /// The client addresses of the nodes that can answer: running, not
    /// paused.
    fn answering_addrs(&self) -> Vec<SocketAddr> {
        self.layout
            .nodes
            .iter()
            .zip(&self.processes)
            .filter(|(_, process)| process.as_ref().is_some_and(|process| !process.is_paused()))
            .map(|(node, _)| node.client_addr)
            .collect()
    }

    fn process(&self, id: u64) -> Option<&Process> {
        let index = usize::try_from(id.checked_sub(1)?).ok()?;
        self.processes.get(index)?.as_ref()
    }

    fn slot(&mut self, id: u64) -> Result<&mut Option<Process>, LaunchError> {
        let index = id.checked_sub(1).and_then(|index| usize::try_from(index).ok());
        index.and_then(|index| self.processes.get_mut(index)).ok_or(LaunchError::NoNode(id))
    }
}

/// Makes a TLS cluster's certificates in `dir` (a CA, nodes 1 to `nodes`
/// on 127.0.0.1, the user [`TLS_USER`]), or keeps those already there (a
/// restarted cluster); returns the directory and the user's configuration.
fn make_certs(dir: &Path, nodes: u64) -> Result<(PathBuf, Arc<rustls::ClientConfig>), LaunchError> {
    let layout = fencelock_tls::Layout::new(dir);
    let certs = |err: fencelock_tls::CertError| LaunchError::Certificates(err.to_string());
    if !layout.ca_cert().exists() {
        fencelock_tls::create_ca(&layout, false).map_err(certs)?;
    }
    for id in 1..=nodes {
        if !layout.node_cert(id).exists() {
            fencelock_tls::create_node(&layout, id, &["127.0.0.1".to_owned(), "localhost".to_owned()], false)
                .map_err(certs)?;
        }
    }
    if !layout.client_cert(TLS_USER).exists() {
        fencelock_tls::create_client(&layout, TLS_USER, false).map_err(certs)?;
    }
    let config = fencelock_tls::client_tls(&layout, TLS_USER).map_err(certs)?;
    Ok((dir.to_owned(), config))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A stand-in for `fencelockd`: logs its arguments and environment, then
    /// sleeps until signalled, or exits at once with `exit` as its code.
    fn fake_server(dir: &Path, exit: Option<u8>) -> PathBuf {
        let path = dir.join("fake-fencelockd");
        let end = exit.map_or("exec sleep 30".to_owned(), |code| format!("exit {code}"));
        fs::write(&path, format!("#!/bin/sh\necho \"$@\" >&2\necho \"FAKE=$FAKE\" >&2\n{end}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn an_added_node_names_only_itself_and_its_exit_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let spec = ClusterSpec::new(fake_server(dir.path(), Some(3)), dir.path().join("cluster"), 3);
        let mut cluster = Cluster::configure(spec).unwrap();
        let id = cluster.add_node().unwrap();
        assert_eq!((id, cluster.ids()), (4, vec![1, 2, 3, 4]));
        let layout = cluster.layout();
        let added = layout.node(4).unwrap();
        assert!(added.joined && added.data_dir.ends_with("node-4"));
        assert_eq!(layout.peers_of(4), format!("4={}", added.peer_addr));
        for initial in 1..=3 {
            let peers = layout.peers_of(initial);
            assert_eq!(peers.split(',').count(), 3, "{peers}");
            assert!(!peers.contains("4="), "{peers}");
        }
        assert!(matches!(cluster.wait_exit(4, Duration::ZERO), Err(LaunchError::NotRunning(4))));
        cluster.launch(4).unwrap();
        let status = cluster.wait_exit(4, Duration::from_secs(10)).unwrap().unwrap();
        assert_eq!(status.code(), Some(3));
        assert!(!cluster.is_running(4));
        // Reaped: it can start again.
        cluster.launch(4).unwrap();
        assert!(cluster.wait_exit(4, Duration::from_secs(10)).unwrap().is_some());
    }

    #[test]
    fn a_node_cannot_be_added_to_a_tls_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = ClusterSpec::new(fake_server(dir.path(), None), dir.path().join("cluster"), 1);
        spec.tls = true;
        let mut cluster = Cluster::configure(spec).unwrap();
        assert!(matches!(cluster.add_node(), Err(LaunchError::Certificates(_))));
        assert_eq!(cluster.ids(), vec![1]);
    }

    #[test]
    fn nodes_start_with_their_flags_and_are_signalled_stopped_and_restarted() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = ClusterSpec::new(fake_server(dir.path(), None), dir.path().join("cluster"), 3);
        spec.flags = vec!["--log-format".into(), "json".into()];
        let mut cluster = Cluster::configure(spec).unwrap();
        let proxy: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let node = cluster.layout_mut().node_mut(2).unwrap();
        node.advertised_peer_addr = Some(proxy);
        node.flags = vec!["--metrics-addr".into(), "x".into()];
        node.env = vec![("FAKE".into(), "yes".into())];
        for id in cluster.ids() {
            cluster.launch(id).unwrap();
        }
        assert!(matches!(cluster.launch(1), Err(LaunchError::Running(1))));

        let layout = cluster.layout();
        let nodes = layout.nodes();
        // Node 2 listens on its own peer port; the others are told its proxy.
        assert!(layout.peers_of(2).contains(&format!("2={}", nodes[1].peer_addr)));
        assert!(layout.peers_of(1).contains(&format!("2={proxy}")));
        assert!(layout.peers_of(3).contains(&format!("1={}", nodes[0].peer_addr)));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !layout.log(2).contains("FAKE=yes") {
            assert!(Instant::now() < deadline, "{}", layout.log_tails(5));
            std::thread::sleep(Duration::from_millis(20));
        }
        let expected = format!(
            "--id 2 --peers {} --client-addr {} --data-dir {} --log-format json --metrics-addr x",
            layout.peers_of(2),
            nodes[1].client_addr,
            nodes[1].data_dir.display()
        );
        assert_eq!(layout.log(2).lines().next(), Some(expected.as_str()));

        cluster.pause(1).unwrap();
        assert!(cluster.is_paused(1));
        cluster.resume(1).unwrap();
        assert!(!cluster.is_paused(1));
        cluster.pause(3).unwrap();
        cluster.kill9(2).unwrap();
        assert!(!cluster.is_running(2) && cluster.pid(2).is_none());
        fs::create_dir_all(&cluster.layout().nodes()[1].data_dir).unwrap();
        cluster.wipe(2).unwrap();
        assert!(!cluster.layout().nodes()[1].data_dir.exists());
        assert!(matches!(cluster.wipe(1), Err(LaunchError::Running(1))));
        cluster.launch(2).unwrap();
        assert!(matches!(cluster.stop_node(2, Duration::from_secs(5)), Ok(Stopped::Exited(_))));
        // A paused node is resumed so that SIGTERM can stop it.
        assert_eq!(cluster.stop(Duration::from_secs(5)), Vec::<u64>::new());
        assert!(cluster.ids().iter().all(|id| !cluster.is_running(*id)));
    }

    #[test]
    fn a_node_that_exits_ends_the_wait_for_a_leader() {
        let dir = tempfile::tempdir().unwrap();
        let spec = ClusterSpec::new(fake_server(dir.path(), Some(3)), dir.path(), 1);
        let mut cluster = Cluster::start(spec).unwrap();
        let err = cluster.wait_for_leader(Duration::from_secs(10)).unwrap_err();
        assert!(matches!(err, LaunchError::Exited { id: 1, .. }), "{err}");
        let err = cluster.wait_until_answers(1, Duration::from_secs(10)).unwrap_err();
        assert!(matches!(err, LaunchError::Exited { id: 1, .. }), "{err}");
    }
}
