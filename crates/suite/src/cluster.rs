//! A cluster of real `fencelockd` processes on 127.0.0.1, each behind a
//! [`PeerProxy`], with the faults the nemeses need: kill -9 and restart,
//! SIGSTOP and SIGCONT, a wiped data directory, and cut links.
//!
//! `fencelock-launch` owns the ports, the processes and their files: each
//! node gets a peer port, a client port, a data directory and a JSON log in
//! the run's directory. A node's `--peers` names its own real peer port
//! (where it listens) and the other nodes' proxies (their advertised peer
//! addresses), so every byte between nodes passes through the suite.
//! Dropping the cluster kills whatever still runs (paused processes
//! included: SIGKILL works on a stopped process).
//!
//! The membership can change while the cluster runs: [`Cluster::join`]
//! starts a node that joins with `--join` (behind a proxy of its own), and
//! [`Cluster::remove`] removes a member with `member remove` and reaps its
//! process, which must exit with code 3. A removed node is retired: it keeps
//! its log but is no longer among [`Cluster::ids`], and nothing restarts it.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use fencelock_client::{Client, NodeStatus};
use fencelock_launch::ClusterSpec;

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

/// How long [`Cluster::stop`] lets the nodes stop cleanly before SIGKILL.
const STOP_WITHIN: Duration = Duration::from_secs(10);

/// How long a joining node may take to be added, catch up and be promoted
/// to voter.
pub const JOIN_WITHIN: Duration = Duration::from_secs(30);

/// How long a removed node may take to stop, once its removal applied.
const REMOVED_EXIT_WITHIN: Duration = Duration::from_secs(15);

/// The exit code of a node removed from the cluster (fencelockd's
/// `EXIT_REMOVED`).
pub const EXIT_REMOVED: i32 = 3;

/// The members to watch, by id with their client addresses: shared with
/// the monitor thread, which polls them while the membership changes.
pub type Watched = Arc<Mutex<Vec<(u64, String)>>>;

/// How a cluster is started.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub server: PathBuf,
    pub dir: PathBuf,
    pub nodes: u64,
    /// Extra environment per node id (1-based index = id - 1), for a node
    /// whose clock runs at another rate.
    pub node_env: Vec<Vec<(String, String)>>,
    /// TLS on both ports, and for the suite's clients.
    pub tls: bool,
}

/// The running cluster.
#[derive(Debug)]
pub struct Cluster {
    /// First, so that dropping the cluster kills the nodes before their
    /// proxies stop.
    launch: fencelock_launch::Cluster,
    /// By node index (id - 1).
    proxies: Vec<PeerProxy>,
    pub rules: Arc<Rules>,
    /// A client used only for `status`, with a short timeout.
    status_client: Client,
    /// Nodes removed from the cluster: never restarted, not among `ids`.
    retired: BTreeSet<u64>,
    watched: Watched,
}

impl Cluster {
    pub fn start(config: &ClusterConfig) -> Result<Cluster> {
        Cluster::start_with_flags(config, &[])
    }

    /// As [`Cluster::start`], every node also given `flags` (after the
    /// suite's timings; a flag may be given once).
    pub fn start_with_flags(config: &ClusterConfig, flags: &[String]) -> Result<Cluster> {
        let mut spec = ClusterSpec::new(&config.server, &config.dir, config.nodes);
        spec.flags = [
            ("--tick-ms", TICK_MS.to_string()),
            ("--election-ms", ELECTION_MS.to_string()),
            ("--heartbeat-ms", HEARTBEAT_MS.to_string()),
            ("--lease-min-ms", LEASE_MIN_MS.to_string()),
            ("--log-format", "json".to_owned()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_owned(), value])
        .chain(flags.iter().cloned())
        .collect();
        spec.tls = config.tls;
        let mut launch = fencelock_launch::Cluster::configure(spec)?;
        crate::tls::set(launch.layout().certs_dir().map(|certs_dir| fencelock_client::TlsConfig {
            certs_dir: certs_dir.to_owned(),
            user: fencelock_launch::TLS_USER.to_owned(),
        }));
        let rules = Arc::new(Rules::default());
        let mut proxies = Vec::new();
        for (index, id) in launch.ids().into_iter().enumerate() {
            let node = launch.layout_mut().node_mut(id)?;
            let proxy = PeerProxy::start(id, node.peer_addr, Arc::clone(&rules))?;
            node.advertised_peer_addr = Some(proxy.listen_addr());
            // What the member directory records for it, so that a node that
            // joins later reaches it through its proxy too.
            node.flags = vec!["--advertise-peer-addr".into(), proxy.listen_addr().to_string()];
            node.env = config.node_env.get(index).cloned().unwrap_or_default();
            proxies.push(proxy);
        }
        let mut status_config = crate::tls::client_config(launch.endpoints());
        status_config.request_timeout = STATUS_TIMEOUT;
        status_config.retry_for = Duration::ZERO;
        status_config.owner = Some(crate::tls::owner("suite-status").into_bytes());
        let status_client = Client::connect(status_config)?;
        for id in launch.ids() {
            launch.launch(id)?;
        }
        let watched = Arc::new(Mutex::new(launch.ids().into_iter().zip(launch.endpoints()).collect()));
        Ok(Cluster { launch, proxies, rules, status_client, retired: BTreeSet::new(), watched })
    }

