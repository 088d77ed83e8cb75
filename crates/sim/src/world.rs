//! One simulated cluster: real nodes (`fencelock_raft::Node`, the code
//! fencelockd runs) on simulated disks, a simulated network and clocks,
//! clients, and the fault schedule, all driven by one event queue in
//! simulated time from one seed. The clients live in `clients.rs`, the
//! faults in `faults.rs`, the clocks in `clock.rs`, the network in
//! `network.rs`; this file runs the nodes and the queue.
//!
//! The [`World`] holds each part's state, whose types sit below it
//! (`swarm.rs`, `builds.rs`, `client.rs`, `operator.rs`), and hands each
//! event to the handler that the part's own module (`faults.rs`,
//! `upgrade.rs`, `clients.rs`, `membership.rs`) adds to `World`: those
//! modules use this one, and this one names none of them.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_fsm::LockTable;
use fencelock_raft::{
    rejoin::ClusterState, Action, ClientRequest, Config, ConnId, Event as NodeEvent, FatalError, GrantRef,
    Node, NodeConfig, NodeId, Reply, RequestError, Role, RoleChange,
};
use fencelock_types::{LeaseMs, LEVEL};
use raft::prelude::Message;

use crate::builds::Builds;
use crate::client::{Client, Kind};
use crate::clock::NodeClock;

use crate::disk::SimDisk;
use crate::invariants::{convergence, shared, Checker};
use crate::network::Network;
use crate::operator::Operator;
use crate::rng::Rng;
use crate::swarm::Swarm;
use crate::{Report, SimConfig, Violation};
use fencelock_raft::gate::Refusal;

/// The length of a raft tick on each node's own clock.
pub(crate) const TICK_MS: u64 = 10;
/// The window election timeouts are drawn from, in ticks.
const ELECTION_TICKS_MIN: usize = 10;
const ELECTION_TICKS_MAX: usize = 20;
/// After the run, how long the nodes get to agree on one table.
const QUIESCE_MS: u64 = 10_000;
/// The events a run may take: a run takes tens of thousands, a message
/// storm (messages that beget more than one message each) without end.
const EVENTS_MAX: u64 = 1_000_000;

/// Who an answer is for: a client's request, on the connection it was
/// sent on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    pub client: usize,
    pub seq: u64,
    pub conn: u64,
}

#[derive(Debug)]
pub(crate) enum Event {
    /// A peer's raft message arrives.
    Deliver {
        to: usize,
        message: Box<Message>,
    },
    /// A peer's connection opens with its hello (to a starting node).
    Hello {
        to: usize,
        from: usize,
    },
    /// A peer's connection opens with its hello (to a running node; see
    /// `upgrade.rs`).
    Connect {
        to: usize,
        from: usize,
    },
    /// An old build is upgraded to this one (`upgrade.rs`).
    Upgrade(usize),
    /// The node's own timer: only the latest one counts.
    Wake {
        node: usize,
        generation: u64,
    },
    /// An asynchronous disk's fsync completes: what was queued is durable.
    Persist(usize),
    /// A client's request arrives at a node, on a connection.
    Request {
        node: usize,
        conn: u64,
        ask: Ask,
        request: ClientRequest,
    },
    /// A snapshot the node handed out for encoding or decoding comes back
    /// (the worker thread of a real shell), to the incarnation that asked.
    Snapshot {
        node: usize,
        incarnation: u64,
        event: Box<NodeEvent<Ask>>,
    },
    /// A client's connection close reaches its node.
    Close {
        node: usize,
        conn: u64,
    },
    /// An answer arrives at its client.
    Reply {
        ask: Ask,
        reply: Reply,
    },
    /// A client's timer; only its latest one counts.
    Client {
        client: usize,
        generation: u64,
    },
    Fault,
    Restart(usize),
    ClearPartition(u64),
    /// The operator's timer (`membership.rs`); only its latest one counts.
    Operator {
        generation: u64,
    },
    /// The operator stops a node it removed, if the node has not stopped
    /// by itself (it may never hear of its removal).
    Decommission(usize),
    Heal,
    Finish,
}

