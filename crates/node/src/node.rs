//! The whole node as a sans-IO state machine: what `fencelockd` runs in its
//! event loop, and what the simulator runs, the same code in both.
//!
//! Events go in with the node's monotonic time ([`Node::handle`]): a client
//! request on a connection, a connection closed, an answer that could not be
//! delivered, a peer's hello, a peer's raft message, the shell's report
//! that the node's first N writes are durable. [`Node::turn`] then runs the
//! raft ticks that are due and one `Ready`, and hands out [`Action`]s:
//! messages to peers, answers to clients, what applied (for checkers), and
//! writes for the shell to make, numbered in order. Messages that must wait
//! for a write (votes, append acknowledgements) are held inside the node
//! and leave when the shell reports that write durable.
//! [`Node::next_wake_ms`] says when it wants its next turn.
//!
//! What it owns: the [`Replica`] (raft-rs, the lock table, the leases, the
//! per-key request queues), the [`Registry`] of client requests by
//! connection (so that a closed connection's waiting requests are cancelled
//! and its grants released as ghosts), the start-up decision of a node whose
//! store is blank, from its peers' hellos ([`rejoin::decide`]), the raft tick
//! schedule, and, in a simulation, the seeded election timeouts. What it
//! does not own: sockets, threads, clocks and disks. It opens on what its
//! store held ([`Recovered`]) and never touches the store again: writes
//! leave as [`Action::Write`].
//!
//! ```
//! use fencelock_node::{Action, ClientRequest, Config, ConnId, Event, Node, NodeConfig, NodeId, Recovered};
//! use fencelock_types::{Key, LeaseMs, Owner, Value};
//!
//! let logger = slog::Logger::root(slog::Discard, slog::o!());
//! let config = NodeConfig { driver: Config::new(NodeId(1), vec![NodeId(1)]), tick_ms: Some(10), election_seed: None };
//! // A blank store; a real one gives what it recovered.
//! let mut node: Node<&str> = Node::open(config, Recovered::default(), &logger)?;
//! let acquire = ClientRequest::Acquire {
//!     key: Key::new(b"jobs/nightly".to_vec())?,
//!     lease_ms: LeaseMs::new(10_000)?,
//!     owner: Owner::new(b"worker-1".to_vec())?,
//!     value: Value::none(),
//!     wait_ms: 0,
//! };
//! let mut answer = None;
//! let mut asked = false;
//! // The node's own time, in milliseconds: a one-node cluster elects itself
//! // once its election timeout has passed.
//! for now_ms in (0..5_000).step_by(10) {
//!     if !asked && node.status().is_some_and(|status| status.leader_ready) {
//!         node.handle(now_ms, Event::Request { conn: ConnId(1), reply_to: "client 1", request: acquire.clone() });
//!         asked = true;
//!     }
//!     let mut durable = None;
//!     node.turn(now_ms, &mut |action| match action {
//!         // A shell writes and syncs here (or queues, and reports later).
//!         Action::Write(write) => durable = Some(write.n),
//!         Action::Reply { to, reply, .. } => answer = Some((to, reply)),
//!         _ => {}
//!     })?;
//!     if let Some(n) = durable {
//!         node.handle(now_ms, Event::Persisted(n));
//!     }
//!     if answer.is_some() {
//!         break;
//!     }
//! }
//! let (to, reply) = answer.expect("answered");
//! assert_eq!(to, "client 1");
//! assert!(reply.is_ok());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{BTreeMap, BTreeSet};

use fencelock_fsm::{LockTable, SnapshotError};
use fencelock_types::hello::HelloState;
use fencelock_types::{ClusterId, Command, FencingToken, Key, LeaseMs, Owner, Share, Value};
use raft::prelude::{Message, MessageType};
use slog::{info, warn, Logger};

use crate::log::{Recovered, Write};
use crate::registry::{Answered, ConnId, Registry};
use crate::rejoin::{self, PeerReport, Start};
use crate::replica::{Effects, GrantRef, NodeStatus, Replica, SnapshotJob, Stats};
use crate::reply::Asked;
use crate::types::{
    AppliedEvent, Config, FatalError, Member, MemberChange, NodeId, Query, Reply, RequestError, RoleChange,
};
use crate::watch::WatchQuery;