    /// The members: every node but those removed.
    pub fn ids(&self) -> Vec<u64> {
        self.launch.ids().into_iter().filter(|id| !self.retired.contains(id)).collect()
    }

    /// The members' client addresses, in the order of [`Cluster::ids`].
    pub fn endpoints(&self) -> Vec<String> {
        self.members().map(|node| node.client_addr.to_string()).collect()
    }

    /// The members, kept up to date as they change, for a thread that
    /// polls them.
    pub fn watched(&self) -> Watched {
        Arc::clone(&self.watched)
    }

    fn members(&self) -> impl Iterator<Item = &fencelock_launch::NodeSpec> {
        self.launch.layout().nodes().iter().filter(|node| !self.retired.contains(&node.id))
    }

    fn update_watched(&self) {
        let members = self.ids().into_iter().zip(self.endpoints()).collect();
        *self.watched.lock().unwrap_or_else(PoisonError::into_inner) = members;
    }

    /// A member's id by its rank among the members (`rank` modulo their
    /// number): how a fault drawn from the seed names a node whose id the
    /// membership changes may have retired.
    pub fn member_at(&self, rank: u64) -> Option<u64> {
        let ids = self.ids();
        let len = u64::try_from(ids.len()).ok().filter(|len| *len > 0)?;
        ids.get(usize::try_from(rank % len).ok()?).copied()
    }

    /// `id` if it is a member; otherwise the member at its rank.
    pub fn resolve(&self, id: u64) -> Option<u64> {
        if self.ids().contains(&id) {
            Some(id)
        } else {
            self.member_at(id.saturating_sub(1))
        }
    }

    /// Whether node `id` was one of the nodes the cluster started with (the
    /// workload's clients know the cluster by their addresses).
    pub fn is_initial(&self, id: u64) -> bool {
        self.launch.layout().node(id).is_ok_and(|node| !node.joined)
    }

    /// A client for membership calls, on the members' addresses.
    fn admin_client(&self) -> Result<Client> {
        let mut config = crate::tls::client_config(self.endpoints());
        config.request_timeout = Duration::from_secs(2);
        config.retry_for = Duration::from_secs(10);
        config.owner = Some(crate::tls::owner("suite-admin").into_bytes());
        Ok(Client::connect(config)?)
    }