pub(crate) struct SimNode {
    pub node: Option<Node<Ask>>,
    pub disk: SimDisk,
    pub config: Config,
    pub clock: NodeClock,
    /// Bumped whenever its timer is set, so that earlier ones are ignored;
    /// and the true time the latest is set for.
    pub wake_generation: u64,
    pub wake_at: Option<u64>,
    pub persist_scheduled: bool,
    /// Client connections this incarnation accepted and has not seen close.
    pub conns: BTreeSet<u64>,
    /// Lost its disk and has not caught up since.
    pub recovering: bool,
    /// Bumped at every start: work a crashed incarnation asked for is
    /// dropped.
    pub incarnation: u64,
    /// The command level its hellos say: [`LEVEL`], or an old build's
    /// until its upgrade (`upgrade.rs`).
    pub build_level: u32,
    /// This incarnation's count of applied entries and its applied index
    /// when last asked: while the count stands and no change is applied,
    /// the index stands too, and the (costly) status need not be asked.
    pub applied_seen: Option<(u64, u64)>,
    /// Out of the cluster for good: it stopped as removed, or the operator
    /// removed it (`membership.rs`). It never starts again and counts no
    /// more.
    pub retired: bool,
    /// A new node the operator means to add: it starts once the cluster
    /// has taken it as a learner.
    pub awaiting_add: bool,
    /// On a blank disk it starts as `fencelockd --join` does, asking the
    /// leader for the members: a node the operator added, or one that
    /// stopped because the cluster's configuration did not hold it as a
    /// voter (`World::member_elsewhere`).
    pub join_when_blank: bool,
}

/// Whether a node on a blank disk starts now (`World::rejoin_as_member`).
pub(crate) enum Rejoin {
    Start,
    /// No leader to ask: in this many ms.
    Later(u64),
    /// It is no member.
    Never,
}

/// What an event is, without its payload (a raft message may carry the
/// whole log).
fn event_kind(event: &Event) -> String {
    match event {
        Event::Deliver { to, message } => {
            format!("{:?} from {} to {}", message.get_msg_type(), message.from, to + 1)
        }
        other => {
            let text = format!("{other:?}");
            text.chars().take(100).collect()
        }
    }
}

impl SimNode {
    /// Node `id` of a cluster of `voters`, its settings, clock and disk
    /// drawn from `rng` (the seed's main stream for the founding nodes,
    /// the operator's for the nodes it adds).
    pub(crate) fn draw(
        id: NodeId,
        voters: Vec<NodeId>,
        config: &SimConfig,
        swarm: &Swarm,
        build_level: u32,
        rng: &mut Rng,
    ) -> SimNode {
        let mut driver = Config::new(id, voters);
        driver.raft.election_ticks = ELECTION_TICKS_MIN;
        driver.raft.election_ticks_max = Some(ELECTION_TICKS_MAX);
        driver.raft.heartbeat_ticks = 2;
        driver.founding.founding_level = config.founding_level;
        driver.raft.snapshot_interval_entries = rng.pick(&[20, 100, 1_000]);
        driver.leases.lease_min_ms = 500;
        driver.leases.lease_max_ms = 60_000;
        driver.leases.expiry_scan_interval_ms = 10;
        // Lock-delay on one of the workload's plain keys and on the
        // shared ones (taken from no random draw, so that seeds keep
        // their runs otherwise).
        let delay_ms = LeaseMs::new(400).expect("a valid delay");
        driver.leases.lock_delays = vec![(b"k1".to_vec(), delay_ms), (shared::PREFIX.to_vec(), delay_ms)];
        // Half the nodes would found the cluster with a token floor
        // (fencelockd's is its wall clock in microseconds).
        driver.founding.token_floor = if rng.chance(500_000) { rng.range(1, 1 << 50) } else { 0 };
        let drift_bound = swarm.drift_ppm_max as i64;
        let drift_ppm = rng.range(0, 2 * drift_bound as u64 + 1) as i64 - drift_bound;
        let asynchronous = rng.chance(500_000);
        SimNode {
            node: None,
            disk: SimDisk::new(asynchronous),
            config: driver,
            clock: NodeClock::new(rng.range(0, 1_000_000), drift_ppm),
            wake_generation: 0,
            wake_at: None,
            persist_scheduled: false,
            incarnation: 0,
            build_level,
            conns: BTreeSet::new(),
            recovering: false,
            applied_seen: None,
            retired: false,
            awaiting_add: false,
            join_when_blank: false,
        }
    }

    /// Takes the node out of the cluster for good.
    pub(crate) fn retire(&mut self) {
        self.retired = true;
        self.recovering = false;
    }

