//! An in-process cluster of real drivers (`shell::spawn` over raft-engine on
//! temporary data directories), joined by router threads instead of sockets.
//! The routers can isolate and partition nodes; nodes can be crashed (the
//! thread stopped and the engine dropped without any flush) and restarted
//! on their data directories.

// Test support, also compiled into the throughput bench: unwrapping is how it fails.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, never, Receiver, Sender};
use fencelock_raft::shell::{self, Channels, Clock, Request, Responder, ShellConfig, SyncDisk};
use fencelock_raft::{
    AsyncEngineStore, Config, Durable as _, EngineStore, FatalError, Node as FencelockNode, NodeConfig,
    NodeId, NodeStatus, Query, Reply, RequestError, Response, Role, Stats, WriteBatch,
};
use fencelock_types::{ApplyResult, Command, FencingToken, Key, LeaseMs, Owner};
use raft::prelude::{ConfState, Message};
use tempfile::TempDir;

/// A clock that moves only when told to: each node has one, so that a test
/// can freeze it, skew it or run it fast.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new(now_ms: u64) -> ManualClock {
        ManualClock { now_ms: Arc::new(AtomicU64::new(now_ms)) }
    }

    pub fn set(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }

    pub fn advance(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

/// How long a test waits for anything before failing.
pub const DEADLINE: Duration = Duration::from_secs(20);

pub struct Cluster {
    pub size: u64,
    dirs: Vec<TempDir>,
    /// Each node's lease clock: it moves only when a test moves it, and it
    /// survives restarts.
    clocks: Vec<ManualClock>,
    nodes: Vec<Option<RunningNode>>,
    /// Each node's inbound peer channel, looked up by the routers.
    inboxes: Arc<RwLock<Vec<Option<Sender<Message>>>>>,
    /// Pairs (from, to) whose messages are dropped.
    cut: Arc<RwLock<BTreeSet<(u64, u64)>>>,
    tune: fn(&mut Config),
    logger: slog::Logger,
}

struct RunningNode {
    requests: Sender<Request>,
    stop: Sender<()>,
    thread: JoinHandle<Result<Stats, FatalError>>,
    router: JoinHandle<()>,
}

impl Cluster {
    pub fn start(size: u64) -> Cluster {
        Cluster::start_with(size, |_| {})
    }

    /// Starts `size` nodes; `tune` adjusts each node's driver config.
    pub fn start_with(size: u64, tune: fn(&mut Config)) -> Cluster {
        let dirs = (0..size).map(|_| tempfile::tempdir().expect("temporary directory")).collect();
        let mut cluster = Cluster {
            size,
            dirs,
            clocks: (0..size).map(|_| ManualClock::new(0)).collect(),
            nodes: (0..size).map(|_| None).collect(),
            inboxes: Arc::new(RwLock::new(vec![None; size as usize])),
            cut: Arc::new(RwLock::new(BTreeSet::new())),
            tune,
            logger: test_logger(),
        };
        for id in 1..=size {
            cluster.restart(id);
        }
        cluster
    }

    /// Starts node `id` on its data directory (again).
    pub fn restart(&mut self, id: u64) {
        assert!(self.nodes[idx(id)].is_none(), "node {id} is running");
        let voters = (1..=self.size).map(NodeId).collect();
        let mut config = Config::new(NodeId(id), voters);
        // 200 to 400 ms: short enough for quick tests, long enough that a
        // loaded two-core machine does not see spurious elections.
        config.raft.election_ticks = 20;
        config.raft.heartbeat_ticks = 2;
        // Manual clocks stand still between a test's steps: scan at every
        // millisecond they move, so that deadlines are exact.
        config.leases.expiry_scan_interval_ms = 1;
        // 1 s leases, twice the longest election timeout above (the default
        // shortest, fencelockd's 2 s, is for its 500 ms elections).
        config.leases.lease_min_ms = 1_000;
        (self.tune)(&mut config);
        let mut store = EngineStore::open(self.dirs[idx(id)].path()).expect("open raft-engine");
        if store.is_blank().expect("read raft-engine") {
            // Bootstrapped with its voters, as a cluster whose nodes all
            // start new: this harness exchanges no hellos.
            let voters: Vec<u64> = config.voters.iter().map(|voter| voter.0).collect();
            let conf_state = ConfState::from((voters, vec![]));
            store
                .write(&WriteBatch { conf_state: Some(conf_state), ..Default::default() })
                .expect("bootstrap");
        }
        let config = NodeConfig { driver: config, tick_ms: None, election_seed: None };
        // Node 2 writes on its driver thread, the others through an I/O
        // thread: every cluster runs both kinds of store, either leading.
        let (peers_out_tx, peers_out_rx) = bounded::<Message>(4096);
        let (recovered, disk, persisted) = if id == 2 {
            let recovered = store.recover().expect("read raft-engine");
            (recovered, Disk::Sync(Box::new(SyncDisk::new(store))), never())
        } else {
            let (store, recovered, persisted) =
                AsyncEngineStore::spawn(store, format!("test-io-{id}"), Box::new(|| {}))
                    .expect("start the I/O thread");
            (recovered, Disk::Async(store), persisted)
        };
        let node = FencelockNode::open(config, recovered, &self.logger).expect("open node");

        let (requests_tx, requests_rx) = bounded(1024);
        let (peers_in_tx, peers_in_rx) = bounded(4096);
        let (stop_tx, stop_rx) = bounded(1);
        let shell_config = ShellConfig { tick_interval: Duration::from_millis(10), drain_max: 4096 };
        let channels = Channels {
            requests: requests_rx,
            peers_in: peers_in_rx,
            peers_out: Box::new(peers_out_tx),
            stop: stop_rx,
            persisted,
        };
        let clock = self.clocks[idx(id)].clone();
        let thread = match disk {
            Disk::Sync(disk) => shell::spawn(node, *disk, clock, shell_config, channels, &self.logger),
            Disk::Async(disk) => shell::spawn(node, disk, clock, shell_config, channels, &self.logger),
        }
        .expect("spawn driver");
        self.inboxes.write().unwrap()[idx(id)] = Some(peers_in_tx);
        let router = self.spawn_router(id, peers_out_rx);
        self.nodes[idx(id)] = Some(RunningNode { requests: requests_tx, stop: stop_tx, thread, router });
    }
}

/// Either kind of disk.
enum Disk {
    Sync(Box<SyncDisk<EngineStore>>),
    Async(AsyncEngineStore),
}

impl Cluster {
    fn spawn_router(&self, from: u64, outbound: Receiver<Message>) -> JoinHandle<()> {
        let inboxes = Arc::clone(&self.inboxes);
        let cut = Arc::clone(&self.cut);
        std::thread::spawn(move || {
            for message in outbound {
                let to = message.to;
                if cut.read().unwrap().contains(&(from, to)) {
                    continue;
                }
                let inbox = inboxes.read().unwrap().get(idx(to)).cloned().flatten();
                if let Some(inbox) = inbox {
                    let _ = inbox.try_send(message);
                }
            }
        })
    }

    /// Stops node `id` at once: no clean shutdown, no flush beyond what each
    /// `Ready` already synced.
    pub fn crash(&mut self, id: u64) -> Result<Stats, FatalError> {
        let node = self.nodes[idx(id)].take().expect("node is running");
        self.inboxes.write().unwrap()[idx(id)] = None;
        let _ = node.stop.send(());
        let result = node.thread.join().expect("driver thread panicked");
        node.router.join().expect("router thread panicked");
        result
    }

    /// Node `id`'s lease clock.
    pub fn clock(&self, id: u64) -> &ManualClock {
        &self.clocks[idx(id)]
    }

    /// Sets every node's lease clock to `now_ms`.
    pub fn set_all_clocks(&self, now_ms: u64) {
        for clock in &self.clocks {
            clock.set(now_ms);
        }
    }

    /// Asks the leader to hand leadership to `to`, and waits until it has.
    pub fn transfer_leader(&self, to: u64) {
        let deadline = Instant::now() + DEADLINE;
        while self.leader() != to {
            let leader = self.leader();
            let node = self.nodes[idx(leader)].as_ref().expect("leader is running");
            node.requests.send(Request::TransferLeader { to: NodeId(to) }).expect("driver is running");
            assert!(Instant::now() < deadline, "leadership did not move to {to}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends an acquire to `id` and returns the channel its reply comes on.
    pub fn acquire_async(
        &self,
        id: u64,
        key_name: &str,
        owner: &str,
        lease_ms: u64,
        wait_ms: u64,
    ) -> Receiver<Reply> {
        let (tx, rx) = bounded(1);
        let node = self.nodes[idx(id)].as_ref().expect("node is running");
        let request = Request::Acquire {
            key: key(key_name),
            lease_ms: LeaseMs::new(lease_ms).unwrap(),
            owner: Owner::new(owner.as_bytes().to_vec()).unwrap(),
            wait_ms,
            reply: Responder::channel(tx),
        };
        node.requests.send(request).expect("driver is running");
        rx
    }

    /// The lock table node `id` has applied, as of now.
    pub fn local_table(&self, id: u64) -> fencelock_fsm::LockTable {
        let (_, bytes) = self.table(id).expect("node is running");
        fencelock_fsm::LockTable::restore(&bytes).unwrap()
    }

    /// Polls `condition` until it holds, failing after the deadline.
    pub fn wait_for(&self, what: &str, mut condition: impl FnMut(&Cluster) -> bool) {
        let deadline = Instant::now() + DEADLINE;
        while !condition(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.nodes[idx(id)].is_some()
    }

    pub fn running(&self) -> Vec<u64> {
        (1..=self.size).filter(|id| self.is_running(*id)).collect()
    }

    /// Drops every message between `a` and the rest, both ways.
    pub fn isolate(&self, a: u64) {
        let others: Vec<u64> = (1..=self.size).filter(|id| *id != a).collect();
        self.partition(&[vec![a], others]);
    }

    /// Drops every message between different groups.
    pub fn partition(&self, groups: &[Vec<u64>]) {
        let mut cut = self.cut.write().unwrap();
        cut.clear();
        for (i, one) in groups.iter().enumerate() {
            for (j, other) in groups.iter().enumerate() {
                if i != j {
                    for a in one {
                        for b in other {
                            cut.insert((*a, *b));
                        }
                    }
                }
            }
        }
    }

    pub fn heal(&self) {
        self.cut.write().unwrap().clear();
    }

    pub fn status(&self, id: u64) -> Option<NodeStatus> {
        let node = self.nodes[idx(id)].as_ref()?;
        let (tx, rx) = bounded(1);
        node.requests.send(Request::Status { reply: tx }).ok()?;
        rx.recv_timeout(DEADLINE).ok()
    }

    pub fn table(&self, id: u64) -> Option<(u64, Vec<u8>)> {
        let node = self.nodes[idx(id)].as_ref()?;
        let (tx, rx) = bounded(1);
        node.requests.send(Request::Table { reply: tx }).ok()?;
        rx.recv_timeout(DEADLINE).ok()
    }

    /// Waits for a ready leader among `among` that every other node of
    /// `among` follows.
    pub fn leader_among(&self, among: &[u64]) -> u64 {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let statuses: Vec<NodeStatus> = among.iter().filter_map(|id| self.status(*id)).collect();
            let leader = statuses.iter().find(|s| s.role == Role::Leader && s.leader_ready);
            if let Some(leader) = leader {
                let term = leader.term;
                if statuses.iter().all(|s| s.term == term && s.leader == Some(leader.id)) {
                    return leader.id.0;
                }
            }
            assert!(Instant::now() < deadline, "no leader among {among:?}: {statuses:#?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn leader(&self) -> u64 {
        self.leader_among(&self.running())
    }

    /// Sends a proposal to `id` and returns the channel its reply comes on.
    pub fn propose_async(&self, id: u64, commands: Vec<Command>) -> Receiver<Reply> {
        let (tx, rx) = bounded(1);
        let node = self.nodes[idx(id)].as_ref().expect("node is running");
        node.requests
            .send(Request::Propose { commands, reply: Responder::channel(tx) })
            .expect("driver is running");
        rx
    }

    pub fn propose(&self, id: u64, commands: Vec<Command>) -> Reply {
        self.propose_async(id, commands).recv_timeout(DEADLINE).expect("a reply within the deadline")
    }

    pub fn read(&self, id: u64, query: Query) -> Reply {
        let (tx, rx) = bounded(1);
        let node = self.nodes[idx(id)].as_ref().expect("node is running");
        node.requests
            .send(Request::Read { query, reply: Responder::channel(tx) })
            .expect("driver is running");
        rx.recv_timeout(DEADLINE).expect("a reply within the deadline")
    }

    /// Proposes through whichever node leads, retrying retryable errors (a
    /// retried Grant by the same owner can never grant twice).
    pub fn propose_on_leader(&self, commands: Vec<Command>) -> Vec<ApplyResult> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let leader = self.leader();
            match self.propose(leader, commands.clone()) {
                Ok(Response::Applied(results)) => return results,
                Ok(other) => panic!("unexpected response {other:?}"),
                Err(RequestError::Held { .. }) => panic!("held: {commands:?}"),
                Err(err) => assert!(Instant::now() < deadline, "gave up on {commands:?}: {err}"),
            }
        }
    }

    /// Grants `key` to `owner` through the leader and returns the token.
    pub fn grant(&self, key: &str, owner: &str) -> FencingToken {
        match self.propose_on_leader(vec![grant(key, owner)]).as_slice() {
            [ApplyResult::Granted { token, .. }] => *token,
            other => panic!("grant of {key} to {owner}: {other:?}"),
        }
    }

    /// Waits until every running node has applied the same index and holds
    /// byte-identical tables; returns those bytes.
    pub fn converged(&self) -> Vec<u8> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let tables: Vec<(u64, Vec<u8>)> =
                self.running().iter().filter_map(|id| self.table(*id)).collect();
            if tables.len() == self.running().len() && tables.windows(2).all(|w| w[0] == w[1]) {
                return tables[0].1.clone();
            }
            assert!(
                Instant::now() < deadline,
                "tables did not converge: {:?}",
                tables.iter().map(|(applied, bytes)| (*applied, bytes.len())).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops every node and returns each one's final counters.
    pub fn stop(mut self) -> Vec<Stats> {
        self.running().into_iter().filter_map(|id| self.crash(id).ok()).collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in self.nodes.iter_mut().filter_map(Option::take) {
            let _ = node.stop.send(());
            let _ = node.thread.join();
        }
        self.inboxes.write().map(|mut inboxes| inboxes.clear()).ok();
    }
}

fn idx(id: u64) -> usize {
    (id - 1) as usize
}

pub fn test_logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

pub fn key(name: &str) -> Key {
    Key::new(name.as_bytes().to_vec()).unwrap()
}

pub fn grant(key_name: &str, owner: &str) -> Command {
    Command::Grant {
        session: None,
        key: key(key_name),
        lease_ms: LeaseMs::new(30_000).unwrap(),
        owner: Owner::new(owner.as_bytes().to_vec()).unwrap(),
        value: fencelock_types::Value::none(),
    }
}

pub fn release(key_name: &str, token: Option<FencingToken>) -> Command {
    Command::Release { key: key(key_name), token, user: None }
}