    /// Starts a new node with `--join` (the members' client addresses),
    /// behind a proxy of its own, and waits until the cluster lists it as
    /// a voter: added as a learner, caught up, promoted. Returns its id.
    pub fn join(&mut self) -> Result<u64> {
        let endpoints = self.endpoints().join(",");
        let id = self.launch.add_node()?;
        let node = self.launch.layout_mut().node_mut(id)?;
        let proxy = PeerProxy::start(id, node.peer_addr, Arc::clone(&self.rules))?;
        node.advertised_peer_addr = Some(proxy.listen_addr());
        node.flags =
            vec!["--join".into(), endpoints, "--advertise-peer-addr".into(), proxy.listen_addr().to_string()];
        self.proxies.push(proxy);
        self.launch.launch(id)?;
        self.update_watched();
        let admin = self.admin_client()?;
        let deadline = Instant::now() + JOIN_WITHIN;
        loop {
            let listed = admin.member_list().ok();
            if listed.is_some_and(|list| list.members.iter().any(|m| m.id == id && m.role == "voter")) {
                return Ok(id);
            }
            if let Some(status) = self.launch.wait_exit(id, Duration::ZERO)? {
                bail!("node {id} exited ({status}) while joining; {}", self.log_tails(8));
            }
            if Instant::now() >= deadline {
                bail!("node {id} was not a voter within {JOIN_WITHIN:?}; {}", self.log_tails(8));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Removes member `id` with `member remove` (retried by the client
    /// across leader changes; removing the leader hands leadership over
    /// first). A running node must then stop by itself with exit code 3; a
    /// stopped one stays stopped. Either way it is retired.
    pub fn remove(&mut self, id: u64) -> Result<()> {
        let admin = self.admin_client()?;
        let is_member =
            |list: &fencelock_client::Membership| list.members.iter().any(|member| member.id == id);
        match admin.member_remove(id) {
            Ok(listed) if is_member(&listed) => {
                bail!("node {id} is still a member after its removal: {:?}", listed.members)
            }
            Ok(_) => {}
            // No definite answer (a leader lost mid-change): the list says
            // whether it applied.
            Err(err) => {
                let deadline = Instant::now() + Duration::from_secs(5);
                while admin.member_list().map_or(true, |list| is_member(&list)) {
                    if Instant::now() >= deadline {
                        return Err(anyhow::Error::new(err).context(format!("member remove {id}")));
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        self.retired.insert(id);
        self.update_watched();
        if !self.launch.is_running(id) {
            return Ok(());
        }
        if self.launch.is_paused(id) {
            self.launch.resume(id)?;
        }
        match self.launch.wait_exit(id, REMOVED_EXIT_WITHIN)? {
            Some(status) if status.code() == Some(EXIT_REMOVED) => Ok(()),
            Some(status) => bail!("removed node {id} exited with {status}, not code {EXIT_REMOVED}"),
            None => {
                self.launch.kill9(id)?;
                bail!("removed node {id} still ran {REMOVED_EXIT_WITHIN:?} after its removal")
            }
        }
    }

    /// Starts node `id`'s process (again), on its data directory.
    pub fn launch(&mut self, id: u64) -> Result<()> {
        Ok(self.launch.launch(id)?)
    }

    /// The extra environment node `id` starts with from its next launch on
    /// (empty: none).
    pub fn set_env(&mut self, id: u64, env: Vec<(String, String)>) -> Result<()> {
        self.launch.layout_mut().node_mut(id)?.env = env;
        Ok(())
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.launch.is_running(id)
    }

    /// The process id of node `id`, while it runs.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.launch.pid(id)
    }

    /// Each node's client address and its real peer address (where it
    /// listens, behind its proxy), by id.
    pub fn addrs(&self) -> Vec<(u64, SocketAddr, SocketAddr)> {
        self.launch.layout().nodes().iter().map(|node| (node.id, node.client_addr, node.peer_addr)).collect()
    }

    /// Waits up to `within` for node `id` to answer `status`; an error at
    /// once if any node's process has exited.
    pub fn wait_until_answers(&mut self, id: u64, within: Duration) -> Result<()> {
        Ok(self.launch.wait_until_answers(id, within)?)
    }

    /// kill -9, and reaps the process.
    pub fn kill9(&mut self, id: u64) -> Result<()> {
        Ok(self.launch.kill9(id)?)
    }

    /// SIGSTOP: the process freezes, its sockets stay open.
    pub fn pause(&mut self, id: u64) -> Result<()> {
        Ok(self.launch.pause(id)?)
    }

    /// SIGCONT.
    pub fn resume(&mut self, id: u64) -> Result<()> {
        Ok(self.launch.resume(id)?)
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
        self.members()
            .map(|node| {
                let status = if self.launch.is_running(node.id) && !self.launch.is_paused(node.id) {
                    self.status_client.status(&node.client_addr.to_string()).ok()
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
        Ok(self.launch.wipe(id)?)
    }

    /// Waits up to `within` for node `id` to answer a status that says it
    /// is no longer rejoining, and for a leader.
    pub fn wait_for_rejoin(&self, id: u64, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let statuses = self.statuses();
            // A blank node still waiting for its peers' hellos has not
            // decided to rejoin yet: `rejoining` is false then too.
            let caught_up = statuses.iter().any(|(node, status)| {
                *node == id && status.as_ref().is_some_and(|status| !status.rejoining && !status.starting)
            });
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
        self.launch.stop(STOP_WITHIN);
        for proxy in &mut self.proxies {
            proxy.stop();
        }
    }

    /// Removes the nodes' data directories, retired ones' too (their logs
    /// stay).
    pub fn remove_data(&self) {
        for id in self.launch.ids() {
            let _ = self.launch.layout().wipe(id);
        }
    }

    /// The last `lines` lines of each node's log, for an error message.
    pub fn log_tails(&self, lines: usize) -> String {
        self.launch.layout().log_tails(lines)
    }

    /// Each node's addresses, for the report.
    pub fn describe(&self) -> Vec<serde_json::Value> {
        self.launch
            .layout()
            .nodes()
            .iter()
            .zip(&self.proxies)
            .map(|(node, proxy)| {
                serde_json::json!({
                    "id": node.id,
                    "client_addr": node.client_addr.to_string(),
                    "peer_addr": node.peer_addr.to_string(),
                    "proxy_addr": proxy.listen_addr().to_string(),
                    "joined": node.joined,
                    "removed": self.retired.contains(&node.id),
                })
            })
            .collect()
    }

    pub fn log_paths(&self) -> Vec<&Path> {
        self.launch.layout().nodes().iter().map(|node| node.log.as_path()).collect()
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