/// A node's settings.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub driver: Config,
    /// The length of a raft tick on the node's clock: the node ticks raft
    /// itself as its time passes. `None`: the shell sends [`Event::Tick`]
    /// on a timer of its own (a test whose lease clock stands still).
    pub tick_ms: Option<u64>,
    /// `Some(seed)`: election timeouts are drawn from this seed after every
    /// role or term change instead of raft-rs's unseeded generator, so that
    /// a simulation replays byte for byte.
    pub election_seed: Option<u64>,
}

/// What a client asks. Each kind is answered in its own type
/// ([`crate::reply`]): the answer to an acquire is a
/// [`Response::Acquired`](crate::Response::Acquired), and so on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientRequest {
    /// Commands to apply together, in one log entry, answered with their
    /// results as the state machine gave them (tests, tools).
    Propose(Vec<Command>),
    /// Release the lock `token` holds on `key` (`None`: whoever holds it,
    /// a forced release). With `user`, only that user's lock.
    Release { key: Key, token: Option<FencingToken>, user: Option<Owner> },
    /// Renew each lock (a key and its token) for `lease_ms`, in one entry.
    /// With `user`, only that user's locks.
    Renew { locks: Vec<(Key, FencingToken)>, lease_ms: LeaseMs, user: Option<Owner> },
    /// The lock `token` holds on `key` carries `value` from now on.
    Proclaim { key: Key, token: FencingToken, value: Value, user: Option<Owner> },
    /// Open a session for `owner` that lapses after `ttl_ms` without a
    /// keep-alive.
    OpenSession { owner: Owner, ttl_ms: LeaseMs },
    /// Keep a session open for its TTL more; with `user`, only that user's.
    KeepAlive { session: FencingToken, user: Option<Owner> },
    /// Close a session, releasing what it holds; with `user`, only that
    /// user's.
    CloseSession { session: FencingToken, user: Option<Owner> },
    /// Acquire `key`, waiting up to `wait_ms` for it when another owner
    /// holds it (0: do not wait).
    Acquire { key: Key, lease_ms: LeaseMs, owner: Owner, value: Value, wait_ms: u64 },
    /// Acquire `key` as a reader or the writer of a read-write lock, or a
    /// permit of a semaphore, waiting up to `wait_ms` (FIFO per key) when
    /// it cannot be had now.
    AcquireShared { key: Key, lease_ms: LeaseMs, owner: Owner, share: Share, wait_ms: u64 },
    /// An acquire of any kind, as its command: a Grant or a GrantShared
    /// (under a session, say), waiting up to `wait_ms` as the others do.
    AcquireWith { grant: Command, wait_ms: u64 },
    /// A linearizable read, through ReadIndex on the leader.
    Read(Query),
    /// A read of this node's applied table, at once: it may be stale.
    ReadLocal(Query),
    /// A membership change, on the leader.
    ChangeMembers(MemberChange),
    /// The changes of holders under a prefix after a log index, on any
    /// node ([`crate::watch`]).
    Watch(WatchQuery),
    /// Hand leadership to this voter, on the leader.
    TransferLeader(NodeId),
}

impl ClientRequest {
    /// The kind of answer it gets.
    pub fn asked(&self) -> Asked {
        match self {
            ClientRequest::Propose(_) => Asked::Raw,
            ClientRequest::Acquire { .. }
            | ClientRequest::AcquireShared { .. }
            | ClientRequest::AcquireWith { .. } => Asked::Acquire,
            ClientRequest::Release { .. } => Asked::Release,
            ClientRequest::Renew { locks, .. } => Asked::Renew(locks.len()),
            ClientRequest::Proclaim { .. } => Asked::Proclaim,
            ClientRequest::OpenSession { .. } => Asked::OpenSession,
            ClientRequest::KeepAlive { .. } => Asked::KeepAlive,
            ClientRequest::CloseSession { .. } => Asked::CloseSession,
            ClientRequest::Read(_)
            | ClientRequest::ReadLocal(_)
            | ClientRequest::ChangeMembers(_)
            | ClientRequest::Watch(_)
            | ClientRequest::TransferLeader(_) => Asked::Answered,
        }
    }
}