    /// Whether the node may (re)start: it is neither out of the cluster
    /// nor still waiting to be added.
    pub(crate) fn may_start(&self) -> bool {
        !self.retired && !self.awaiting_add
    }
}

pub struct World {
    pub(crate) config: SimConfig,
    pub swarm: Swarm,
    pub(crate) rng: Rng,
    pub(crate) now_ms: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Event>,
    pub(crate) nodes: Vec<SimNode>,
    pub(crate) clients: Vec<Client>,
    pub(crate) network: Network,
    /// Client connections open on the client's side.
    pub(crate) client_conns: BTreeSet<u64>,
    pub(crate) next_conn: u64,
    /// Print each note of the trace as it is made (`SIM_TRACE=1`).
    print_notes: bool,
    /// Note every client request and answer, and every change a node
    /// applies (`SIM_TRACE=clients`).
    pub(crate) trace_clients: bool,
    pub(crate) healed: bool,
    /// A node has been elected leader: from then on a node starts with
    /// `existing`, as docs/operations.md says once `fencelock status` shows
    /// a leader (votes were cast: a node that lost its disk since must
    /// not found with blank peers and vote again).
    pub(crate) formed: bool,
    pub(crate) healed_at: Option<u64>,
    pub(crate) finished: bool,
    pub(crate) checker: Checker,
    /// The old builds and their upgrades, on a random stream of their own.
    pub(crate) builds: Builds,
    /// The operator that changes the membership, in a run that does, on a
    /// random stream of its own.
    pub(crate) operator: Option<Operator>,
    trace: crc32fast::Hasher,
    events: u64,
    pub(crate) grants: u64,
    pub(crate) faults: u64,
}

impl World {
    pub fn new(config: SimConfig) -> World {
        let mut rng = Rng::new(config.seed);
        let swarm = Swarm::draw(&mut rng);
        let builds = Builds::draw(config.seed, config.nodes, config.founding_level, config.fault_ms);
        let voters: Vec<NodeId> = (1..=config.nodes as u64).map(NodeId).collect();
        let nodes = (0..config.nodes)
            .map(|i| {
                let build_level = builds.old[i].map_or(LEVEL, |(level, _)| level);
                SimNode::draw(NodeId(i as u64 + 1), voters.clone(), &config, &swarm, build_level, &mut rng)
            })
            .collect();
        // The clients of shared keys come after the others, so that those
        // keep their numbers.
        // The session clients come last, for the same reason.
        let clients = (0..config.clients + config.shared_clients + config.session_clients)
            .map(|i| {
                let kind = if i >= config.clients + config.shared_clients {
                    Kind::Session
                } else if i >= config.clients {
                    Kind::Shared
                } else {
                    Kind::Plain
                };
                Client::new(i, config.nodes, kind)
            })
            .collect();
        let operator = config.membership.then(|| Operator::draw(config.seed, config.nodes, config.fault_ms));
        let slots = config.nodes + operator.as_ref().map_or(0, Operator::nodes_added_max);
        let checker = Checker::new(slots, swarm.drift_ppm_max);
        let network =
            Network::new(swarm.loss_ppm, swarm.duplicate_ppm, swarm.delay_min_ms, swarm.delay_jitter_ms);
        World {
            config,
            swarm,
            rng,
            now_ms: 0,
            seq: 0,
            queue: BTreeMap::new(),
            nodes,
            clients,
            network,
            client_conns: BTreeSet::new(),
            next_conn: 0,
            print_notes: std::env::var_os("SIM_TRACE").is_some(),
            trace_clients: std::env::var("SIM_TRACE").is_ok_and(|trace| trace == "clients"),
            healed: false,
            formed: false,
            healed_at: None,
            finished: false,
            checker,
            builds,
            operator,
            trace: crc32fast::Hasher::new(),
            events: 0,
            grants: 0,
            faults: 0,
        }
    }

    pub fn run(mut self) -> Report {
        let result = self.simulate();
        Report {
            seed: self.config.seed,
            nodes: self.config.nodes,
            sim_ms: self.now_ms,
            events: self.events,
            grants: self.grants,
            faults: self.faults,
            founding_level: self.config.founding_level,
            membership: self.operator.is_some(),
            members_added: self.operator.as_ref().map_or(0, |operator| operator.added),
            members_removed: self.operator.as_ref().map_or(0, |operator| operator.removed),
            acknowledgements: self.checker.durability.acknowledgements(),
            judged: self.checker.judged(),
            trace_digest: self.trace.clone().finalize(),
            swarm: format!("{:?}", self.swarm),
            result,
        }
    }

