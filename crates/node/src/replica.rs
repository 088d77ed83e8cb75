//! The sans-IO driver core: one raft-rs `RawNode`, the lock table it applies
//! to, and the bookkeeping that routes results back to requests.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use fencelock_fsm::LockTable;
use fencelock_types::{
    decode_batch, encode_owned_batch, pb, ApplyResult, ClusterId, Command, FencingToken, Key, LeaseMs, Owner,
    Value, LEVEL,
};
use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, EntryType, Message, MessageType, Snapshot};
use raft::{RawNode, SnapshotStatus, StateRole};
use slog::{debug, info, warn, Logger};

#[path = "batch.rs"]
mod batch;
#[path = "consensus.rs"]
mod consensus;
#[path = "membership.rs"]
mod membership;
#[path = "service.rs"]
mod service;
#[path = "status.rs"]
mod status;

use consensus::{Consensus, Disk, Persistence, Snapshots};
pub use membership::{PROMOTE_LAG_MAX, TRANSFER_WAIT_MS};
use service::{admits, repeats_a_grant, LockService};
pub use status::{ConfView, LogProgress, NodeStatus, Role};

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
    /// The tags of the entry being applied: a buffer kept between entries.
    entry_tags: pb::EntryTags,
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
        if recovered.conf_state.is_none() && !config.founding.joining {
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
            LockTable::restore(recovered.snapshot.get_data()).map_err(|error| {
                match &recovered.snapshot_file {
                    Some(file) => FatalError::StoredSnapshot { file: file.clone(), error },
                    None => FatalError::Snapshot(error),
                }
            })?
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
            election_tick: config.raft.election_ticks,
            heartbeat_tick: config.raft.heartbeat_ticks,
            // Entries after the snapshot are applied again: the table was
            // rebuilt from the snapshot alone.
            applied: snapshot_index,
            max_size_per_msg: config.raft.max_size_per_msg_bytes,
            max_inflight_msgs: config.raft.max_inflight_msgs,
            check_quorum: true,
            pre_vote: true,
            read_only_option: raft::ReadOnlyOption::Safe,
            ..Default::default()
        };
        if let Some(max) = config.raft.election_ticks_max {
            raft_config.min_election_tick = config.raft.election_ticks;
            raft_config.max_election_tick = max;
        }
        raft_config.validate()?;
        let raw = RawNode::new(&raft_config, cache, &logger)?;
        let reported = (raw.raft.state, raw.raft.term, raw.raft.leader_id);
        let (watch_history_bytes_max, watches_max, watches_per_connection_max) = (
            config.limits.watch_history_bytes_max,
            config.limits.watches_max,
            config.limits.watches_per_connection_max,
        );
        let watches =
            Watches::new(snapshot_index, watch_history_bytes_max, watches_max, watches_per_connection_max);
        let config = Arc::new(config);
        let service = LockService::new(Arc::clone(&config), logger.clone(), table, snapshot_index, watches);
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
                proposed: VecDeque::new(),
            },
            service,
            effects: Outgoing { writes: first_writes, ..Outgoing::default() },
            stats: Stats::default(),
            entry_tags: pb::EntryTags::default(),
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
        if self.consensus.raw.raft.state == StateRole::Leader && self.service.leader_ready {
            // The service's next batch, proposed as this term's leader.
            self.service.propose_expiries();
            let consensus = &mut self.consensus;
            let term = consensus.raw.raft.term;
            let mut propose = |context, data| consensus.propose_numbered(context, data);
            let mut leader = batch::Proposer { id: self.id, term, propose: &mut propose };
            self.service.propose_ready_requests(&mut leader);
        }
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

    /// The counters: consensus's (readies, entries applied, snapshots,
    /// refusals, and the disk's writes and syncs) and the service's
    /// (proposals, and changes applied by kind). Every field is named
    /// here, so that a new counter is given its owner.
    pub fn stats(&self) -> Stats {
        let (ours, served) = (&self.stats, &self.service.out.stats);
        Stats {
            requests_proposed: served.requests_proposed,
            commands_proposed: served.commands_proposed,
            entries_proposed: served.entries_proposed,
            writes: self.consensus.persist.disk.submitted,
            syncs: self.consensus.persist.disk.syncs,
            readies: ours.readies,
            entries_applied: ours.entries_applied,
            snapshots_taken: ours.snapshots_taken,
            snapshots_installed: ours.snapshots_installed,
            grants_applied: served.grants_applied,
            renewals_applied: served.renewals_applied,
            releases_applied: served.releases_applied,
            expiries_applied: served.expiries_applied,
            refused: ours.refused,
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
            log: LogProgress {
                commit_index: raft.raft_log.committed,
                applied_index: self.service.table_index,
                last_index: raft.raft_log.last_index(),
                snapshot_index: self.consensus.raw.store().snapshot_index(),
                snapshot_bytes: self.consensus.raw.store().last_snapshot().get_data().len() as u64,
            },
            locks: self.service.table.len(),
            last_token: self.service.table.last_token(),
            pending_requests: self.service.requests.clients() + self.service.reads.waiting.len(),
            rejoining: self.consensus.abstaining.is_some(),
            cluster_id: self.service.table.cluster_id(),
            conf: ConfView {
                voters: sorted(conf.voters.iter()),
                voters_outgoing: sorted(conf.voters_outgoing.iter()),
                learners: sorted(conf.learners.iter().chain(&conf.learners_next)),
                reachable: Vec::new(),
                waiting_for: Vec::new(),
            },
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
            self.service.requests.internal() >= self.config.limits.internal_pending_max
        } else {
            self.service.requests.clients() + self.service.reads.waiting.len()
                >= self.config.limits.pending_requests_max
                || acquire && self.service.requests.acquires() >= self.config.limits.pending_acquires_max
        };
        if full {
            return Err(RequestError::Overloaded);
        }
        Ok(())
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
                    let cluster_id = self.config.founding.cluster_id;
                    info!(self.logger, "founding the cluster";
                        "cluster_id" => %cluster_id, "token_floor" => self.config.founding.token_floor);
                    let token_floor = self.config.founding.token_floor;
                    let level = self.config.founding.founding_level;
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

    /// Asserts that `entry`, proposed by this node, applies in the order
    /// this node proposed its entries in (where they were numbered, in
    /// `run_ready`): within a term, the next one it proposed, none skipped
    /// or repeated. Entries of terms it no longer leads in are forgotten.
    fn applied_in_proposal_order(&mut self, entry: &Entry) {
        let proposed = &mut self.consensus.proposed;
        while proposed.front().is_some_and(|(term, _)| *term < entry.term) {
            proposed.pop_front();
        }
        if let Some(&(term, index)) = proposed.front() {
            if term == entry.term {
                assert_eq!(
                    index, entry.index,
                    "a leader's own entries of term {term} apply in the order it proposed them"
                );
                proposed.pop_front();
            }
        }
    }

    /// Applies one entry's command batch and routes its results.
    fn apply_commands(&mut self, entry: &Entry) {
        // Parsed into the buffer kept between entries: the tags of many
        // requests reuse its room (protobuf's repeated fields keep their
        // elements when cleared).
        let mut tags = std::mem::take(&mut self.entry_tags);
        protobuf::Clear::clear(&mut tags);
        let tags_decode = match tags_proposer(&entry.context) {
            // Another node's entry: its tags route answers, which only its
            // proposer gives, so the proposer is all this node reads.
            Ok(proposer) if proposer != self.id.0 => {
                tags.proposer = proposer;
                Ok(())
            }
            _ => tags.merge_from_bytes(&entry.context),
        };
        self.apply_tagged(entry, &tags, tags_decode);
        self.entry_tags = tags;
    }

    /// [`Replica::apply_commands`] with the entry's tags decoded (or not:
    /// `decoded`).
    fn apply_tagged(&mut self, entry: &Entry, tags: &pb::EntryTags, decoded: protobuf::ProtobufResult<()>) {
        let tags = decoded.map(|()| tags);
        let proposer = tags.as_ref().ok().map(|tags| NodeId(tags.proposer)).filter(|id| id.0 != 0);
        if proposer == Some(self.id) {
            self.applied_in_proposal_order(entry);
        }
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
                        let keys = grant_keys.get_mut(offset..end).unwrap_or_default();
                        for (key, result) in keys.iter_mut().zip(slice) {
                            // A re-grant (`existing`) names a lock whose
                            // token someone was told before, or was asked
                            // for again: never a ghost's.
                            if let (Some(key), ApplyResult::Granted { token, existing: false, .. }) =
                                (key.take(), result)
                            {
                                let grant = GrantRef { key, token: *token, index: entry.index };
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
}

/// The request id a ReadIndex's context carries: its first 8 bytes,
/// little-endian.
fn read_request_id(context: &[u8]) -> RequestId {
    let mut bytes = [0u8; 8];
    let n = context.len().min(8);
    bytes[..n].copy_from_slice(&context[..n]);
    RequestId(u64::from_le_bytes(bytes))
}

/// The proposer an entry's context (`EntryTags`) names, read without
/// decoding its request tags: field 1, the last one given as a full
/// decode takes it (0 when absent).
fn tags_proposer(context: &[u8]) -> protobuf::ProtobufResult<u64> {
    let mut input = protobuf::CodedInputStream::from_bytes(context);
    let mut proposer = 0;
    while !input.eof()? {
        let (field, wire_type) = input.read_tag_unpack()?;
        if field == 1 && wire_type == protobuf::wire_format::WireTypeVarint {
            proposer = input.read_uint64()?;
        } else if wire_type == protobuf::wire_format::WireTypeLengthDelimited {
            // A request's tag, passed over without copying it out.
            let len = input.read_raw_varint32()?;
            input.skip_raw_bytes(len)?;
        } else {
            input.skip_field(wire_type)?;
        }
    }
    Ok(proposer)
}

/// The ids, each once, in order.
fn sorted<'a>(ids: impl Iterator<Item = &'a u64>) -> Vec<u64> {
    ids.copied().collect::<BTreeSet<u64>>().into_iter().collect()
}

#[cfg(test)]
#[path = "replica_tests.rs"]
mod tests;