/// An input to the node. `T` is where an answer goes (a connection's
/// response sink, a channel, a simulated client).
#[derive(Debug)]
pub enum Event<T> {
    Request {
        conn: ConnId,
        reply_to: T,
        request: ClientRequest,
    },
    /// The connection closed: requests on it not yet proposed are
    /// forgotten, and what those in flight are granted is released.
    ConnectionClosed(ConnId),
    /// An answer's connection was gone when the shell tried to deliver it:
    /// the grants it carried are released, unless granted again since.
    Undelivered(Vec<GrantRef>),
    /// A peer's hello: what it says of itself and of this node.
    PeerHello {
        from: NodeId,
        report: PeerReport,
    },
    PeerMessage(Message),
    /// The node's first `n` writes since open ([`Action::Write`]) are
    /// durable.
    Persisted(u64),
    /// Hand leadership to another node, if this one leads.
    TransferLeader(NodeId),
    /// The snapshot asked for by [`Action::EncodeSnapshot`] at `index`,
    /// encoded.
    SnapshotEncoded {
        index: u64,
        data: Vec<u8>,
    },
    /// A snapshot message handed out by [`Action::DecodeSnapshot`], with its
    /// table decoded (`LockTable::restore` of its data).
    SnapshotDecoded {
        message: Message,
        table: Result<LockTable, SnapshotError>,
    },
    /// One raft tick, for a node without a `tick_ms` of its own.
    Tick,
}

/// What the node asks its shell to do, in order.
#[derive(Debug)]
pub enum Action<T> {
    /// A raft message for a peer. Dropping it is safe: raft sends again.
    Send(Message),
    /// An answer. If it cannot be delivered, hand `grants` back as
    /// [`Event::Undelivered`].
    Reply {
        to: T,
        reply: Reply,
        grants: Vec<GrantRef>,
    },
    /// A change of the lock table, in log order, with the index of the
    /// entry that made it.
    Applied {
        index: u64,
        event: AppliedEvent,
    },
    Role(RoleChange),
    /// A node whose store was blank decided how it starts.
    Started(Start),
    /// Write this to the store, after every write before it, and report it
    /// with [`Event::Persisted`] once durable. Sends handed out before it
    /// may leave before it is made.
    Write(Write),
    /// Encode this snapshot of the table ([`SnapshotJob::encode`]), on
    /// another thread if the shell has one (a large table takes a while),
    /// and hand the bytes back as [`Event::SnapshotEncoded`]. Until then
    /// the node takes no other snapshot and keeps its log.
    EncodeSnapshot(SnapshotJob),
    /// Decode this snapshot message's table (`LockTable::restore` of its
    /// snapshot's data), on another thread if the shell has one, and hand
    /// it back as [`Event::SnapshotDecoded`]. Until then the node drops
    /// other snapshots and appends (the leader sends them again).
    DecodeSnapshot(Message),
}

/// How often a starting node logs whom it still waits for.
const STARTING_REPORT_EVERY_MS: u64 = 5_000;
/// The tick length assumed for a node ticked by its shell, to tell how
/// recently it heard from a peer.
const DEFAULT_TICK_MS: u64 = 50;
/// How soon a starting node looks at its hellos again.
const STARTING_POLL_MS: u64 = 20;

enum Phase {
    /// The store was blank: waiting for the peers' hellos ([`rejoin`]).
    Starting {
        next_report_ms: u64,
    },
    Running(Box<Replica>),
}

/// The node. See the module docs.
pub struct Node<T> {
    config: NodeConfig,
    phase: Phase,
    /// Where each answer goes, and what kind of request it answers.
    registry: Registry<(T, Asked)>,
    /// Each peer's last hello: from the voters of its configuration, and,
    /// while the store is blank, from any node whose hello named a
    /// cluster (a member added since `--peers` was written, or a running
    /// cluster that added this node).
    heard: BTreeMap<u64, PeerReport>,
    /// When a blank node that would found alone may found (its first turn
    /// plus `founding_grace_ms`), set at that turn.
    found_at_ms: Option<u64>,
    /// The command level each peer's last hello said.
    levels: BTreeMap<u64, u32>,
    /// Actions decided while handling events, handed out at the next turn.
    pending: Vec<Action<T>>,
    next_tick_ms: Option<u64>,
    rng: Option<SplitMix64>,
    /// A snapshot message is out for decoding ([`Action::DecodeSnapshot`]).
    decoding: bool,
    /// When each peer's last raft message came, on the node's clock.
    last_heard: BTreeMap<u64, u64>,
    logger: Logger,
}