    fn simulate(&mut self) -> Result<(), Violation> {
        for node in 0..self.nodes.len() {
            self.start_node(node).map_err(|message| self.violation(message))?;
        }
        for client in 0..self.clients.len() {
            let at = self.rng.range(0, 500);
            self.wake_client(client, at);
        }
        for (node, old) in self.builds.old.clone().into_iter().enumerate() {
            if let Some((_, at_ms)) = old {
                self.schedule(at_ms, Event::Upgrade(node));
            }
        }
        if let Some(at_ms) = self.operator.as_ref().and_then(Operator::first_at_ms) {
            self.wake_operator(at_ms);
        }
        self.schedule(self.swarm.fault_interval_ms, Event::Fault);
        self.schedule(self.config.fault_ms, Event::Heal);
        let end_ms = self.config.fault_ms + self.config.heal_ms;
        self.schedule(end_ms, Event::Finish);

        while let Some(((at, _), event)) = self.queue.pop_first() {
            self.now_ms = at;
            self.events += 1;
            if self.events > EVENTS_MAX {
                let message = format!(
                    "more than {EVENTS_MAX} events by {} ms (a message storm? the last: {})",
                    self.now_ms,
                    event_kind(&event)
                );
                return Err(self.violation(message));
            }
            self.handle(event).map_err(|message| self.violation(message))?;
            if self.finished {
                break;
            }
        }
        self.finish().map_err(|message| self.violation(message))
    }

    fn violation(&self, message: String) -> Violation {
        Violation { at_ms: self.now_ms, message }
    }

    pub(crate) fn schedule(&mut self, delay_ms: u64, event: Event) {
        self.seq += 1;
        self.queue.insert((self.now_ms + delay_ms, self.seq), event);
    }

    pub(crate) fn note(&mut self, line: &str) {
        let line = format!("{} {line}\n", self.now_ms);
        self.trace.update(line.as_bytes());
        if self.print_notes {
            eprint!("{line}");
        }
    }

    fn handle(&mut self, event: Event) -> Result<(), String> {
        match event {
            Event::Deliver { to, message } => {
                if let Some(delay) = self.nodes[to].clock.paused(self.now_ms) {
                    self.schedule(delay, Event::Deliver { to, message });
                    return Ok(());
                }
                self.feed(to, NodeEvent::PeerMessage(*message))
            }
            Event::Hello { to, from } => self.hello(to, from),
            Event::Connect { to, from } => {
                self.connect(to, from);
                Ok(())
            }
            Event::Upgrade(node) => {
                self.upgrade(node);
                Ok(())
            }
            Event::Snapshot { node, incarnation, event } => {
                if incarnation != self.nodes[node].incarnation || self.nodes[node].node.is_none() {
                    return Ok(());
                }
                if let Some(delay) = self.nodes[node].clock.paused(self.now_ms) {
                    self.schedule(delay, Event::Snapshot { node, incarnation, event });
                    return Ok(());
                }
                self.feed(node, *event)
            }
            Event::Wake { node, generation } => {
                if generation != self.nodes[node].wake_generation || self.nodes[node].node.is_none() {
                    return Ok(());
                }
                self.nodes[node].wake_at = None;
                if let Some(delay) = self.nodes[node].clock.paused(self.now_ms) {
                    self.set_wake(node, self.now_ms + delay);
                    return Ok(());
                }
                self.turn(node)
            }
            Event::Persist(node) => {
                self.nodes[node].persist_scheduled = false;
                if self.nodes[node].node.is_none() {
                    return Ok(());
                }
                if let Some(delay) = self.nodes[node].clock.paused(self.now_ms) {
                    // A stopped process syncs nothing.
                    self.nodes[node].persist_scheduled = true;
                    self.schedule(delay, Event::Persist(node));
                    return Ok(());
                }
                let durable = self.nodes[node]
                    .disk
                    .sync_queued()
                    .map_err(|err| format!("simulated disk of {} failed: {err}", node + 1))?;
                self.feed(node, NodeEvent::Persisted(durable))
            }
            Event::Request { node, conn, ask, request } => {
                if !self.nodes[node].conns.contains(&conn) {
                    // The node went down since: the connection is gone.
                    return Ok(());
                }
                if let Some(delay) = self.nodes[node].clock.paused(self.now_ms) {
                    self.schedule(delay, Event::Request { node, conn, ask, request });
                    return Ok(());
                }
                let event = NodeEvent::Request { conn: ConnId(conn), reply_to: ask, request };
                self.feed(node, event)
            }
            Event::Close { node, conn } => {
                if let Some(delay) = self.nodes[node].clock.paused(self.now_ms) {
                    self.schedule(delay, Event::Close { node, conn });
                    return Ok(());
                }
                if self.nodes[node].conns.remove(&conn) {
                    self.feed(node, NodeEvent::ConnectionClosed(ConnId(conn)))?;
                }
                Ok(())
            }
            Event::Reply { ask, reply } if ask.client == self.operator_client() => {
                self.operator_reply(ask, reply)
            }
            Event::Reply { ask, reply } => self.client_reply(ask, reply),
            Event::Client { client, generation } => {
                if generation != self.clients[client].generation {
                    return Ok(());
                }
                self.client_wakes(client)
            }
            Event::Fault => {
                if !self.healed {
                    self.inject_fault()?;
                    self.schedule(self.swarm.fault_interval_ms, Event::Fault);
                }
                Ok(())
            }
            Event::Restart(node) => {
                if self.nodes[node].node.is_none() && self.nodes[node].may_start() {
                    self.start_node(node)?;
                }
                Ok(())
            }
            Event::ClearPartition(id) => {
                self.network.clear(id);
                Ok(())
            }
            Event::Operator { generation } => self.operator_wakes(generation),
            Event::Decommission(node) => {
                self.decommission(node);
                Ok(())
            }
            Event::Heal => self.heal(),
            Event::Finish => {
                self.finished = true;
                Ok(())
            }
        }
    }

