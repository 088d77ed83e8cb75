//! The sans-IO driver core: one raft-rs `RawNode`, the lock table it applies
//! to, and the bookkeeping that routes results back to requests.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use fencelock_fsm::LockTable;
use fencelock_types::{
    decode_batch, encode_batch, pb, ApplyResult, ClusterId, Command, FencingToken, Key, LeaseMs, Owner,
    Value, LEVEL,
};
use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, EntryType, Message, MessageType, Snapshot};
use raft::{RawNode, SnapshotStatus, StateRole};
use slog::{debug, info, warn, Logger};

#[path = "consensus.rs"]
mod consensus;
#[path = "membership.rs"]
mod membership;
#[path = "service.rs"]
mod service;

use consensus::{Consensus, Disk, Persistence, Snapshots, Unpersisted};
pub use membership::{PROMOTE_LAG_MAX, TRANSFER_WAIT_MS};
use service::{admits, repeats_a_grant, LockService};

use crate::gate::{self, RefusalLog, Refusals};
use crate::log::{LogCache, Recovered, Write, WriteBatch};
use crate::queue::Pending;
use crate::registry::ConnId;
use crate::rejoin::{self, Floor, PinVote, RaftPosition};
use crate::types::{
    AppliedEvent, Config, FatalError, NodeId, Query, Reply, RequestError, RequestId, Response, RoleChange,
};
use crate::watch::{TooManyWatches, WatchQuery, Watches};

/// What the driver asks its shell to do, drained with [`Replica::take_effects`].
#[derive(Debug, Default)]
pub struct Effects {
    /// Raft messages to send to peers. Dropping some is safe: raft retries.
    pub messages: Vec<Message>,
    /// Answers to requests, by id.
    pub replies: Vec<(RequestId, Reply)>,
    /// Lock-table changes, in apply order, each with the index of the log
    /// entry that made it (a snapshot's index for `Restored`).
    pub applied: Vec<(u64, AppliedEvent)>,
    /// Leadership changes, in order.
    pub roles: Vec<RoleChange>,
    /// The new locks that answered requests were granted (not re-grants),
    /// with where: what a ghost release of a grant nobody received names.
    pub grants: Vec<(RequestId, GrantRef)>,
    /// Writes to make, in order; report them with [`Replica::on_persisted`].
    /// What depends on one being durable (votes, append acknowledgements,
    /// the answers of entries it holds) stays in the replica until then.
    pub writes: Vec<Write>,
    /// A snapshot to encode, off the thread that runs the replica if the
    /// shell likes: hand the bytes to [`Replica::on_snapshot_encoded`].
    pub encode: Option<SnapshotJob>,
}

/// What consensus hands out, as [`Effects`] says.
#[derive(Debug, Default)]
struct Outgoing {
    messages: Vec<Message>,
    roles: Vec<RoleChange>,
    writes: Vec<Write>,
    encode: Option<SnapshotJob>,
}

impl Outgoing {
    fn is_empty(&self) -> bool {
        self.messages.is_empty() && self.roles.is_empty() && self.writes.is_empty() && self.encode.is_none()
    }
}

/// The lock table as of log index `index`, to encode into a snapshot
/// ([`LockTable::snapshot`]). The table is a clone that shares its nodes
/// with the replica's: taking it cost nothing, and encoding it stalls
/// nothing.
#[derive(Debug)]
pub struct SnapshotJob {
    pub index: u64,
    pub table: LockTable,
}

impl SnapshotJob {
    /// Encodes the table: the slow part, for whichever thread.
    pub fn encode(&self) -> Vec<u8> {
        self.table.snapshot()
    }
}

impl Effects {
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
            && self.replies.is_empty()
            && self.applied.is_empty()
            && self.roles.is_empty()
            && self.grants.is_empty()
            && self.writes.is_empty()
            && self.encode.is_none()
    }
}

/// One new grant of a lock, as a request's answer told it: the key, the
/// token and the index of the log entry that granted it. A ghost release
/// names it, and is dropped unproposed unless the lock is still exactly that
/// grant: a re-grant to the same owner (a retry on another connection) or a
/// renewal since makes it a different one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantRef {
    pub key: Key,
    pub token: FencingToken,
    pub index: u64,
}

/// Counters for measuring batching.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests proposed (each one or more commands).
    pub requests_proposed: u64,
    pub commands_proposed: u64,
    pub entries_proposed: u64,
    /// Writes asked for, and syncs: the writes that asked for one, or, as a
    /// shell that knows counts them, the fsyncs its disk did (each covering
    /// a group of writes).
    pub writes: u64,
    pub syncs: u64,
    pub readies: u64,
    pub entries_applied: u64,
    pub snapshots_taken: u64,
    pub snapshots_installed: u64,
    /// Lock changes applied to the table, by kind (a grant to the holder
    /// already holding the key counts as a grant).
    pub grants_applied: u64,
    pub renewals_applied: u64,
    pub releases_applied: u64,
    pub expiries_applied: u64,
    /// Raft messages from the network that the gate dropped, by reason.
    pub refused: Refusals,
}

/// Raft's role, as reported by [`Replica::status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Follower,
    Candidate,
    PreCandidate,
    Leader,
}

/// A point-in-time view of a replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    pub id: NodeId,
    pub role: Role,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub leader_ready: bool,
    pub commit_index: u64,
    pub applied_index: u64,
    pub last_index: u64,
    pub snapshot_index: u64,
    /// The size of the last snapshot's table, in bytes.
    pub snapshot_bytes: u64,
    pub locks: usize,
    pub last_token: Option<FencingToken>,
    pub pending_requests: usize,
    /// This node lost its data and has not caught up yet: it does not vote.
    pub rejoining: bool,
    /// The cluster's id, once this node has applied it.
    pub cluster_id: Option<ClusterId>,
    /// The voters of the configuration this node knows, the outgoing ones
    /// while a change is under way (joint consensus), and its learners; in
    /// id order.
    pub voters: Vec<u64>,
    pub voters_outgoing: Vec<u64>,
    pub learners: Vec<u64>,
    /// The members this node had a raft message from within the last
    /// election timeout, itself included (filled in by the node; a leader
    /// hears from every member that can reach it, a follower only from its
    /// leader).
    pub reachable: Vec<u64>,
    /// While the node waits, with a blank store, for its peers to say how
    /// it starts: the peers it has not heard from (`starting` is set).
    pub waiting_for: Vec<u64>,
    pub starting: bool,
}

impl NodeStatus {
    /// A follower's status with nothing known yet: what a node reports
    /// while it starts.
    pub fn blank(id: NodeId) -> NodeStatus {
        NodeStatus {
            id,
            role: Role::Follower,
            term: 0,
            leader: None,
            leader_ready: false,
            commit_index: 0,
            applied_index: 0,
            last_index: 0,
            snapshot_index: 0,
            snapshot_bytes: 0,
            locks: 0,
            last_token: None,
            pending_requests: 0,
            rejoining: false,
            cluster_id: None,
            voters: Vec::new(),
            voters_outgoing: Vec::new(),
            learners: Vec::new(),
            reachable: vec![id.0],
            waiting_for: Vec::new(),
            starting: false,
        }
    }

    /// Whether the voters this node reaches (itself included) are a
    /// majority of every half of its configuration: as a leader, whether it
    /// can commit.
    pub fn has_quorum(&self) -> bool {
        let majority = |voters: &[u64]| {
            voters.is_empty()
                || voters.iter().filter(|voter| self.reachable.contains(voter)).count() > voters.len() / 2
        };
        !self.voters.is_empty() && majority(&self.voters) && majority(&self.voters_outgoing)
    }
}

/// The driver core. See the crate docs for the invariants it keeps.
pub struct Replica {
    id: NodeId,
    config: Arc<Config>,
    logger: Logger,
    /// Below the log: raft-rs.
    consensus: Consensus,
    /// Above the log: the lock service.
    service: LockService,
    /// What consensus hands out (the service's answers and changes are in
    /// its [`service::Outbox`]): together, the next [`Effects`].
    effects: Outgoing,
    stats: Stats,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica").field("status", &self.status()).finish_non_exhaustive()
    }
}

impl Replica {
    /// Opens a replica on what its store held (`recovered`): its log, hard
    /// state and snapshot; or bootstraps an empty store with
    /// `config.voters` (the first write says so).
    pub fn open(config: Config, recovered: Recovered, logger: &Logger) -> Result<Replica, FatalError> {
        Replica::open_rejoining(config, recovered, None, logger)
    }