impl<T> std::fmt::Debug for Node<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("status", &self.status()).finish_non_exhaustive()
    }
}

impl<T> Node<T> {
    /// Opens the node on what its store held. A blank store in a cluster of
    /// more than one node waits for its peers' hellos before it takes any
    /// part.
    pub fn open(config: NodeConfig, recovered: Recovered, logger: &Logger) -> Result<Node<T>, FatalError> {
        config.driver.validate()?;
        if config.tick_ms == Some(0) {
            return Err(crate::types::ConfigError("tick_ms must be positive".into()).into());
        }
        let logger = logger.new(slog::o!("node_id" => config.driver.id.0));
        let blank = recovered.is_blank();
        let mut node = Node {
            rng: config.election_seed.map(SplitMix64),
            config,
            phase: Phase::Starting { next_report_ms: STARTING_REPORT_EVERY_MS },
            registry: Registry::default(),
            heard: BTreeMap::new(),
            found_at_ms: None,
            levels: BTreeMap::new(),
            pending: Vec::new(),
            next_tick_ms: None,
            decoding: false,
            last_heard: BTreeMap::new(),
            logger,
        };
        if blank && node.config.driver.founding.joining {
            info!(node.logger, "empty store: joining the cluster as a learner";
                "members" => ?node.config.driver.voters.iter().map(|voter| voter.0).collect::<Vec<_>>());
            node.start(recovered, None)?;
        } else if blank && node.config.driver.voters.len() > 1 {
            info!(node.logger, "empty store: asking the peers whether this node was a member before");
        } else if blank
            && (node.config.driver.founding.founding_grace_ms > 0
                || node.config.driver.founding.initial_cluster_state == rejoin::ClusterState::Existing)
        {
            // Alone in its configuration: founding needs nobody's answer,
            // but a running cluster that added this node would say so first.
            info!(node.logger, "empty store, and no other member named: listening for a running cluster before \
                                founding one";
                "grace_ms" => node.config.driver.founding.founding_grace_ms,
                "initial_cluster_state" => ?node.config.driver.founding.initial_cluster_state);
        } else {
            node.start(recovered, None)?;
        }
        Ok(node)
    }

    fn start(&mut self, recovered: Recovered, rejoin: Option<rejoin::Floor>) -> Result<(), FatalError> {
        let mut replica =
            Replica::open_rejoining(self.config.driver.clone(), recovered, rejoin, &self.logger)?;
        for (id, level) in &self.levels {
            replica.peer_level(NodeId(*id), *level);
        }
        self.phase = Phase::Running(Box::new(replica));
        self.next_tick_ms = None;
        self.draw_election_timeout();
        Ok(())
    }

    /// Takes one input. Nothing leaves before the next [`Node::turn`].
    pub fn handle(&mut self, now_ms: u64, event: Event<T>) {
        match event {
            Event::Request { conn, reply_to, request } => self.request(now_ms, conn, reply_to, request),
            Event::ConnectionClosed(conn) => {
                for id in self.registry.close(conn) {
                    if let Phase::Running(replica) = &mut self.phase {
                        if replica.cancel(id) {
                            self.registry.forget(id);
                        }
                    }
                }
            }
            Event::Undelivered(grants) => {
                if let Phase::Running(replica) = &mut self.phase {
                    for grant in grants {
                        replica.release_ghost(grant);
                    }
                }
            }
            Event::PeerHello { from, report } => {
                let id = self.config.driver.id;
                if from == id {
                    return;
                }
                // The leader raises the cluster's command level once every
                // member has said it applies it.
                self.levels.insert(from.0, report.level);
                if let Phase::Running(replica) = &mut self.phase {
                    replica.peer_level(from, report.level);
                }
                let starting = matches!(self.phase, Phase::Starting { .. });
                if self.config.driver.voters.contains(&from) || (report.named && starting) {
                    self.heard.insert(from.0, report);
                }
            }
            Event::PeerMessage(message) => {
                // A starting node drops them: raft sends again.
                let Phase::Running(replica) = &mut self.phase else { return };
                self.last_heard.insert(message.from, now_ms);
                match message.get_msg_type() {
                    // While a snapshot is decoded, the appends that would
                    // find the log behind it (and have the leader send it
                    // again) are dropped, and so are other snapshots;
                    // heartbeats still keep this node a follower.
                    MessageType::MsgSnapshot | MessageType::MsgAppend if self.decoding => {}
                    MessageType::MsgSnapshot => {
                        self.decoding = true;
                        self.pending.push(Action::DecodeSnapshot(message));
                    }
                    _ => replica.step(message),
                }
            }
            Event::SnapshotDecoded { message, table } => {
                self.decoding = false;
                if let Phase::Running(replica) = &mut self.phase {
                    replica.set_now(now_ms);
                    replica.step_decoded(message, table);
                }
            }
            Event::SnapshotEncoded { index, data } => {
                if let Phase::Running(replica) = &mut self.phase {
                    replica.on_snapshot_encoded(index, data);
                }
            }
            Event::Persisted(writes) => {
                if let Phase::Running(replica) = &mut self.phase {
                    replica.on_persisted(writes);
                }
            }
            Event::TransferLeader(to) => {
                if let Phase::Running(replica) = &mut self.phase {
                    replica.transfer_leader(to);
                }
            }
            Event::Tick => {
                if let Phase::Running(replica) = &mut self.phase {
                    replica.tick();
                }
            }
        }
    }