    /// Hands `event` to the node and runs its turn.
    fn feed(&mut self, node: usize, event: NodeEvent<Ask>) -> Result<(), String> {
        let local_ms = self.nodes[node].clock.local_ms(self.now_ms);
        let Some(running) = self.nodes[node].node.as_mut() else { return Ok(()) };
        running.handle(local_ms, event);
        self.turn(node)
    }

    /// Starts (or restarts) `node` on its disk, as fencelockd does: a blank
    /// disk makes it wait for its peers' hellos.
    pub(crate) fn start_node(&mut self, node: usize) -> Result<(), String> {
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let recovered = self.nodes[node]
            .disk
            .recover()
            .map_err(|err| format!("the disk of {} does not read back: {err}", node + 1))?;
        if recovered.is_blank() && self.nodes[node].incarnation > 0 {
            match self.rejoin_as_member(node) {
                Rejoin::Start => {}
                Rejoin::Later(delay_ms) => {
                    self.schedule(delay_ms, Event::Restart(node));
                    return Ok(());
                }
                Rejoin::Never => return Ok(()),
            }
        }
        // The operator's procedure (docs/operations.md): `new` until the
        // cluster has had a leader, `existing` from then on, so that a node
        // whose disk is lost later can never found a second cluster with
        // other blank nodes and vote again in a term it voted in (and one
        // that lost it before any election can still found the cluster:
        // `existing` never founds).
        if self.formed {
            self.nodes[node].config.founding.initial_cluster_state = ClusterState::Existing;
        }
        let config = NodeConfig {
            driver: self.nodes[node].config.clone(),
            tick_ms: Some(TICK_MS),
            election_seed: Some(self.rng.next_u64()),
        };
        let opened = match Node::open(config, recovered, &logger) {
            Ok(opened) => opened,
            // Its disk says it was removed: it stops at once.
            Err(FatalError::Removed { index }) => return self.node_removed(node, index),
            Err(err) => return Err(format!("node {} does not reopen: {err}", node + 1)),
        };
        let disk = if self.nodes[node].disk.is_async() { "asynchronous" } else { "synchronous" };
        if let Some(replica) = opened.replica() {
            self.checker.opened(node, replica.table());
            self.note(&format!("start {} ({disk} disk)", node + 1));
        } else {
            self.note(&format!("{} starts blank ({disk} disk) and waits for its peers", node + 1));
        }
        let starting = opened.is_starting();
        self.nodes[node].node = Some(opened);
        self.connect_peers(node);
        self.nodes[node].incarnation += 1;
        self.nodes[node].applied_seen = None;
        self.nodes[node].conns.clear();
        if starting {
            self.schedule_hellos(node);
        }
        // It connects to its peers too: a node that waits for hellos hears
        // from it (a member added after that node started waiting; without
        // membership changes every node is in every wait's schedule
        // already, and seeds keep their runs).
        let changed = self.operator.as_ref().is_some_and(|operator| operator.asked);
        for other in (0..self.nodes.len()).filter(|_| changed) {
            if other != node && self.nodes[other].node.as_ref().is_some_and(Node::is_starting) {
                let delay = self.rng.range(10, 300);
                self.schedule(delay, Event::Hello { to: other, from: node });
            }
        }
        self.turn(node)
    }