    /// Like [`Replica::open`]; with `rejoin`, the store was found blank and
    /// the peers said this node lost its data ([`rejoin::decide`]): the floor
    /// is written first, and nothing this replica sends leaves before that
    /// write is durable.
    pub fn open_rejoining(
        config: Config,
        mut recovered: Recovered,
        rejoin: Option<Floor>,
        logger: &Logger,
    ) -> Result<Replica, FatalError> {
        config.validate()?;
        let logger = logger.new(slog::o!("node_id" => config.id.0));
        let mut membership = std::mem::take(&mut recovered.membership);
        let mut disk = Disk::default();
        let mut first_writes = Vec::new();
        let mut membership_written_at = 0;
        if let Some(floor) = rejoin {
            membership.rejoin = Some(floor);
            let batch = WriteBatch { membership: Some(membership.clone()), ..Default::default() };
            first_writes.push(disk.write(batch, false));
            membership_written_at = disk.submitted;
        }
        if recovered.conf_state.is_none() && !config.joining {
            let conf_state = ConfState::from((config.voters.iter().map(|v| v.0).collect::<Vec<_>>(), vec![]));
            let batch = WriteBatch { conf_state: Some(conf_state.clone()), ..Default::default() };
            first_writes.push(disk.write(batch, false));
            recovered.conf_state = Some(conf_state);
        }
        let conf_state = recovered.conf_state.clone().unwrap_or_default();
        if conf_state != ConfState::default() && !membership::holds(&conf_state, config.id.0) {
            return Err(FatalError::Removed { index: recovered.snapshot.get_metadata().index });
        }
        let peers = membership::peers_of(&conf_state, &config.voters);
        let table = if recovered.snapshot.get_metadata().index == 0 {
            // As every build before command levels started its log: the
            // log's Bootstrap or a RaiseLevel raises it.
            LockTable::at_level(1)
        } else {
            LockTable::restore(recovered.snapshot.get_data())?
        };
        let snapshot_index = recovered.snapshot.get_metadata().index;
        let cache = LogCache::from_recovered(recovered);
        info!(logger, "replica opened";
            "snapshot_index" => snapshot_index,
            "last_index" => raft::Storage::last_index(&cache).unwrap_or(0),
            "term" => cache.hard_state().term,
            "commit" => cache.hard_state().commit);

        let mut raft_config = raft::Config {
            id: config.id.0,
            election_tick: config.election_ticks,
            heartbeat_tick: config.heartbeat_ticks,
            // Entries after the snapshot are applied again: the table was
            // rebuilt from the snapshot alone.
            applied: snapshot_index,
            max_size_per_msg: config.max_size_per_msg_bytes,
            max_inflight_msgs: config.max_inflight_msgs,
            check_quorum: true,
            pre_vote: true,
            read_only_option: raft::ReadOnlyOption::Safe,
            ..Default::default()
        };
        if let Some(max) = config.election_ticks_max {
            raft_config.min_election_tick = config.election_ticks;
            raft_config.max_election_tick = max;
        }
        raft_config.validate()?;
        let raw = RawNode::new(&raft_config, cache, &logger)?;
        let reported = (raw.raft.state, raw.raft.term, raw.raft.leader_id);
        let (watch_history_bytes_max, watches_max, watches_per_connection_max) =
            (config.watch_history_bytes_max, config.watches_max, config.watches_per_connection_max);
        let watches =
            Watches::new(snapshot_index, watch_history_bytes_max, watches_max, watches_per_connection_max);
        let config = Arc::new(config);
        let service = LockService::new(Arc::clone(&config), table, snapshot_index, watches);
        let mut replica = Replica {
            id: config.id,
            config,
            logger,
            consensus: Consensus {
                raw,
                persist: Persistence { disk, membership_written_at, ..Persistence::default() },
                snapshots: Snapshots::default(),
                reported,
                abstaining: membership.rejoin,
                membership,
                membership_dirty: false,
                refusal_log: RefusalLog::default(),
                member_request: None,
                transfer: None,
                peers,
                conf_version: 0,
                removed: None,
            },
            service,
            effects: Outgoing { writes: first_writes, ..Outgoing::default() },
            stats: Stats::default(),
        };
        // A floor kept from a rejoin that finished before this start ends
        // at once, and quietly (it is kept on purpose, see the rejoin tests).
        replica.check_rejoined(false);
        Ok(replica)
    }

    /// Accepts a request of commands. The answer comes later in
    /// [`Effects::replies`], or at once when the request is refused.
    pub fn propose(&mut self, id: RequestId, commands: Vec<Command>) {
        self.submit(id, commands, None, false);
    }

    /// Accepts an acquire. With `wait_ms` > 0, a key held by another owner
    /// queues the request (FIFO per key) for up to `wait_ms` on this node's
    /// clock; with 0 it is answered [`RequestError::Held`] at once.
    pub fn acquire(
        &mut self,
        id: RequestId,
        key: Key,
        lease_ms: LeaseMs,
        owner: Owner,
        value: Value,
        wait_ms: u64,
    ) {
        self.acquire_with(id, Command::Grant { key, lease_ms, owner, value, session: None }, wait_ms);
    }

    /// Accepts an acquire of any kind (a Grant or a GrantShared, under a
    /// session or not), like [`Replica::acquire`]: waiting FIFO per key up
    /// to `wait_ms`.
    pub fn acquire_with(&mut self, id: RequestId, grant: Command, wait_ms: u64) {
        let wait_until_ms = (wait_ms > 0).then(|| self.service.now_ms.saturating_add(wait_ms));
        self.submit(id, vec![grant], wait_until_ms, false);
    }

    /// Accepts a shared acquire (a reader, the writer, or a permit), like
    /// [`Replica::acquire`]: waiting FIFO per key up to `wait_ms`.
    pub fn acquire_shared(
        &mut self,
        id: RequestId,
        key: Key,
        lease_ms: LeaseMs,
        owner: Owner,
        share: fencelock_types::Share,
        wait_ms: u64,
    ) {
        self.acquire_with(id, Command::GrantShared { key, lease_ms, owner, share, session: None }, wait_ms);
    }

    /// Releases a lock whose grant could not be delivered: its client is
    /// gone (a ghost lock). It is proposed only if, when its turn on the key
    /// comes, the lock is still exactly `grant`: not re-granted to its owner
    /// (a retry on another connection, told it holds the lock) nor renewed
    /// since. Does nothing on a follower; the lease then runs out.
    pub fn release_ghost(&mut self, grant: GrantRef) {
        info!(self.logger, "releasing ghost lock";
            "key" => %grant.key, "token" => grant.token.get(), "index" => grant.index);
        let id = self.service.internal_id();
        let release = Command::Release { key: grant.key, token: Some(grant.token), user: None };
        self.submit_with(id, vec![release], None, true, Some(grant.index));
    }