    fn request(&mut self, now_ms: u64, conn: ConnId, reply_to: T, request: ClientRequest) {
        let Phase::Running(replica) = &mut self.phase else {
            // As a follower that knows no leader: the client tries another node.
            let reply = Err(RequestError::NotLeader { leader_hint: None });
            self.pending.push(Action::Reply { to: reply_to, reply, grants: Vec::new() });
            return;
        };
        if let ClientRequest::ReadLocal(query) = request {
            let reply = Ok(replica.read_local(query));
            self.pending.push(Action::Reply { to: reply_to, reply, grants: Vec::new() });
            return;
        }
        let id = self.registry.register(conn, (reply_to, request.asked()));
        replica.set_now(now_ms);
        match request {
            ClientRequest::Propose(commands) => replica.propose(id, commands),
            ClientRequest::Release { key, token, user } => {
                replica.propose(id, vec![Command::Release { key, token, user }])
            }
            ClientRequest::Renew { locks, lease_ms, user } => {
                let renew = |(key, token)| Command::Renew { key, token, lease_ms, user: user.clone() };
                replica.propose(id, locks.into_iter().map(renew).collect())
            }
            ClientRequest::Proclaim { key, token, value, user } => {
                replica.propose(id, vec![Command::Proclaim { key, token, value, user }])
            }
            ClientRequest::OpenSession { owner, ttl_ms } => {
                replica.propose(id, vec![Command::OpenSession { owner, ttl_ms }])
            }
            ClientRequest::KeepAlive { session, user } => {
                replica.propose(id, vec![Command::RenewSession { session, user }])
            }
            ClientRequest::CloseSession { session, user } => {
                replica.propose(id, vec![Command::CloseSession { session, user }])
            }
            ClientRequest::Acquire { key, lease_ms, owner, value, wait_ms } => {
                replica.acquire(id, key, lease_ms, owner, value, wait_ms)
            }
            ClientRequest::Watch(query) => replica.watch(id, conn, query),
            ClientRequest::AcquireShared { key, lease_ms, owner, share, wait_ms } => {
                replica.acquire_shared(id, key, lease_ms, owner, share, wait_ms)
            }
            ClientRequest::AcquireWith { grant, wait_ms } => replica.acquire_with(id, grant, wait_ms),
            ClientRequest::Read(query) => replica.read(id, query),
            ClientRequest::ChangeMembers(change) => replica.change_members(id, change),
            ClientRequest::TransferLeader(to) => replica.transfer(id, to),
            ClientRequest::ReadLocal(_) => unreachable!("answered above"),
        }
    }