    /// The peers of a starting node connect to it, each opening with its
    /// hello; they try again (backoff) while it still waits.
    /// Brings a snapshot's encoding or decoding back to `node` after a
    /// random while (up to 300 ms).
    fn schedule_snapshot(&mut self, node: usize, event: NodeEvent<Ask>) {
        let delay = self.rng.range(0, 300);
        let incarnation = self.nodes[node].incarnation;
        self.schedule(delay, Event::Snapshot { node, incarnation, event: Box::new(event) });
    }

    fn schedule_hellos(&mut self, node: usize) {
        for from in 0..self.nodes.len() {
            if from != node {
                let delay = self.rng.range(10, 300);
                self.schedule(delay, Event::Hello { to: node, from });
            }
        }
    }

    fn hello(&mut self, to: usize, from: usize) -> Result<(), String> {
        let Some(target) = self.nodes[to].node.as_ref() else { return Ok(()) };
        if !target.is_starting() {
            return Ok(());
        }
        let reachable = self.nodes[from].clock.paused(self.now_ms).is_none()
            && !self.network.is_cut(from, to)
            && !self.network.is_cut(to, from)
            && self.nodes[to].clock.paused(self.now_ms).is_none();
        if let (true, Some(peer)) = (reachable, self.nodes[from].node.as_ref()) {
            let report = self.hello_of(from, to, peer);
            self.feed(to, NodeEvent::PeerHello { from: NodeId(from as u64 + 1), report })?;
        }
        // Reconnect with backoff while the node still waits.
        if self.nodes[to].node.as_ref().is_some_and(Node::is_starting) {
            let delay = self.rng.range(50, 1_000);
            self.schedule(delay, Event::Hello { to, from });
        }
        Ok(())
    }