    /// Forgets request `id` if it was not proposed yet (its asker is gone):
    /// true when it is gone without a trace, false when it is in flight (or
    /// unknown), and will be answered.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        if self.service.watches.cancel(id) {
            return true;
        }
        if self.service.reads.waiting.remove(&id).is_some()
            || self.service.reads.member_checks.remove(&id).is_some()
        {
            self.service.reads.at_index.retain(|(_, read)| *read != id);
            self.service.reads.before_ready.retain(|read| *read != id);
            return true;
        }
        if self.service.requests.get(id).is_none_or(|pending| pending.proposed_term.is_some()) {
            return false;
        }
        let table = &self.service.table;
        self.service.requests.remove(id, &|key, waiter| admits(table, key, waiter));
        true
    }

    /// Accepts a watch, on any node: answered now if there is a change to
    /// tell (or it does not wait), else when one applies or its wait runs
    /// out ([`crate::watch`]).
    pub fn watch(&mut self, id: RequestId, conn: ConnId, query: WatchQuery) {
        match self.service.watches.ask(
            id,
            conn,
            query,
            &self.service.table,
            self.service.table_index,
            self.service.now_ms,
        ) {
            Ok(Some(answer)) => self.service.reply(id, Ok(Response::Watch(answer))),
            Ok(None) => {}
            Err(TooManyWatches { max, per_connection }) => {
                self.service.reply(id, Err(RequestError::TooManyWatches { max, per_connection }))
            }
        }
    }

    /// Watches parked, and the history's length in events and bytes.
    pub fn watch_stats(&self) -> (usize, usize, usize) {
        let (events, bytes) = self.service.watches.history_len();
        (self.service.watches.parked(), events, bytes)
    }

    /// Sets this node's monotonic time, in milliseconds. Time never goes
    /// backwards here: an earlier reading is ignored.
    pub fn set_now(&mut self, now_ms: u64) {
        self.service.now_ms = self.service.now_ms.max(now_ms);
        if self.service.leases.need_restore {
            self.service.restore_leases();
        }
    }

    fn submit(&mut self, id: RequestId, commands: Vec<Command>, wait_until_ms: Option<u64>, internal: bool) {
        self.submit_with(id, commands, wait_until_ms, internal, None)
    }

    fn submit_with(
        &mut self,
        id: RequestId,
        commands: Vec<Command>,
        wait_until_ms: Option<u64>,
        internal: bool,
        ghost_of: Option<u64>,
    ) {
        let acquire = !internal
            && commands
                .iter()
                .any(|command| matches!(command, Command::Grant { .. } | Command::GrantShared { .. }));
        if let Err(err) = self.admit(internal, acquire) {
            self.service.reply(id, Err(err));
            return;
        }
        if !internal {
            if let Err(err) = self.service.check_leases(&commands).and_then(|()| self.check_level(&commands))
            {
                self.service.reply(id, Err(err));
                return;
            }
        }
        if commands.is_empty() {
            self.service.reply(id, Ok(Response::Applied(Vec::new())));
            return;
        }
        self.service.requests.insert(id, Pending::new(commands, internal, ghost_of, wait_until_ms));
    }

    /// Refuses a command the cluster's command level does not have yet:
    /// proposed, it would apply as Invalid everywhere (a build before
    /// levels would skip it, and the table refuses it for the same
    /// result). A Grant with a value needs level 2 too: an older build
    /// drops the value.
    fn check_level(&self, commands: &[Command]) -> Result<(), RequestError> {
        let level = self.service.cluster_level();
        let needed = commands
            .iter()
            .map(|command| match command {
                Command::Grant { value, .. } if !value.as_bytes().is_empty() => 2,
                command => command.level(),
            })
            .max()
            .unwrap_or(1);
        if needed <= level {
            return Ok(());
        }
        let behind = self.members_behind(needed);
        Err(RequestError::LevelNotReached { needed, level, behind })
    }

    /// The members (voters and learners, this node aside) that have not
    /// said in a hello that they apply command `level`.
    fn members_behind(&self, level: u32) -> Vec<NodeId> {
        let me = self.config.id.0;
        let mut behind: Vec<NodeId> = self
            .consensus
            .raw
            .raft
            .prs()
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| *id != me && self.service.levels.peers.get(id).is_none_or(|peer| *peer < level))
            .map(NodeId)
            .collect();
        behind.sort();
        behind
    }

    /// What peer `id` said in its last hello: the command level it applies.
    pub fn peer_level(&mut self, id: NodeId, level: u32) {
        self.service.levels.peers.insert(id.0, level);
    }

    /// On a ready leader: once every member applies this build's command
    /// level and the cluster is below it, raise it (one RaiseLevel a term;
    /// none after the Bootstrap of a cluster founded at it).
    fn raise_level(&mut self) {
        if !self.service.leader_ready
            || self.service.cluster_level() >= LEVEL
            || self.service.levels.raised_in == Some(self.consensus.raw.raft.term)
        {
            return;
        }
        if !self.members_behind(LEVEL).is_empty() {
            return;
        }
        self.service.levels.raised_in = Some(self.consensus.raw.raft.term);
        info!(self.logger, "raising the command level"; "from" => self.service.table.level(), "to" => LEVEL);
        let id = self.service.internal_id();
        self.submit(id, vec![Command::RaiseLevel { level: LEVEL }], None, true);
    }

    /// Accepts a linearizable read.
    pub fn read(&mut self, id: RequestId, query: Query) {
        if let Err(err) = self.admit(false, false) {
            self.service.reply(id, Err(err));
            return;
        }
        self.service.reads.waiting.insert(id, query);
        if self.service.leader_ready {
            self.consensus.raw.read_index(id.0.to_le_bytes().to_vec());
        } else {
            // A leader right after its election: raft-rs would drop the
            // ReadIndex silently until the leader's first commit.
            self.service.reads.before_ready.push(id);
        }
    }

    /// Asks raft for the ReadIndex of the reads that came before this
    /// leader was ready.
    fn ask_parked_reads(&mut self) {
        if !self.service.leader_ready || self.service.reads.before_ready.is_empty() {
            return;
        }
        for id in std::mem::take(&mut self.service.reads.before_ready) {
            if self.service.reads.waiting.contains_key(&id) {
                self.consensus.raw.read_index(id.0.to_le_bytes().to_vec());
            }
        }
    }

    /// Feeds a raft message from a peer. Messages not for this node or not
    /// from one of its peers, and snapshots whose table does not restore,
    /// are dropped. A snapshot's table is decoded here, on the caller's
    /// thread, to check it and again to install it: a shell that would
    /// rather not stall decodes it once elsewhere and calls
    /// [`Replica::step_decoded`].
    pub fn step(&mut self, message: Message) {
        self.step_gated(message, None);
    }

    /// Feeds a snapshot message whose table was decoded already
    /// (`LockTable::restore` of its data, on another thread): checked like
    /// any message, and the table kept for the install.
    pub fn step_decoded(&mut self, message: Message, table: Result<LockTable, fencelock_fsm::SnapshotError>) {
        let Ok(table) = table else {
            return self.refuse(&message, gate::Refusal::BadSnapshot);
        };
        let metadata = message.get_snapshot().get_metadata();
        let (index, term) = (metadata.index, metadata.term);
        if self.step_gated(message, Some(&table)) {
            self.consensus.snapshots.decoded = Some((index, term, table));
        }
    }

    fn refuse(&mut self, message: &Message, reason: gate::Refusal) {
        self.stats.refused.count(reason);
        if let Some(unlogged) = self.consensus.refusal_log.should_log(reason, self.service.now_ms) {
            if reason.is_routine() {
                info!(self.logger, "dropping a raft message that fails the gate";
                    "reason" => reason.name(), "type" => ?message.get_msg_type(), "from" => message.from,
                    "to" => message.to, "term" => message.term, "index" => message.index,
                    "dropped_unlogged_since_last" => unlogged);
            } else {
                warn!(self.logger, "dropping a raft message that fails the gate";
                    "reason" => reason.name(), "type" => ?message.get_msg_type(), "from" => message.from,
                    "to" => message.to, "term" => message.term, "index" => message.index,
                    "dropped_unlogged_since_last" => unlogged);
            }
        }
    }

    /// Steps `message` if it passes the gate (with its snapshot's `table`,
    /// decoded, for a snapshot); true if it did.
    fn step_gated(&mut self, message: Message, table: Option<&LockTable>) -> bool {
        let raft = &self.consensus.raw.raft;
        let local = gate::Local {
            id: self.id,
            voters: &self.consensus.peers,
            term: raft.term,
            leader: raft.leader_id,
            last_index: raft.raft_log.last_index(),
            persisted: raft.raft_log.persisted,
            commit: raft.raft_log.committed,
            last_token: self.service.table.last_token(),
            cluster_id: self.service.table.cluster_id(),
        };
        if let Err(reason) = gate::check_with(&message, &local, table) {
            self.refuse(&message, reason);
            return false;
        }
        let mut message = message;
        if matches!(
            message.get_msg_type(),
            MessageType::MsgRequestVote
                | MessageType::MsgRequestVoteResponse
                | MessageType::MsgRequestPreVote
                | MessageType::MsgRequestPreVoteResponse
        ) {
            // raft-rs commits up to a vote's commit index if the terms
            // match: a shortcut for elections, and a way for a forged vote
            // to commit what was never replicated. Without it the leader's
            // appends commit the same entries a moment later.
            message.commit = 0;
            message.commit_term = 0;
        }
        if self.refuse_append_while_joining(&message) {
            return true;
        }
        if self.restart_replication(&message) {
            return true;
        }
        if self.consensus.membership.known.insert(message.from) {
            self.consensus.membership_dirty = true;
        }
        let last_index = self.consensus.raw.raft.raft_log.last_index();
        if message.get_msg_type() == MessageType::MsgHeartbeat && message.commit > last_index {
            // The leader remembers entries this node does not have: it lost
            // its data (or the leader is confused). raft-rs would panic on
            // such a commit; the node's own last index is as far as it can
            // commit, and the leader's next append finds where the logs part.
            warn!(self.logger, "heartbeat commits past this node's log";
                "from" => message.from, "commit" => message.commit, "last_index" => last_index,
                "rejoining" => self.consensus.abstaining.is_some());
            let mut message = message;
            message.commit = last_index;
            if message.term >= self.consensus.raw.raft.term {
                // The leader counts this node as holding entries it does not
                // have, and would never send them again. A rejection past
                // anything it counts makes it probe this node's log anew.
                // Past any index the leader counts, yet one its gate takes.
                let reject = self.append_rejection(&message, gate::INDEX_MAX, last_index);
                self.send(vec![reject]);
            }
            self.step_checked(message);
            return true;
        }
        self.step_checked(message);
        true
    }

    /// A rejection of `message` (an append or heartbeat) at `index`, this
    /// node's log ending at `hint`: what makes the leader probe its log.
    fn append_rejection(&self, message: &Message, index: u64, hint: u64) -> Message {
        let mut reject = Message::default();
        reject.set_msg_type(MessageType::MsgAppendResponse);
        reject.from = self.id.0;
        reject.to = message.from;
        reject.term = message.term;
        reject.reject = true;
        reject.index = index;
        reject.reject_hint = hint;
        reject
    }

    /// On the leader: the answer a follower gives a heartbeat that commits
    /// past its log (see [`Replica::step_gated`]), a rejection at
    /// [`gate::INDEX_MAX`] hinting at its last index. It lost entries it
    /// had acknowledged (its data directory): raft-rs would never send
    /// them again (it never backs off below what it counts as matched), so
    /// the count is lowered to the follower's log and replication starts
    /// again from there. Lowering it only slows commits, never speeds them.
    /// True when the message was this answer.
    fn restart_replication(&mut self, message: &Message) -> bool {
        let raft = &mut self.consensus.raw.raft;
        if raft.state != StateRole::Leader
            || message.get_msg_type() != MessageType::MsgAppendResponse
            || !message.reject
            || message.index != gate::INDEX_MAX
            || message.term != raft.term
        {
            return false;
        }
        let from = message.from;
        let lowered = match raft.mut_prs().get_mut(from) {
            Some(progress) if message.reject_hint < progress.matched => {
                let matched = progress.matched;
                progress.matched = message.reject_hint;
                progress.become_probe();
                Some(matched)
            }
            _ => None,
        };
        if let Some(matched) = lowered {
            warn!(self.logger, "a follower no longer holds entries it acknowledged: replicating again from its log's end";
                "from" => from, "acknowledged" => matched, "its_last_index" => message.reject_hint);
            raft.send_append(from);
        }
        true
    }

    fn step_checked(&mut self, message: Message) {
        if self.consensus.abstaining.is_some()
            && matches!(
                message.get_msg_type(),
                MessageType::MsgRequestVote | MessageType::MsgRequestPreVote | MessageType::MsgTimeoutNow
            )
        {
            debug!(self.logger, "rejoining: not voting yet"; "from" => message.from, "term" => message.term);
            return;
        }
        if message.get_msg_type() == MessageType::MsgTimeoutNow && self.snapshot_unapplied() {
            // Campaigning now would crash raft-rs (see `snapshot_unapplied`);
            // the leader's transfer times out, and it may ask again.
            info!(self.logger, "not campaigning on a leadership transfer while a snapshot is being written";
                "from" => message.from);
            return;
        }
        if let Err(err) = self.consensus.raw.step(message) {
            debug!(self.logger, "raft refused a message"; "error" => %err);
        }
    }

    /// Advances raft's logical clock by one tick. A rejoining node's
    /// clock stands still: a follower's ticks only lead to campaigns.
    pub fn tick(&mut self) {
        if self.consensus.abstaining.is_none() && !self.snapshot_unapplied() {
            self.consensus.raw.tick();
        }
        self.raise_level();
    }

    /// A snapshot from the leader is installed but its write is not durable
    /// yet. raft-rs took it as stable when its ready was handed over
    /// (`advance_append_async`), but counts it applied only once persisted
    /// (`release_persisted`); meanwhile raft's applied index is below the
    /// log's first entry. A campaign in that window (an election timeout,
    /// or `MsgTimeoutNow`) reads the "unapplied" entries below the snapshot,
    /// which the log no longer has, and raft-rs panics. So the node's clock
    /// stands still for the few milliseconds of that write: it has just
    /// heard from a leader anyway. Found by the simulator, seed 3002890773
    /// (5 nodes).
    fn snapshot_unapplied(&self) -> bool {
        self.consensus.raw.raft.raft_log.applied < self.consensus.raw.store().snapshot_index()
    }

    /// The peers this node has had raft messages from, for its hellos.
    pub(crate) fn known_peers(&self) -> &BTreeSet<u64> {
        &self.consensus.membership.known
    }

    /// Sets the election timeout raft-rs drew at its last reset (a role or
    /// term change) to `ticks`, clamped into the configured window: for a
    /// deterministic simulation, which draws it from its seed instead of
    /// raft-rs's unseeded generator.
    pub(crate) fn pin_election_timeout(&mut self, ticks: usize) {
        // raft-rs's window: [election_ticks, max), max twice the minimum
        // unless configured.
        let min = self.config.election_ticks;
        let max = self.config.election_ticks_max.unwrap_or(2 * min);
        if max > min {
            self.consensus.raw.raft.set_randomized_election_timeout(ticks.clamp(min, max - 1));
        }
    }

    /// This node's raft term and last log index, for its hellos.
    pub(crate) fn log_position(&self) -> (u64, u64) {
        (self.consensus.raw.raft.term, self.consensus.raw.raft.raft_log.last_index())
    }

    /// Ends a rejoin once this node caught up past its floor (see
    /// [`crate::rejoin`]); says so at info when `news` (not at a start
    /// whose kept floor was passed long ago).
    fn check_rejoined(&mut self, news: bool) {
        let Some(floor) = self.consensus.abstaining else { return };
        let raft = &self.consensus.raw.raft;
        let committed = raft.raft_log.committed;
        let position = RaftPosition {
            term: raft.term,
            vote: raft.vote,
            leader_id: raft.leader_id,
            committed,
            committed_term: raft.raft_log.term(committed).unwrap_or(0),
        };
        let Some(pin) = rejoin::caught_up(floor, position) else { return };
        if let PinVote::To(leader) = pin {
            // The lost store may have voted in this term: count the vote as
            // given to the term's leader, so that it is never given again.
            self.consensus.raw.raft.vote = leader;
        }
        self.consensus.abstaining = None;
        if news {
            info!(self.logger, "rejoined: caught up, voting again";
                "term" => position.term, "committed" => committed, "floor_term" => floor.term,
                "floor_last_index" => floor.last_index);
        } else {
            debug!(self.logger, "the rejoin's floor, kept, was passed before this start";
                "term" => position.term, "committed" => committed, "floor_term" => floor.term,
                "floor_last_index" => floor.last_index);
        }
    }

    /// Starts an election now, for a test that cannot wait for a timeout.
    #[cfg(test)]
    pub(crate) fn campaign(&mut self) -> Result<(), FatalError> {
        Ok(self.consensus.raw.campaign()?)
    }

    /// Asks this node, if it leads, to hand leadership to `transferee`. A
    /// follower does nothing (raft-rs would forward it to the leader, whose
    /// gate drops transfers from the network).
    pub fn transfer_leader(&mut self, transferee: NodeId) {
        if self.consensus.raw.raft.state == StateRole::Leader {
            self.consensus.raw.transfer_leader(transferee.0);
        }
    }

    /// Does one turn: proposes what is ready as one batch of entries, then
    /// handles one raft `Ready`. Call it after feeding inputs; then drain
    /// [`Replica::take_effects`]: its messages may leave before its writes
    /// are made (what may not is held until [`Replica::on_persisted`]).
    /// An error is fatal: drop the replica.
    pub fn run_ready(&mut self) -> Result<(), FatalError> {
        if let Some((index, write)) = self.consensus.removed {
            if self.consensus.persist.disk.durable >= write {
                return Err(FatalError::Removed { index });
            }
        }
        self.notice_role_change();
        self.service.time_out_waiters();
        self.check_transfer();
        self.ask_parked_reads();
        self.propose_expiries();
        self.propose_ready_requests();
        self.handle_ready()?;
        self.service.answer_watches();
        self.notice_role_change();
        self.check_transfer();
        // A decoded snapshot is installed by the ready right after its
        // message: one still here was not (raft ignored the message, say,
        // for an old term), and may be a large table to let go of.
        self.consensus.snapshots.decoded = None;
        self.notice_role_change();
        for to in std::mem::take(&mut self.consensus.snapshots.sent) {
            // The transport does not report delivery. Saying "finished"
            // returns the peer to probing: if the snapshot was lost, the probe
            // fails and a new snapshot is sent.
            self.consensus.raw.report_snapshot(to, SnapshotStatus::Finish);
        }
        Ok(())
    }

    pub fn take_effects(&mut self) -> Effects {
        let out = &mut self.service.out;
        let Outgoing { messages, roles, writes, encode } = std::mem::take(&mut self.effects);
        Effects {
            messages,
            replies: std::mem::take(&mut out.replies),
            applied: std::mem::take(&mut out.applied),
            roles,
            grants: std::mem::take(&mut out.grants),
            writes,
            encode,
        }
    }

    /// Whether a turn now would do something: raft has a `Ready`, requests
    /// or reads wait for a ready leader that is, or effects (messages let go
    /// by `on_persisted`) wait to be handed out.
    pub fn has_ready(&self) -> bool {
        self.consensus.raw.has_ready()
            || !self.effects.is_empty()
            || !self.service.out.is_empty()
            || self.consensus.removed.is_some_and(|(_, write)| self.consensus.persist.disk.durable >= write)
            || self.service.leader_ready
                && (self.service.requests.has_ready() || !self.service.reads.before_ready.is_empty())
    }

    pub fn is_leader_ready(&self) -> bool {
        self.service.leader_ready
    }

    /// The applied lock table (not linearizable: see [`Replica::read`]).
    pub fn table(&self) -> &LockTable {
        &self.service.table
    }

    pub fn stats(&self) -> Stats {
        let served = &self.service.out.stats;
        Stats {
            writes: self.consensus.persist.disk.submitted,
            syncs: self.consensus.persist.disk.syncs,
            grants_applied: served.grants_applied,
            renewals_applied: served.renewals_applied,
            releases_applied: served.releases_applied,
            expiries_applied: served.expiries_applied,
            ..self.stats
        }
    }

    /// The first `writes` writes since open are durable: the votes and
    /// acknowledgements that waited for them go out with the next effects,
    /// raft counts the entries persisted, and a leader may now commit and
    /// apply them. Call [`Replica::run_ready`] after.
    pub fn on_persisted(&mut self, writes: u64) {
        // A store reports only writes it was given: more is a broken
        // store, and counting it durable would release messages that wait
        // for writes never made.
        assert!(
            writes <= self.consensus.persist.disk.submitted,
            "the store reports {writes} writes durable of {} submitted",
            self.consensus.persist.disk.submitted
        );
        // A report may come late (an inline write counted since), never
        // taking durability back.
        self.consensus.persist.disk.durable = self.consensus.persist.disk.durable.max(writes);
        self.release_persisted();
    }

    /// Writes asked for and not yet reported durable.
    pub fn writes_in_flight(&self) -> u64 {
        self.consensus.persist.disk.submitted - self.consensus.persist.disk.durable
    }

    /// Tells raft which readies are now durable, and lets the messages
    /// that waited for them go.
    fn release_persisted(&mut self) {
        while self
            .consensus
            .persist
            .held
            .front()
            .is_some_and(|(write, _)| *write <= self.consensus.persist.disk.durable)
        {
            let Some((_, messages)) = self.consensus.persist.held.pop_front() else { break };
            self.effects.messages.extend(messages);
        }
        let mut persisted = None;
        let mut snapshot_index = None;
        while self
            .consensus
            .persist
            .unpersisted
            .front()
            .is_some_and(|ready| ready.write <= self.consensus.persist.disk.durable)
        {
            let Some(ready) = self.consensus.persist.unpersisted.pop_front() else { break };
            persisted = Some(ready.number);
            snapshot_index = ready.snapshot_index.or(snapshot_index);
        }
        if let Some(number) = persisted {
            self.consensus.raw.on_persist_ready(number);
        }
        if let Some(index) = snapshot_index {
            // The table holds the snapshot since it was installed.
            self.consensus.raw.advance_apply_to(index);
        }
    }

    pub fn status(&self) -> NodeStatus {
        let raft = &self.consensus.raw.raft;
        let conf = raft.prs().conf().to_conf_state();
        NodeStatus {
            id: self.id,
            role: match raft.state {
                StateRole::Follower => Role::Follower,
                StateRole::Candidate => Role::Candidate,
                StateRole::PreCandidate => Role::PreCandidate,
                StateRole::Leader => Role::Leader,
            },
            term: raft.term,
            leader: self.leader_hint(),
            leader_ready: self.service.leader_ready,
            commit_index: raft.raft_log.committed,
            applied_index: self.service.table_index,
            last_index: raft.raft_log.last_index(),
            snapshot_index: self.consensus.raw.store().snapshot_index(),
            snapshot_bytes: self.consensus.raw.store().last_snapshot().get_data().len() as u64,
            locks: self.service.table.len(),
            last_token: self.service.table.last_token(),
            pending_requests: self.service.requests.clients() + self.service.reads.waiting.len(),
            rejoining: self.consensus.abstaining.is_some(),
            cluster_id: self.service.table.cluster_id(),
            voters: sorted(conf.voters.iter()),
            voters_outgoing: sorted(conf.voters_outgoing.iter()),
            learners: sorted(conf.learners.iter().chain(&conf.learners_next)),
            reachable: Vec::new(),
            waiting_for: Vec::new(),
            starting: false,
        }
    }

    /// Whether a decoded snapshot table waits for its install (tests).
    #[cfg(test)]
    pub(crate) fn holds_decoded_snapshot(&self) -> bool {
        self.consensus.snapshots.decoded.is_some()
    }

    /// The cluster's id, once applied.
    pub fn cluster_id(&self) -> Option<ClusterId> {
        self.service.table.cluster_id()
    }

    fn leader_hint(&self) -> Option<NodeId> {
        match self.consensus.raw.raft.leader_id {
            0 => None,
            id => Some(NodeId(id)),
        }
    }

    /// Whether a request of this kind finds room: the leader's own
    /// requests have a budget of their own, and client acquires may take
    /// only part of the clients' budget, so that renewals, releases and
    /// expiries flow whatever the acquires do.
    fn admit(&self, internal: bool, acquire: bool) -> Result<(), RequestError> {
        if self.consensus.raw.raft.state != StateRole::Leader {
            return Err(RequestError::NotLeader { leader_hint: self.leader_hint() });
        }
        let full = if internal {
            self.service.requests.internal() >= self.config.internal_pending_max
        } else {
            self.service.requests.clients() + self.service.reads.waiting.len()
                >= self.config.pending_requests_max
                || acquire && self.service.requests.acquires() >= self.config.pending_acquires_max
        };
        if full {
            return Err(RequestError::Overloaded);
        }
        Ok(())
    }

    /// On the ready leader, every scan interval: proposes an Expire for each
    /// lease this node's clock says is due.
    fn propose_expiries(&mut self) {
        if self.consensus.raw.raft.state != StateRole::Leader || !self.service.leader_ready {
            return;
        }
        let interval_ms = self.config.expiry_scan_interval_ms;
        if self
            .service
            .leases
            .last_scan_ms
            .is_some_and(|last_ms| self.service.now_ms < last_ms.saturating_add(interval_ms))
        {
            return;
        }
        self.service.leases.last_scan_ms = Some(self.service.now_ms);
        let due: Vec<(Key, FencingToken)> = self
            .service
            .leases
            .plain
            .due(self.service.now_ms)
            .filter(|(key, _)| !self.service.requests.is_expiring(key))
            .map(|(key, token)| (key.clone(), token))
            .collect();
        let shared_due: Vec<(Key, FencingToken)> = self
            .service
            .leases
            .shared
            .due(self.service.now_ms)
            .filter(|((key, _), _)| !self.service.requests.is_expiring(key))
            .map(|((key, _), token)| (key.clone(), token))
            .collect();
        // Sessions whose time is up: all they hold goes in one entry.
        let requests = &self.service.requests;
        self.service.leases.sessions_expiring.retain(|_, id| requests.contains(*id));
        self.service.leases.session_renewals.retain(|(id, _)| requests.contains(*id));
        let sessions_due: Vec<FencingToken> = self
            .service
            .leases
            .sessions
            .due(self.service.now_ms)
            .map(|(session, _)| *session)
            .filter(|session| !self.service.leases.sessions_expiring.contains_key(session))
            .collect();
        for session in sessions_due {
            if self.service.requests.internal() >= self.config.internal_pending_max {
                break;
            }
            let id = self.service.internal_id();
            debug!(self.logger, "session due"; "session" => session.get(), "now_ms" => self.service.now_ms);
            let delays = self.config.lock_delays.clone();
            self.service.leases.sessions_expiring.insert(session, id);
            self.submit(id, vec![Command::ExpireSession { session, delays }], None, true);
        }
        // One request per shared key, with an Expire for each of its
        // holders that is due (up to an entry's worth): a thousand readers
        // that die together leave in one entry, not one scan each. Keys in
        // the order their first holder fell due.
        let mut by_key: Vec<(Key, Vec<FencingToken>)> = Vec::new();
        let mut at: BTreeMap<Key, usize> = BTreeMap::new();
        for (key, token) in shared_due {
            match at.get(&key) {
                Some(&index) => {
                    let tokens = &mut by_key[index].1;
                    if tokens.len() < self.config.entry_commands_max {
                        tokens.push(token);
                    }
                }
                None => {
                    at.insert(key.clone(), by_key.len());
                    by_key.push((key, vec![token]));
                }
            }
        }
        for (key, tokens) in by_key {
            if self.service.requests.internal() >= self.config.internal_pending_max {
                break;
            }
            let id = self.service.internal_id();
            let delay_rule = self.config.lock_delay(key.as_bytes());
            let shared = self.service.table.shared(key.as_bytes());
            let commands = tokens
                .into_iter()
                .map(|token| {
                    // As for a plain lock: a holder held back is lifted, a
                    // live one held back if a rule covers its key.
                    let held_back = shared
                        .and_then(|shared| shared.holders.get(&token))
                        .is_some_and(|holder| holder.delayed);
                    let delay = if held_back { None } else { delay_rule };
                    debug!(self.logger, "shared lease due"; "key" => %key, "token" => token.get(),
                        "now_ms" => self.service.now_ms, "held_back" => held_back, "delay_ms" => delay.map(LeaseMs::get));
                    Command::Expire { key: key.clone(), token, delay }
                })
                .collect();
            self.submit(id, commands, None, true);
        }
        for (key, token) in due {
            if self.service.requests.internal() >= self.config.internal_pending_max {
                break;
            }
            let id = self.service.internal_id();
            // A lock held back by lock-delay is lifted (an Expire without a
            // delay); a live one is held back if a rule covers its key.
            let held_back = self.service.table.holder(key.as_bytes()).is_some_and(|lock| lock.delayed);
            let delay = if held_back { None } else { self.config.lock_delay(key.as_bytes()) };
            debug!(self.logger, "lease due"; "key" => %key, "token" => token.get(), "now_ms" => self.service.now_ms,
                "held_back" => held_back, "delay_ms" => delay.map(LeaseMs::get));
            self.submit(id, vec![Command::Expire { key, token, delay }], None, true);
        }
    }

    /// Proposes every ready request, many per entry.
    fn propose_ready_requests(&mut self) {
        if self.consensus.raw.raft.state != StateRole::Leader || !self.service.leader_ready {
            return;
        }
        let mut batch = Batch::default();
        while let Some(id) = self.service.requests.pop_ready() {
            // Nothing else is in flight on these keys, so the applied table
            // (and this node's leases) is what this request will meet.
            if let Some(stale) = self.service.stale_expire(id) {
                debug!(self.logger, "expire no longer due"; "key" => %stale);
                self.service.finish(id, Ok(Response::Applied(Vec::new())));
                continue;
            }
            if self.service.stale_session_expiry(id) {
                debug!(self.logger, "session expiry no longer due");
                self.service.finish(id, Ok(Response::Applied(Vec::new())));
                continue;
            }
            if let Some(stale) = self.service.stale_ghost(id) {
                info!(self.logger, "ghost lock was granted or renewed again since: kept"; "key" => %stale);
                self.service.finish(id, Ok(Response::Applied(Vec::new())));
                continue;
            }
            let pending = self.service.requests.get(id).expect("a request ready to propose is pending");
            if let Some((key, holder_token)) =
                self.service.grant_conflict(&pending.commands, pending.admitted)
            {
                let max = self.config.waiters_per_key_max;
                if pending.wait_until_ms.is_none() || self.service.turned_away_by_itself(&pending.commands) {
                    let error = match self.service.table.holder(key.as_bytes()).filter(|lock| lock.delayed) {
                        Some(lock) => {
                            let left_ms = self.service.held(&key, lock).remaining_ms;
                            RequestError::Delayed { key, holder_token, left_ms }
                        }
                        None => RequestError::Held { key, holder_token },
                    };
                    self.service.finish(id, Err(error));
                } else if self.service.requests.waiters_of(&key) >= max {
                    self.service.finish(id, Err(RequestError::TooManyWaiters { key, max }));
                } else {
                    let table = &self.service.table;
                    self.service.requests.wait_for(id, key, &|key, waiter| admits(table, key, waiter));
                }
                continue;
            }
            let new_locks = match self.service.quota_check(id, false) {
                Ok(new_locks) => new_locks,
                Err(err) => {
                    self.service.finish(id, Err(err));
                    continue;
                }
            };
            self.service.requests.count_new_locks(id, new_locks);
            let start = batch.commands.len();
            let removed = self.add_to_batch(&mut batch, id);
            // Hand each lock this request frees to its first waiter in the
            // same entry: a hot-key handoff costs one commit. A waiter that
            // would break a quota is answered, and the next one asked.
            let mut handed = Vec::new();
            for key in removed {
                while let Some(waiter) = self.service.requests.first_waiter(&key) {
                    match self.service.quota_check(waiter, true) {
                        Ok(new_locks) => {
                            self.service.requests.hand_over(&key, id);
                            self.service.requests.count_new_locks(waiter, new_locks);
                            self.add_to_batch(&mut batch, waiter);
                            handed.push((key, waiter));
                            break;
                        }
                        Err(err) => self.service.finish(waiter, Err(err)),
                    }
                }
            }
            self.hand_on_shared(&mut batch, start, id, &handed);
            if batch.commands.len() >= self.config.entry_commands_max {
                self.propose_entry(std::mem::take(&mut batch));
            }
        }
        if !batch.commands.is_empty() {
            self.propose_entry(batch);
        }
    }

    /// Hands the keys that the batch's commands from `start` on touch
    /// (request `id`'s, and those of the waiters `handed` its keys) on to
    /// as many more of their waiters as each key will admit once those
    /// commands apply: the readers queued behind a writer that leaves, or
    /// the waiters for permits freed together, go in this entry, not one
    /// entry each. Decided on a clone of the table (O(1): imbl) with those
    /// commands applied, as the table will decide: nothing else is in
    /// flight on these keys (their queues hold only this chain), and what
    /// is in flight elsewhere (a session's end) can only free them.
    fn hand_on_shared(
        &mut self,
        batch: &mut Batch,
        start: usize,
        id: RequestId,
        handed: &[(Key, RequestId)],
    ) {
        // A plain lock's key has had its one waiter handed over (a hot
        // key's handoff costs no clone): only a shared key, or one whose
        // first waiter asks for a share, can take more.
        let mut keys: Vec<Key> = batch.commands[start..]
            .iter()
            .filter_map(Command::key)
            .filter(|key| {
                let first = self
                    .service
                    .requests
                    .first_waiter(key)
                    .and_then(|waiter| self.service.requests.get(waiter));
                let wants_more = first.is_some_and(|waiter| {
                    self.service.table.shared(key.as_bytes()).is_some()
                        || waiter
                            .commands
                            .iter()
                            .any(|command| matches!(command, Command::GrantShared { .. }))
                });
                // A holder under a session may be held back or freed by that
                // session's end, in flight or earlier in this batch (a
                // CloseSession or the leader's ExpireSession goes through no
                // key queue): no guess then. Seed 132174523: an ExpireSession
                // held a permit back, so the release of it later in the same
                // entry freed nothing, and the waiter handed it was rejected.
                wants_more && !self.service.table.has_session_holder(key.as_bytes())
            })
            .cloned()
            .collect();
        if keys.is_empty() {
            return;
        }
        keys.sort();
        keys.dedup();
        let mut scratch = self.service.table.clone();
        for command in &batch.commands[start..] {
            scratch.apply(command.clone());
        }
        // What the chain adds: counted in flight, and held in `scratch`.
        let mut in_table: Vec<(Vec<u8>, bool)> = std::iter::once(id)
            .chain(handed.iter().map(|(_, waiter)| *waiter))
            .filter_map(|chained| self.service.requests.get(chained))
            .flat_map(|pending| pending.new_locks.iter().cloned())
            .collect();
        for key in keys {
            // Queued right behind the chain's last request on the key.
            let mut last = handed.iter().rev().find(|(of, _)| *of == key).map_or(id, |(_, waiter)| *waiter);
            while let Some(waiter) = self.service.requests.first_waiter(&key) {
                // Only a new place: an owner's retry (its grant Existing)
                // waits for an entry after the grant it repeats, so that a
                // ghost release of that grant, known by its index, never
                // takes the place the retry was told it holds.
                let takes_new_place = self.service.requests.get(waiter).is_some_and(|pending| {
                    admits(&scratch, &key, pending) && !repeats_a_grant(&scratch, &key, pending)
                });
                if !takes_new_place {
                    break;
                }
                match self.service.quota_check_in(&scratch, waiter, false, &in_table) {
                    Ok(new_locks) => {
                        self.service.requests.hand_over(&key, last);
                        in_table.extend(new_locks.iter().cloned());
                        self.service.requests.count_new_locks(waiter, new_locks);
                        let from = batch.commands.len();
                        self.add_to_batch(batch, waiter);
                        for command in &batch.commands[from..] {
                            scratch.apply(command.clone());
                        }
                        last = waiter;
                    }
                    Err(err) => self.service.finish(waiter, Err(err)),
                }
            }
        }
    }

    /// Moves request `id`'s commands into `batch`; returns the keys whose
    /// lock those commands will remove.
    fn add_to_batch(&mut self, batch: &mut Batch, id: RequestId) -> Vec<Key> {
        let commands = self.service.requests.propose(id, self.consensus.raw.raft.term);
        for command in &commands {
            let renewed = match command {
                Command::RenewSession { session, .. } => Some(*session),
                Command::Renew { key, token, .. } => self.service.table.session_of(key.as_bytes(), *token),
                _ => None,
            };
            if let Some(session) = renewed {
                self.service.leases.session_renewals.push((id, session));
            }
        }
        let removed = commands
            .iter()
            .filter_map(|command| match command {
                Command::Release { key, token, user } => Some((key, *token, user.as_ref(), false)),
                // With a delay an Expire holds the key back: it frees nothing.
                Command::Expire { key, token, delay: None } => Some((key, Some(*token), None, true)),
                _ => None,
            })
            .filter(|(key, token, user, expire)| {
                // As the table will decide it: a release of another user's
                // lock is denied and frees nothing, and a lock held back by
                // lock-delay is freed only by force or by its lifting Expire.
                // A lock held under a session may be held back or freed by
                // that session's end, in flight or earlier in this batch (a
                // CloseSession or the leader's ExpireSession goes through no
                // key queue): no guess then; its waiter is woken when the
                // key frees. Seed 5871 of 5 nodes: an ExpireSession held k1
                // back, the release of it later in the same entry freed
                // nothing, and the waiter handed it was rejected.
                self.service.table.holder(key.as_bytes()).is_some_and(|lock| {
                    token.is_none_or(|token| token == lock.token)
                        && user.is_none_or(|user| lock.owner.is_of_user(user.as_bytes()))
                        && (!lock.delayed || *expire || token.is_none())
                        && lock.session.is_none()
                })
            })
            .map(|(key, ..)| key.clone())
            .collect();
        batch.tags.push(pb::RequestTag {
            request_id: id.0,
            commands: commands.len() as u32,
            ..Default::default()
        });
        batch.commands.extend(commands);
        removed
    }

    fn propose_entry(&mut self, batch: Batch) {
        let ids: Vec<RequestId> = batch.tags.iter().map(|tag| RequestId(tag.request_id)).collect();
        let context =
            pb::EntryTags { proposer: self.id.0, requests: batch.tags.into(), ..Default::default() }
                .write_to_bytes()
                .expect("encoding EntryTags into a Vec cannot fail");
        let n_commands = batch.commands.len() as u64;
        match self.consensus.raw.propose(context, encode_batch(&batch.commands)) {
            Ok(()) => {
                self.stats.entries_proposed += 1;
                self.stats.commands_proposed += n_commands;
                self.stats.requests_proposed += ids.len() as u64;
            }
            Err(err) => {
                debug!(self.logger, "proposal dropped"; "error" => %err, "requests" => ids.len());
                for id in ids {
                    self.service.finish(id, Err(RequestError::Dropped));
                }
            }
        }
    }

    /// Reports role changes, and fails every pending request when this node
    /// stops being the leader of the term it was leading.
    fn notice_role_change(&mut self) {
        let raft = &self.consensus.raw.raft;
        let now = (raft.state, raft.term, raft.leader_id);
        if now == self.consensus.reported {
            return;
        }
        let (was_state, was_term, _) = self.consensus.reported;
        self.consensus.reported = now;
        let (state, term, _) = now;
        if was_state == StateRole::Leader && (state != StateRole::Leader || term != was_term) {
            self.service.leader_ready = false;
            self.fail_all_requests();
        }
        let change = match state {
            StateRole::Leader => RoleChange::Leader { term },
            StateRole::Candidate | StateRole::PreCandidate => RoleChange::Candidate { term },
            StateRole::Follower => RoleChange::Follower { term, leader: self.leader_hint() },
        };
        if state == StateRole::Leader {
            self.service.leader_ready = false;
        }
        info!(self.logger, "role changed"; "role" => ?state, "term" => term, "leader" => self.consensus.raw.raft.leader_id);
        self.effects.roles.push(change);
    }

    fn fail_all_requests(&mut self) {
        let leader_hint = self.leader_hint();
        for (id, pending) in self.service.requests.clear() {
            let err = match pending.proposed_term {
                Some(_) => RequestError::LeadershipLost { leader_hint },
                None => RequestError::NotLeader { leader_hint },
            };
            self.service.reply(id, Err(err));
        }
        for id in std::mem::take(&mut self.service.reads.waiting).into_keys() {
            self.service.reply(id, Err(RequestError::NotLeader { leader_hint }));
        }
        self.fail_member_requests();
        self.service.reads.at_index.clear();
        self.service.reads.before_ready.clear();
        self.service.leases.last_scan_ms = None;
    }

    /// Asks for a write; a follower's is urgent (it is on the path of
    /// every commit), a leader's runs in parallel with its followers'.
    fn write(&mut self, batch: WriteBatch) {
        // A follower's writes may be made at once on its own thread, when
        // the disk is idle; never one with a snapshot, which may be large.
        let urgent = self.consensus.raw.raft.state != StateRole::Leader && batch.snapshot.is_none();
        let write = self.consensus.persist.disk.write(batch, urgent);
        self.effects.writes.push(write);
    }

    fn handle_ready(&mut self) -> Result<(), FatalError> {
        if !self.consensus.raw.has_ready() {
            if std::mem::take(&mut self.consensus.membership_dirty) {
                // A first message that changed nothing raft keeps.
                self.write(WriteBatch {
                    membership: Some(self.consensus.membership.clone()),
                    ..Default::default()
                });
                self.consensus.persist.membership_written_at = self.consensus.persist.disk.submitted;
            }
            return Ok(());
        }
        self.stats.readies += 1;
        let mut ready = self.consensus.raw.ready();

        // A leader may send before its own write: followers persist in
        // parallel. Not while the record that a peer was heard from for the
        // first time is not durable: what that peer took part in must not
        // outlive the record that it did (`crate::rejoin`).
        let membership_write = std::mem::take(&mut self.consensus.membership_dirty);
        let send_early = !membership_write
            && self.consensus.persist.disk.durable >= self.consensus.persist.membership_written_at;
        if send_early {
            self.send(ready.take_messages());
        }

        let installed = !ready.snapshot().is_empty();
        if installed {
            let snapshot = ready.snapshot().clone();
            self.install_snapshot(snapshot)?;
        }

        for read in ready.take_read_states() {
            let id = read_request_id(&read.request_ctx);
            if self.service.reads.waiting.contains_key(&id)
                || self.service.reads.member_checks.contains_key(&id)
            {
                self.service.reads.at_index.push((read.index, id));
            }
        }

        // Entries committed before this Ready, and so persisted: their
        // results may leave before this Ready's write.
        let committed = ready.take_committed_entries();
        let last_committed = committed.last().map(|entry| entry.index);
        self.apply_entries(committed)?;

        let entries = ready.take_entries();
        let cache = self.consensus.raw.mut_store();
        cache.append(&entries);
        if let Some(hard_state) = ready.hs() {
            cache.set_hard_state(hard_state.clone());
        }
        let write_hard_state = installed || ready.hs().is_some();
        let cache = self.consensus.raw.store();
        let batch = WriteBatch {
            snapshot: installed.then(|| cache.last_snapshot().clone()),
            install: installed,
            entries,
            hard_state: write_hard_state.then(|| cache.hard_state().clone()),
            conf_state: installed.then(|| cache.conf_state().clone()),
            membership: membership_write.then(|| self.consensus.membership.clone()),
            may_defer_sync: !ready.must_sync() && !membership_write,
        };
        if !batch.is_empty() {
            self.write(batch);
        }
        if membership_write {
            self.consensus.persist.membership_written_at = self.consensus.persist.disk.submitted;
        }

        // Votes and append acknowledgements wait for every write so far to
        // be durable, and raft learns of it with `on_persisted`. Meanwhile
        // this node goes on stepping, proposing and applying what was
        // persisted before.
        let mut messages = ready.take_persisted_messages();
        if !send_early {
            let leader_messages = ready.take_messages();
            self.note_snapshots_sent(&leader_messages);
            messages.extend(leader_messages);
        }
        if self.consensus.persist.disk.durable == self.consensus.persist.disk.submitted {
            // Nothing is waiting to be durable (this ready wrote nothing).
            self.send(messages);
        } else if !messages.is_empty() {
            // They leave once every write so far is durable
            // (`release_persisted`).
            self.consensus.persist.held.push_back((self.consensus.persist.disk.submitted, messages));
        }
        // Raft counts a snapshot applied only once it is persisted; the
        // entries applied above were persisted before this ready.
        let snapshot_index = installed.then(|| ready.snapshot().get_metadata().index);
        let number = ready.number();
        self.consensus.persist.unpersisted.push_back(Unpersisted {
            write: self.consensus.persist.disk.submitted,
            number,
            snapshot_index,
        });
        self.consensus.raw.advance_append_async(ready);
        if let Some(index) = last_committed {
            self.consensus.raw.advance_apply_to(index);
        }
        self.release_persisted();
        self.answer_reads();
        self.maybe_snapshot()?;
        self.check_rejoined(true);
        Ok(())
    }

    fn send(&mut self, messages: Vec<Message>) {
        self.note_snapshots_sent(&messages);
        self.effects.messages.extend(messages);
    }

    fn note_snapshots_sent(&mut self, messages: &[Message]) {
        for message in messages {
            if message.get_msg_type() == MessageType::MsgSnapshot {
                self.consensus.snapshots.sent.push(message.to);
            }
        }
    }

    fn install_snapshot(&mut self, snapshot: Snapshot) -> Result<(), FatalError> {
        let metadata = snapshot.get_metadata();
        let table = match self.consensus.snapshots.decoded.take() {
            // Decoded when its message arrived (maybe on another thread).
            Some((index, term, table)) if index == metadata.index && term == metadata.term => table,
            // Checked when the message arrived; a failure here is a bug or
            // a corrupt store, and fatal.
            _ => LockTable::restore(snapshot.get_data())?,
        };
        assert!(
            table.last_token() >= self.service.table.last_token(),
            "a snapshot would move fencing tokens backwards: {:?} after {:?}",
            table.last_token(),
            self.service.table.last_token()
        );
        if table.level() > LEVEL {
            return Err(FatalError::TooOld { level: table.level() });
        }
        let index = snapshot.get_metadata().index;
        info!(self.logger, "installing snapshot"; "index" => index, "locks" => table.len());
        self.service.table = table;
        self.service.table_index = index;
        // The changes before the snapshot are not known here.
        self.service.watches.reset(index);
        // Which grant each lock is, is not in a snapshot: a ghost release
        // from before finds no match and is dropped (the lease runs out).
        self.service.grant_index.clear();
        let conf_state = snapshot.get_metadata().get_conf_state().clone();
        self.consensus.raw.mut_store().install_snapshot(snapshot);
        self.conf_changed(&conf_state);
        self.stats.snapshots_installed += 1;
        self.service.restore_leases();
        self.service.out.applied.push((index, AppliedEvent::Restored));
        Ok(())
    }

    fn apply_entries(&mut self, entries: Vec<Entry>) -> Result<(), FatalError> {
        for entry in entries {
            match entry.get_entry_type() {
                EntryType::EntryNormal if entry.data.is_empty() => {}
                EntryType::EntryNormal => self.apply_commands(&entry),
                // Never proposed; refused by the gate. Skipped alike everywhere.
                EntryType::EntryConfChange => {
                    warn!(self.logger, "skipping a version-1 conf change"; "index" => entry.index)
                }
                EntryType::EntryConfChangeV2 => self.apply_conf_change_v2(&entry)?,
            }
            self.stats.entries_applied += 1;
            self.service.table_index = entry.index;
            if self.service.table.level() > LEVEL {
                return Err(FatalError::TooOld { level: self.service.table.level() });
            }
            if !self.service.leader_ready
                && self.consensus.raw.raft.state == StateRole::Leader
                && entry.term == self.consensus.raw.raft.term
            {
                self.service.leader_ready = true;
                info!(self.logger, "leader ready"; "term" => entry.term, "index" => entry.index);
                self.effects.roles.push(RoleChange::LeaderReady { term: entry.term });
                if self.service.table.cluster_id().is_none() {
                    // A new cluster (or one from before cluster ids): name
                    // it. Should an earlier leader's name be in the log
                    // still unapplied, that one stays and this one is moot.
                    let id = self.service.internal_id();
                    let cluster_id = self.config.cluster_id;
                    info!(self.logger, "founding the cluster";
                        "cluster_id" => %cluster_id, "token_floor" => self.config.token_floor);
                    let token_floor = self.config.token_floor;
                    let level = self.config.founding_level;
                    let bootstrap = Command::Bootstrap { cluster_id, token_floor, level };
                    // Before the requests that waited for this leader to
                    // be ready: none of their grants may go below the floor.
                    // Taken even at the cap of pending requests: it is one.
                    self.service.requests.insert_first(id, Pending::new(vec![bootstrap], true, None, None));
                }
            }
        }
        Ok(())
    }

    /// Applies one entry's command batch and routes its results.
    fn apply_commands(&mut self, entry: &Entry) {
        let tags = pb::EntryTags::parse_from_bytes(&entry.context);
        let proposer = tags.as_ref().ok().map(|tags| NodeId(tags.proposer)).filter(|id| id.0 != 0);
        // Only the proposer answers the entry's requests (below), and only
        // it needs their Grants' keys.
        let answers = tags.as_ref().is_ok_and(|tags| tags.proposer == self.id.0);
        // Each result, with the key of the command when it was a Grant
        // (kept when this node answers).
        let mut grant_keys: Vec<Option<Key>> = Vec::new();
        let results: Vec<ApplyResult> = match decode_batch(&entry.data) {
            Err(reason) => vec![ApplyResult::Invalid { reason }],
            Ok(commands) => commands
                .into_iter()
                .map(|command| match command {
                    Ok(command) => {
                        if answers {
                            grant_keys.push(match &command {
                                Command::Grant { key, .. } | Command::GrantShared { key, .. } => {
                                    Some(key.clone())
                                }
                                _ => None,
                            });
                        }
                        self.service.apply_command(command, proposer, entry.index)
                    }
                    Err(reason) => {
                        if answers {
                            grant_keys.push(None);
                        }
                        ApplyResult::Invalid { reason }
                    }
                })
                .collect(),
        };
        let Ok(tags) = tags else {
            warn!(self.logger, "entry context does not decode"; "index" => entry.index);
            return;
        };
        if tags.proposer != self.id.0 {
            return;
        }
        let mut offset = 0usize;
        for tag in tags.requests.iter() {
            let end = offset.saturating_add(tag.commands as usize);
            let id = RequestId(tag.request_id);
            let ours = self
                .service
                .requests
                .get(id)
                .is_some_and(|pending| pending.proposed_term == Some(entry.term));
            if ours {
                let reply = match results.get(offset..end) {
                    Some(slice) => {
                        // An entry whose data did not decode has one result
                        // and no grant keys: nothing to zip, no panic.
                        let keys = grant_keys.get(offset..end).unwrap_or_default();
                        for (key, result) in keys.iter().zip(slice) {
                            // A re-grant (`existing`) names a lock whose
                            // token someone was told before, or was asked
                            // for again: never a ghost's.
                            if let (Some(key), ApplyResult::Granted { token, existing: false, .. }) =
                                (key, result)
                            {
                                let grant = GrantRef { key: key.clone(), token: *token, index: entry.index };
                                self.service.out.grants.push((id, grant));
                            }
                        }
                        Ok(Response::Applied(slice.to_vec()))
                    }
                    // Tags that do not match the batch: the entry is corrupt.
                    None => Err(RequestError::Dropped),
                };
                self.service.finish(id, reply);
            }
            offset = end;
        }
    }

    /// Answers `query` from the applied table at once, on any node. Not
    /// linearizable: a follower may be behind, and a deposed leader too.
    pub fn read_local(&self, query: Query) -> Response {
        self.answer(query)
    }

    fn answer(&self, query: Query) -> Response {
        match query {
            Query::Holder(key) => match self.service.table.shared(key.as_bytes()) {
                Some(shared) => Response::Holders(self.service.shared_holders(&key, shared).collect()),
                None => Response::Holder(
                    self.service.table.holder(key.as_bytes()).map(|lock| self.service.held(&key, lock)),
                ),
            },
            Query::Check { key, token } => Response::Check(self.service.table.holds(key.as_bytes(), token)),
            Query::List { prefix, limit } => {
                // Plain locks and shared holders, merged in key order.
                let mut plain = self.service.table.list(&prefix, limit).peekable();
                let mut shared = self.service.table.list_shared(&prefix, limit).peekable();
                let mut listed = Vec::new();
                while listed.len() < limit {
                    let take_plain = match (plain.peek(), shared.peek()) {
                        (Some((a, _)), Some((b, _))) => a < b,
                        (Some(_), None) => true,
                        (None, Some(_)) => false,
                        (None, None) => break,
                    };
                    if take_plain {
                        if let Some((key, lock)) = plain.next() {
                            listed.push((key.clone(), self.service.held(key, lock)));
                        }
                    } else if let Some((key, held)) = shared.next() {
                        let room = limit - listed.len();
                        listed.extend(
                            self.service
                                .shared_holders(key, held)
                                .take(room)
                                .map(|holder| (key.clone(), holder)),
                        );
                    }
                }
                Response::List(listed)
            }
            Query::Table => Response::Table {
                table: Box::new(self.service.table.clone()),
                index: self.service.table_index,
            },
            Query::Members => self.members_response(),
        }
    }

    fn answer_reads(&mut self) {
        let applied = self.consensus.raw.raft.raft_log.applied;
        let (due, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.service.reads.at_index)
            .into_iter()
            .partition(|(index, _)| *index <= applied);
        self.service.reads.at_index = waiting;
        for (_, id) in due {
            if let Some(change) = self.service.reads.member_checks.remove(&id) {
                // Still the leader at the read's index, with every change
                // before it applied: the answer holds.
                self.change_members_checked(id, change, true);
                continue;
            }
            let Some(query) = self.service.reads.waiting.remove(&id) else {
                continue;
            };
            let response = self.answer(query);
            self.service.reply(id, Ok(response));
        }
    }

    /// Takes a snapshot and compacts the log every
    /// `snapshot_interval_entries` applied entries.
    /// Every `snapshot_interval_entries` applied entries, asks for a
    /// snapshot of the table ([`Effects::encode`]): a clone, which the shell
    /// encodes wherever it likes; one at a time.
    fn maybe_snapshot(&mut self) -> Result<(), FatalError> {
        let applied = self.consensus.raw.raft.raft_log.applied;
        let cache = self.consensus.raw.store();
        let due = applied >= cache.snapshot_index() + self.config.snapshot_interval_entries
            || self.consensus.snapshots.wanted && applied > cache.snapshot_index();
        if self.consensus.snapshots.encoding.is_some() || !due {
            return Ok(());
        }
        self.consensus.snapshots.wanted = false;
        // The table reflects `applied` exactly: entries apply only here.
        debug_assert_eq!(self.service.table_index, applied);
        let term = raft::Storage::term(cache, applied)?;
        self.consensus.snapshots.encoding = Some((applied, term));
        self.effects.encode = Some(SnapshotJob { index: applied, table: self.service.table.clone() });
        Ok(())
    }

    /// The snapshot asked for at `index` ([`Effects::encode`]) is encoded:
    /// it is stored, and the log before it compacted. One that a newer
    /// snapshot (installed from the leader meanwhile) has overtaken is
    /// dropped.
    pub fn on_snapshot_encoded(&mut self, index: u64, data: Vec<u8>) {
        let Some((asked, term)) = self.consensus.snapshots.encoding.take_if(|(asked, _)| *asked == index)
        else {
            debug!(self.logger, "dropping a snapshot that was not asked for"; "index" => index);
            return;
        };
        let cache = self.consensus.raw.store();
        if asked <= cache.snapshot_index() {
            debug!(self.logger, "dropping a snapshot overtaken by a newer one"; "index" => asked);
            return;
        }
        let mut snapshot = Snapshot::default();
        snapshot.set_data(data.into());
        let metadata = snapshot.mut_metadata();
        metadata.index = asked;
        metadata.term = term;
        metadata.set_conf_state(cache.conf_state().clone());
        // The stored commit must never fall behind the snapshot, or a restart
        // would find its hard state out of range.
        let mut hard_state = cache.hard_state().clone();
        hard_state.commit = hard_state.commit.max(asked);
        self.write(WriteBatch {
            snapshot: Some(snapshot.clone()),
            install: false,
            hard_state: Some(hard_state),
            ..Default::default()
        });
        self.stats.snapshots_taken += 1;
        debug!(self.logger, "snapshot taken"; "index" => asked, "term" => term, "bytes" => snapshot.get_data().len());
        self.consensus.raw.mut_store().compact(snapshot);
    }
}

/// The count of writes asked for and reported durable.
/// Commands and their request tags, on their way into one log entry.
#[derive(Debug, Default)]
struct Batch {
    commands: Vec<Command>,
    tags: Vec<pb::RequestTag>,
}

fn read_request_id(context: &[u8]) -> RequestId {
    let mut bytes = [0u8; 8];
    let n = context.len().min(8);
    bytes[..n].copy_from_slice(&context[..n]);
    RequestId(u64::from_le_bytes(bytes))
}

/// The ids, each once, in order.
fn sorted<'a>(ids: impl Iterator<Item = &'a u64>) -> Vec<u64> {
    ids.copied().collect::<BTreeSet<u64>>().into_iter().collect()
}