    /// Runs the ticks that are due and one `Ready`, and hands what should
    /// happen to `out`, in order. What may leave before the turn's write (a
    /// leader's appends, answers to entries committed before) is handed out
    /// before it. An error is fatal: the node must be dropped.
    pub fn turn(&mut self, now_ms: u64, out: &mut dyn FnMut(Action<T>)) -> Result<(), FatalError> {
        for action in self.pending.drain(..) {
            out(action);
        }
        if let Phase::Starting { .. } = self.phase {
            if let Some(by) = self.member_elsewhere() {
                return Err(FatalError::MemberElsewhere { by });
            }
            match self.decide_start(now_ms) {
                Start::Wait => return Ok(()),
                start => {
                    let floor = match start {
                        Start::Rejoin(floor) => Some(floor),
                        _ => None,
                    };
                    // Only a blank store waits for hellos. It starts in the
                    // configuration it decided from.
                    self.config.driver.voters = self.start_voters().into_iter().map(NodeId).collect();
                    self.start(Recovered::default(), floor)?;
                    out(Action::Started(start));
                }
            }
        }
        let Phase::Running(replica) = &mut self.phase else { unreachable!("started above") };
        if let Some(tick_ms) = self.config.tick_ms {
            let next_tick_ms = *self.next_tick_ms.get_or_insert(now_ms.saturating_add(tick_ms));
            if now_ms >= next_tick_ms {
                replica.tick();
                let mut next = next_tick_ms.saturating_add(tick_ms);
                if next <= now_ms {
                    // A node held up for several ticks does not catch up in
                    // a burst: the next tick is a whole interval away.
                    next = now_ms.saturating_add(tick_ms);
                }
                self.next_tick_ms = Some(next);
            }
        }
        replica.set_now(now_ms);
        let mut ghosts = Vec::new();
        replica.run_ready()?;
        let effects = replica.take_effects();
        let roles_changed = dispatch(&mut self.registry, effects, out, &mut ghosts);
        for grant in ghosts {
            replica.release_ghost(grant);
        }
        if roles_changed {
            // raft-rs reset its election timeout with a draw of its own.
            self.draw_election_timeout();
        }
        Ok(())
    }

    /// The voters a blank node decides its start among: the newest
    /// configuration a hello named, when it names this node a voter (its
    /// `--peers` may list members removed since, and miss ones added);
    /// else its own configuration.
    fn start_voters(&self) -> BTreeSet<u64> {
        let id = self.config.driver.id.0;
        match rejoin::newest_configuration(&self.heard) {
            Some((_, voters)) if voters.contains(&id) => voters.iter().copied().collect(),
            _ => self.config.driver.voters.iter().map(|voter| voter.0).collect(),
        }
    }

    /// While the store is blank: the node whose hello shows a running
    /// cluster that does not count this node among its voters (it added
    /// it as a learner, or removed it), or, from a build that does not say
    /// its configuration, a node outside this node's `--peers` naming a
    /// cluster. Founding or bootstrapping would then part from that
    /// cluster: the node must `--join` it.
    fn member_elsewhere(&self) -> Option<u64> {
        let id = self.config.driver.id;
        match rejoin::newest_configuration(&self.heard) {
            Some((by, voters)) => (!voters.contains(&id.0)).then_some(by),
            None => self
                .heard
                .iter()
                .find(|(from, report)| report.named && !self.config.driver.voters.contains(&NodeId(**from)))
                .map(|(from, _)| *from),
        }
    }

    /// The start of a node whose store was blank, from its peers' hellos.
    fn decide_start(&mut self, now_ms: u64) -> Start {
        let id = self.config.driver.id;
        let peers: BTreeSet<u64> = self.start_voters().into_iter().filter(|voter| *voter != id.0).collect();
        let mut start =
            rejoin::decide(&peers, &self.heard, self.config.driver.founding.initial_cluster_state);
        if start == Start::Fresh && peers.is_empty() {
            // Alone: founding, once nobody has contacted it for the grace.
            let found_at_ms = *self
                .found_at_ms
                .get_or_insert(now_ms.saturating_add(self.config.driver.founding.founding_grace_ms));
            if now_ms < found_at_ms {
                start = Start::Wait;
            }
        }
        match start {
            Start::Wait => {
                if let Phase::Starting { next_report_ms, .. } = &mut self.phase {
                    if now_ms >= *next_report_ms {
                        *next_report_ms = now_ms.saturating_add(STARTING_REPORT_EVERY_MS);
                        let waiting: Vec<u64> =
                            peers.iter().filter(|peer| !self.heard.contains_key(peer)).copied().collect();
                        if self.config.driver.founding.initial_cluster_state == rejoin::ClusterState::Existing
                            && waiting.is_empty()
                        {
                            warn!(self.logger, "empty store, --initial-cluster-state existing, and no peer names a \
                                                cluster: waiting, never founding one. To join a running cluster, \
                                                start this node with --join and its client endpoints; to found \
                                                a new one, with --initial-cluster-state new";
                                "answered" => ?self.heard.keys().collect::<Vec<_>>());
                        } else {
                            info!(self.logger, "empty store: waiting for peers to say whether this node was a member before";
                                "answered" => ?self.heard.keys().collect::<Vec<_>>(), "waiting_for" => ?waiting);
                        }
                    }
                }
            }
            Start::Fresh => {
                info!(self.logger, "empty store, and no peer knows this node: a new member, starting")
            }
            Start::Rejoin(floor) => warn!(self.logger,
                "empty store, but peers know this node: its data was lost. Rejoining without a vote until it has \
                 caught up";
                "floor_term" => floor.term, "floor_last_index" => floor.last_index,
                "known_by" => ?self.heard.iter().filter(|(_, heard)| heard.knows_you).map(|(id, _)| *id).collect::<Vec<_>>()),
        }
        start
    }