    /// One turn of `node`: its time, its due ticks, one Ready, and what
    /// comes out.
    pub(crate) fn turn(&mut self, node: usize) -> Result<(), String> {
        let local_ms = self.nodes[node].clock.local_ms(self.now_ms);
        let Some(running) = self.nodes[node].node.as_mut() else { return Ok(()) };
        let mut actions = Vec::new();
        match running.turn(local_ms, &mut |action| actions.push(action)) {
            Ok(()) => {}
            // Its removal is durable: the process ends (fencelockd exits).
            Err(FatalError::Removed { index }) => return self.node_removed(node, index),
            Err(FatalError::MemberElsewhere { by }) => return self.member_elsewhere(node, by),
            Err(err) => {
                return Err(format!(
                    "node {} failed in its turn (nothing but its disk or its removal may stop it): {err}",
                    node + 1
                ))
            }
        }
        // The writes first: if the disk dies mid-turn, nothing of this turn
        // leaves the node (a shell that stops at a failed write may have
        // sent the turn's early messages; holding them back is stricter).
        let mut done = None;
        let mut rest = Vec::with_capacity(actions.len());
        for action in actions {
            match action {
                Action::Write(write) => match self.nodes[node].disk.write(write) {
                    Ok(count) => done = Some(count),
                    Err(_) => {
                        self.crash(node);
                        return Ok(());
                    }
                },
                action => rest.push(action),
            }
        }
        let mut applied = Vec::new();
        let mut messages = Vec::new();
        let mut replies = Vec::new();
        for action in rest {
            match action {
                Action::Write(_) => unreachable!("writes were made above"),
                Action::Send(message) => messages.push(message),
                Action::Reply { to, reply, grants } => replies.push((to, reply, grants)),
                Action::Applied { index, event } => applied.push((index, event)),
                Action::Role(role) => {
                    if let RoleChange::Leader { term } = role {
                        self.checker.membership.elected(node, term)?;
                        self.formed = true;
                    }
                    if let RoleChange::LeaderReady { .. } = role {
                        self.checker.expiry.leader_ready(node, self.now_ms);
                    } else {
                        self.checker.expiry.leader_lost(node);
                    }
                    self.note(&format!("node {} {role:?}", node + 1))
                }
                Action::Started(start) => {
                    self.note(&format!("{} decided from its peers' hellos: {start:?}", node + 1));
                    self.checker.opened(node, &LockTable::new());
                }
                // The work is done at once; its result comes back a while
                // later, as from a worker thread, while the node goes on.
                Action::EncodeSnapshot(job) => {
                    let event = NodeEvent::SnapshotEncoded { index: job.index, data: job.encode() };
                    self.schedule_snapshot(node, event);
                }
                Action::DecodeSnapshot(message) => {
                    let table = LockTable::restore(message.get_snapshot().get_data());
                    self.schedule_snapshot(node, NodeEvent::SnapshotDecoded { message, table });
                }
            }
        }
        if self.trace_clients {
            for (index, event) in &applied {
                self.note(&format!("{} applied {index}: {event:?}", node + 1));
            }
        }
        let mut applied_seen = self.nodes[node].applied_seen;
        // Once the membership changed, nodes outside a node's configuration
        // (removed ones that do not know it yet, new ones it has not
        // applied the addition of) talk to it, and are refused.
        let outsiders = self.operator.as_ref().is_some_and(|operator| operator.asked);
        if let Some(replica) = self.nodes[node].node.as_ref().and_then(Node::replica) {
            // Only real peers talk here: the gate must let all they send
            // through, save stale acknowledgements and snapshots that the
            // network delivered late, and vote answers that came before a
            // write (raft-rs would ignore the first two, assert on the last).
            let stats = replica.stats();
            let refused = stats.refused;
            for reason in Refusal::ALL {
                let stale =
                    matches!(reason, Refusal::AckPastLastIndex | Refusal::BadSnapshot | Refusal::NotNow)
                        || outsiders && matches!(reason, Refusal::NotAPeer);
                if !stale && refused.get(reason) > 0 {
                    return Err(format!(
                        "node {}'s gate refused a real peer's message: {}",
                        node + 1,
                        reason.name()
                    ));
                }
            }
            // Whether it leads matters only to the changes it applied.
            let (is_leader, applied_index) = match applied_seen {
                Some((entries, index)) if applied.is_empty() && entries == stats.entries_applied => {
                    (false, index)
                }
                _ => {
                    let status = replica.status();
                    applied_seen = Some((stats.entries_applied, status.log.applied_index));
                    (status.role == Role::Leader, status.log.applied_index)
                }
            };
            self.checker.turn(
                node,
                local_ms,
                self.now_ms,
                is_leader,
                &applied,
                applied_index,
                replica.table(),
            )?;
        }
        self.nodes[node].applied_seen = applied_seen;
        if let Some(healed_ms) = self.healed_at {
            self.checker.expiry.check(self.now_ms, healed_ms)?;
        }
        for message in messages {
            self.send(node, message);
        }
        for (ask, reply, grants) in replies {
            self.answer(node, ask, reply, grants)?;
        }
        self.schedule_wake(node);
        self.schedule_persist(node);
        // Writes the disk made at once: the node hears so, and takes
        // another turn to let go of what waited for them.
        if let (Some(done), Some(running)) = (done, self.nodes[node].node.as_ref()) {
            if done > running.stats().writes - running.writes_in_flight() {
                return self.feed(node, NodeEvent::Persisted(done));
            }
        }
        Ok(())
    }

    /// Sets the node's timer for when it wants its next turn.
    fn schedule_wake(&mut self, node: usize) {
        let Some(running) = self.nodes[node].node.as_ref() else { return };
        let local_ms = self.nodes[node].clock.local_ms(self.now_ms);
        let wake_local = running.next_wake_ms(local_ms);
        let at = self.nodes[node].clock.true_ms_at(wake_local, self.now_ms);
        if self.nodes[node].wake_at.is_none_or(|scheduled| at < scheduled) {
            self.set_wake(node, at);
        }
    }

    pub(crate) fn set_wake(&mut self, node: usize, at: u64) {
        self.nodes[node].wake_generation += 1;
        self.nodes[node].wake_at = Some(at);
        let generation = self.nodes[node].wake_generation;
        self.schedule(at - self.now_ms, Event::Wake { node, generation });
    }

    /// Starts an asynchronous disk's fsync when writes wait for one.
    fn schedule_persist(&mut self, node: usize) {
        let waiting = self.nodes[node].node.as_ref().is_some_and(|running| running.writes_in_flight() > 0);
        if waiting && !self.nodes[node].persist_scheduled {
            self.nodes[node].persist_scheduled = true;
            let fsync_ms = self.rng.range(0, 4);
            self.schedule(fsync_ms, Event::Persist(node));
        }
    }

    fn send(&mut self, from: usize, message: Message) {
        let to = (message.to as usize).wrapping_sub(1);
        if to >= self.nodes.len() {
            return;
        }
        for delay in self.network.deliveries(&mut self.rng, from, to) {
            self.schedule(delay, Event::Deliver { to, message: Box::new(message.clone()) });
        }
    }

    /// An answer leaves `node` for its client. If the client closed the
    /// connection, the answer is lost; half the time the node's listener
    /// notices the closed socket as it writes and hands the grants back.
    fn answer(&mut self, node: usize, ask: Ask, reply: Reply, grants: Vec<GrantRef>) -> Result<(), String> {
        if let Err(RequestError::LevelNotReached { needed, level, .. }) = &reply {
            self.checker.levels.refused(node, *needed, *level)?;
        }
        if self.trace_clients {
            self.note(&format!(
                "{} answers client {} {} on {}: {reply:?}",
                node + 1,
                ask.client + 1,
                ask.seq,
                ask.conn
            ));
        }
        if self.client_conns.contains(&ask.conn) {
            let delay = self.network.delay(&mut self.rng);
            self.schedule(delay, Event::Reply { ask, reply });
            return Ok(());
        }
        if !grants.is_empty() && self.rng.chance(500_000) {
            self.note(&format!("answer to closed connection {} undelivered", ask.conn));
            self.feed(node, NodeEvent::Undelivered(grants))?;
        }
        Ok(())
    }

    /// Whether a node that lost its disk has not caught up yet: the
    /// simulation loses at most one at a time (two of three would lose
    /// what only they acknowledged).
    pub(crate) fn any_node_recovering(&mut self) -> bool {
        for node in &mut self.nodes {
            if let Some(status) = node.node.as_ref().and_then(Node::status) {
                node.recovering &= status.rejoining;
            }
        }
        self.nodes.iter().any(|node| node.recovering)
    }

    /// Stops the clients, lets the nodes agree, and checks what must hold at
    /// the end.
    fn finish(&mut self) -> Result<(), String> {
        let deadline = self.now_ms + QUIESCE_MS;
        let mut converged = None;
        while self.now_ms < deadline {
            if let Some(table) = self.agreed_table() {
                converged = Some(table);
                break;
            }
            let step_end = self.now_ms + 100;
            while let Some(((at, _), _)) = self.queue.first_key_value() {
                if *at > step_end {
                    break;
                }
                let Some(((at, _), event)) = self.queue.pop_first() else { break };
                self.now_ms = at;
                if matches!(event, Event::Client { .. } | Event::Reply { .. } | Event::Operator { .. }) {
                    continue;
                }
                self.events += 1;
                self.handle(event)?;
            }
            self.now_ms = step_end;
        }
        if converged.is_none() {
            for node in 0..self.nodes.len() {
                let status = self.nodes[node].node.as_ref().and_then(Node::status);
                self.note(&format!("at the end {}: {status:?}", node + 1));
            }
        }
        self.checker.liveness.finish(self.clients.len(), converged.is_some())?;
        if let Some(table) = converged {
            if self.operator.is_some() {
                self.members_agree()?;
            }
            let table = LockTable::restore(&table).map_err(|err| err.to_string())?;
            self.checker.durability.finish(&table)?;
            self.checker.levels.finish(self.config.founding_level, table.level())?;
        }
        Ok(())
    }

    /// The table every member holds, if they all hold the same at the same
    /// index.
    fn agreed_table(&self) -> Option<Vec<u8>> {
        let members = self.member_nodes()?;
        let mut seen = None;
        for node in members.iter().map(|member| &self.nodes[*member]) {
            let replica = node.node.as_ref()?.replica()?;
            let view = (replica.status().log.applied_index, convergence::digest(replica.table()));
            match seen {
                None => seen = Some(view),
                Some(first) if first != view => return None,
                Some(_) => {}
            }
        }
        self.nodes[*members.first()?].node.as_ref()?.replica().map(|replica| replica.table().snapshot())
    }
}