    /// The node's time at which it wants its next turn, given its time now.
    pub fn next_wake_ms(&self, now_ms: u64) -> u64 {
        if !self.pending.is_empty() {
            return now_ms;
        }
        match &self.phase {
            Phase::Starting { .. } => now_ms.saturating_add(STARTING_POLL_MS),
            Phase::Running(replica) if replica.has_ready() => now_ms,
            Phase::Running(_) if self.config.tick_ms.is_none() => u64::MAX,
            Phase::Running(_) => self.next_tick_ms.unwrap_or(now_ms),
        }
    }

    /// What this node's hello to `peer` says: whether it has had raft
    /// messages from it, and its own term, last index and configuration
    /// (nothing while it is starting).
    pub fn hello_for(&self, peer: NodeId) -> PeerReport {
        self.hello_state().report_for(peer.0)
    }

    /// What every hello of this node says ([`HelloState::report_for`]
    /// makes one peer's): the one builder of hellos, fencelockd's and the
    /// simulator's.
    pub fn hello_state(&self) -> HelloState {
        match &self.phase {
            Phase::Starting { .. } => HelloState::default(),
            Phase::Running(replica) => replica.hello_state(),
        }
    }

    pub fn id(&self) -> NodeId {
        self.config.driver.id
    }

    /// The cluster's id, once this node has applied it: what its hellos
    /// name, and peers naming another cluster are refused.
    pub fn cluster_id(&self) -> Option<ClusterId> {
        match &self.phase {
            Phase::Starting { .. } => None,
            Phase::Running(replica) => replica.cluster_id(),
        }
    }

    /// Whether the node ticks raft from its own time (a `tick_ms`).
    pub fn ticks_itself(&self) -> bool {
        self.config.tick_ms.is_some()
    }

    /// Whether the node still waits for its peers to say how it starts.
    pub fn is_starting(&self) -> bool {
        matches!(self.phase, Phase::Starting { .. })
    }

    /// The replica, once the node has started.
    pub fn replica(&self) -> Option<&Replica> {
        match &self.phase {
            Phase::Running(replica) => Some(replica),
            Phase::Starting { .. } => None,
        }
    }

    /// `None` while the node is starting.
    pub fn status(&self) -> Option<NodeStatus> {
        self.replica().map(Replica::status)
    }

    /// The status at `now_ms`, with the members heard from within an
    /// election timeout; while the node is starting, the peers it waits for.
    /// The members of the configuration this node applied (none while it
    /// starts), and a number that moves whenever they change.
    pub fn members(&self) -> Option<(u64, Vec<Member>)> {
        self.replica().map(|replica| (replica.conf_version(), replica.members()))
    }

    /// The number that moves whenever [`Node::members`] change.
    pub fn conf_version(&self) -> Option<u64> {
        self.replica().map(Replica::conf_version)
    }

    pub fn report(&self, now_ms: u64) -> NodeStatus {
        let id = self.config.driver.id;
        let Phase::Running(replica) = &self.phase else {
            let voters: Vec<u64> = self.start_voters().into_iter().collect();
            let waiting_for =
                voters.iter().filter(|peer| **peer != id.0 && !self.heard.contains_key(peer)).copied();
            let blank = NodeStatus::blank(id);
            let conf = crate::replica::ConfView { waiting_for: waiting_for.collect(), voters, ..blank.conf };
            return NodeStatus { conf, starting: true, ..blank };
        };
        let mut status = replica.status();
        let tick_ms = self.config.tick_ms.unwrap_or(DEFAULT_TICK_MS);
        let window_ms = tick_ms.saturating_mul(self.config.driver.raft.election_ticks as u64);
        status.conf.reachable = std::iter::once(id.0)
            .chain(
                self.last_heard
                    .iter()
                    .filter(|(_, heard_ms)| now_ms.saturating_sub(**heard_ms) <= window_ms)
                    .map(|(peer, _)| *peer),
            )
            .collect::<BTreeSet<u64>>()
            .into_iter()
            .collect();
        status
    }

    pub fn stats(&self) -> Stats {
        self.replica().map(Replica::stats).unwrap_or_default()
    }

    /// Writes handed out and not yet reported durable.
    pub fn writes_in_flight(&self) -> u64 {
        self.replica().map_or(0, Replica::writes_in_flight)
    }

    /// Requests taken and not yet answered.
    pub fn open_requests(&self) -> usize {
        self.registry.len()
    }

    /// On a graceful stop: hands leadership, if this node has it, to the
    /// most caught-up voter it reaches ([`Replica::hand_off`]), which it
    /// returns. The shell then waits, a bounded while, to see another lead.
    pub fn hand_off(&mut self) -> Option<NodeId> {
        match &mut self.phase {
            Phase::Running(replica) => replica.hand_off(),
            Phase::Starting { .. } => None,
        }
    }

    /// Every request waiting for an answer, to be told the node stopped;
    /// the node forgets them.
    pub fn stop(&mut self) -> Vec<T> {
        self.registry.drain().map(|(to, _)| to).collect()
    }

    fn draw_election_timeout(&mut self) {
        let (Some(rng), Phase::Running(replica)) = (self.rng.as_mut(), &mut self.phase) else { return };
        let min = self.config.driver.raft.election_ticks as u64;
        let max = self.config.driver.raft.election_ticks_max.map_or(2 * min, |max| max as u64);
        let ticks = min + rng.next() % (max - min).max(1);
        replica.pin_election_timeout(ticks as usize);
    }
}

/// Hands a turn's effects out. Answers to orphans (their connection closed)
/// are not sent: what they were granted is pushed to `ghosts`. Returns
/// whether the role changed.
fn dispatch<T>(
    registry: &mut Registry<(T, Asked)>,
    effects: Effects,
    out: &mut dyn FnMut(Action<T>),
    ghosts: &mut Vec<GrantRef>,
) -> bool {
    for message in effects.messages {
        out(Action::Send(message));
    }
    let mut grants: BTreeMap<crate::types::RequestId, Vec<GrantRef>> = BTreeMap::new();
    for (id, grant) in effects.grants {
        grants.entry(id).or_default().push(grant);
    }
    for (id, reply) in effects.replies {
        let granted = grants.remove(&id).unwrap_or_default();
        match registry.answer(id) {
            Some(Answered::To((to, asked))) => {
                out(Action::Reply { to, reply: asked.answer(reply), grants: granted })
            }
            // Its client is gone: a lock it was granted would be held by
            // nobody until its lease ran out.
            Some(Answered::Orphan) => ghosts.extend(granted),
            // The replica answers each request it took once, and a request
            // the registry forgot was cancelled, never to be answered.
            None => panic!("an answer to request {} that the node never took or already answered", id.0),
        }
    }
    for (index, event) in effects.applied {
        out(Action::Applied { index, event });
    }
    let roles_changed = !effects.roles.is_empty();
    for role in effects.roles {
        out(Action::Role(role));
    }
    if let Some(job) = effects.encode {
        out(Action::EncodeSnapshot(job));
    }
    // Last: a shell that makes a write on its own thread (a follower's)
    // has sent and answered everything else first.
    for write in effects.writes {
        out(Action::Write(write));
    }
    roles_changed
}

/// A small seeded generator for election timeouts (SplitMix64).
#[derive(Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
#[path = "node_tests.rs"]
mod tests;
