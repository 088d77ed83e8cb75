//! Below the log: raft-rs and what it needs around it. The raw node, the
//! order in which writes become durable and the messages that wait for
//! them, snapshots sent and received, the membership record and the rejoin
//! floor, the gate's refusals, transfers and configuration changes: the
//! [`Consensus`] state, and the replica's methods that step peer messages,
//! tick, hand out a `Ready`'s writes and messages, and take snapshots.
//! Nothing here decides about locks: committed entries go to the replica's
//! apply, and from there to the lock service.

use std::collections::VecDeque;

use super::*;

use fencelock_fsm::LockTable;
use raft::prelude::Message;
use raft::{RawNode, StateRole};

use super::membership::Transfer;
use crate::gate::RefusalLog;
use crate::log::{LogCache, Write, WriteBatch};
use crate::rejoin::{Floor, Membership};
use crate::types::{NodeId, RequestId};

/// Consensus: raft-rs's node and its bookkeeping.
pub(crate) struct Consensus {
    pub(crate) raw: RawNode<LogCache>,
    pub(crate) persist: Persistence,
    pub(crate) snapshots: Snapshots,
    /// The role, term and leader last reported, to notice changes.
    pub(crate) reported: (StateRole, u64, u64),
    /// The peers it has had messages from, and its rejoin floor, if any.
    pub(crate) membership: Membership,
    /// A peer was heard from for the first time: the membership record
    /// goes into the next write, and nothing leaves before that write.
    pub(crate) membership_dirty: bool,
    /// Set while a node that lost its data rejoins: it neither votes nor
    /// campaigns until it has caught up past the floor.
    pub(crate) abstaining: Option<Floor>,
    pub(crate) refusal_log: RefusalLog,
    /// The membership change this leader proposed and has not applied.
    pub(crate) member_request: Option<RequestId>,
    /// The leadership transfer waiting for its answer.
    pub(crate) transfer: Option<Transfer>,
    /// The nodes the gate takes raft messages from
    /// ([`super::membership::peers_of`]).
    pub(crate) peers: Vec<NodeId>,
    /// Bumped at every configuration change.
    pub(crate) conf_version: u64,
    /// This node applied its own removal, at this index, written by this
    /// write: it stops once that write is durable.
    pub(crate) removed: Option<(u64, u64)>,
    /// The term and index of each entry this node proposed while it leads,
    /// oldest first, until it applies: where a leader's proposals are
    /// numbered, to assert where they apply that they do in that order.
    pub(crate) proposed: VecDeque<(u64, u64)>,
}

/// The order of writes: what was asked, what is durable, and what waits
/// for it.
#[derive(Default)]
pub(crate) struct Persistence {
    pub(crate) disk: Disk,
    /// Readies handed to raft with `advance_append_async` whose write is
    /// not yet durable, oldest first.
    pub(crate) unpersisted: VecDeque<Unpersisted>,
    /// Votes and acknowledgements waiting until the count of durable writes
    /// reaches the first number.
    pub(crate) held: VecDeque<(u64, Vec<Message>)>,
    /// The number of the write of the last membership record: until it is
    /// durable, nothing leaves early.
    pub(crate) membership_written_at: u64,
}

/// Snapshots on their way out and in.
#[derive(Default)]
pub(crate) struct Snapshots {
    /// Peers that were sent a snapshot in this turn.
    pub(crate) sent: Vec<u64>,
    /// The snapshot being encoded ([`super::Effects::encode`]): its index
    /// and term.
    pub(crate) encoding: Option<(u64, u64)>,
    /// The table of a snapshot message that passed the gate, decoded once,
    /// for its install: the snapshot's index and term, and the table.
    pub(crate) decoded: Option<(u64, u64, LockTable)>,
    /// A snapshot is wanted before the interval is up (a new member must
    /// start from one: the initial configuration is in no log entry).
    pub(crate) wanted: bool,
}

impl Consensus {
    /// Proposes an entry (its context and data) as the leader, and numbers
    /// it: its term and index, which rise (asserted here), and which
    /// `Replica::applied_in_proposal_order` checks where it applies.
    pub(crate) fn propose_numbered(&mut self, context: Vec<u8>, data: Vec<u8>) -> Result<(), String> {
        self.raw.propose(context, data).map_err(|err| err.to_string())?;
        // Appended at once: its index is the log's last.
        let (term, index) = (self.raw.raft.term, self.raw.raft.raft_log.last_index());
        if let Some(&(last_term, last_index)) = self.proposed.back() {
            assert!(
                (last_term, last_index) < (term, index),
                "a leader's proposals are numbered in order: ({term}, {index}) after ({last_term}, {last_index})"
            );
        }
        self.proposed.push_back((term, index));
        Ok(())
    }
}

/// The writes asked of the store, counted: the store reports them durable
/// by count, in order.
#[derive(Debug, Default)]
pub(crate) struct Disk {
    /// Writes asked for since open; the last one's number.
    pub(crate) submitted: u64,
    /// Of those, how many are durable (reported with `on_persisted`).
    pub(crate) durable: u64,
    /// Of those, how many asked for a sync.
    pub(crate) syncs: u64,
}

impl Disk {
    /// Numbers the next write.
    pub(crate) fn write(&mut self, batch: WriteBatch, urgent: bool) -> Write {
        self.submitted += 1;
        if !batch.may_defer_sync {
            self.syncs += 1;
        }
        Write { n: self.submitted, batch, urgent }
    }
}

/// A ready whose write is not yet durable.
#[derive(Debug)]
pub(crate) struct Unpersisted {
    /// The number of the write it waits for.
    pub(crate) write: u64,
    /// raft-rs's number of the ready.
    pub(crate) number: u64,
    /// The index of the snapshot it installed: applied once persisted.
    pub(crate) snapshot_index: Option<u64>,
}

impl Replica {
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

    pub(super) fn refuse(&mut self, message: &Message, reason: gate::Refusal) {
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
    pub(super) fn step_gated(&mut self, message: Message, table: Option<&LockTable>) -> bool {
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
    pub(super) fn append_rejection(&self, message: &Message, index: u64, hint: u64) -> Message {
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
    pub(super) fn restart_replication(&mut self, message: &Message) -> bool {
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

    pub(super) fn step_checked(&mut self, message: Message) {
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
    pub(super) fn snapshot_unapplied(&self) -> bool {
        self.consensus.raw.raft.raft_log.applied < self.consensus.raw.store().snapshot_index()
    }

    /// Sets the election timeout raft-rs drew at its last reset (a role or
    /// term change) to `ticks`, clamped into the configured window: for a
    /// deterministic simulation, which draws it from its seed instead of
    /// raft-rs's unseeded generator.
    pub(crate) fn pin_election_timeout(&mut self, ticks: usize) {
        // raft-rs's window: [election_ticks, max), max twice the minimum
        // unless configured.
        let min = self.config.raft.election_ticks;
        let max = self.config.raft.election_ticks_max.unwrap_or(2 * min);
        if max > min {
            self.consensus.raw.raft.set_randomized_election_timeout(ticks.clamp(min, max - 1));
        }
    }

    /// This node's raft term and last log index, for its hellos.
    /// What this node's hellos say: its term, last index, the peers it
    /// has heard from, whether it has applied a cluster id, and its
    /// configuration's voters with the index it has applied.
    pub(crate) fn hello_state(&self) -> fencelock_types::hello::HelloState {
        let raft = &self.consensus.raw.raft;
        let mut voters = raft.prs().conf().to_conf_state().voters;
        voters.sort_unstable();
        fencelock_types::hello::HelloState {
            term: raft.term,
            last_index: raft.raft_log.last_index(),
            known: self.consensus.membership.known.clone(),
            named: self.service.table.cluster_id().is_some(),
            voters,
            applied: self.service.table_index,
        }
    }

    /// Ends a rejoin once this node caught up past its floor (see
    /// [`crate::rejoin`]); says so at info when `news` (not at a start
    /// whose kept floor was passed long ago).
    pub(super) fn check_rejoined(&mut self, news: bool) {
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
    pub(super) fn release_persisted(&mut self) {
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

    /// Asks for a write; a follower's is urgent (it is on the path of
    /// every commit), a leader's runs in parallel with its followers'.
    pub(super) fn write(&mut self, batch: WriteBatch) {
        // A follower's writes may be made at once on its own thread, when
        // the disk is idle; never one with a snapshot, which may be large.
        let urgent = self.consensus.raw.raft.state != StateRole::Leader && batch.snapshot.is_none();
        let write = self.consensus.persist.disk.write(batch, urgent);
        self.effects.writes.push(write);
    }

    pub(super) fn handle_ready(&mut self) -> Result<(), FatalError> {
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

    pub(super) fn send(&mut self, messages: Vec<Message>) {
        self.note_snapshots_sent(&messages);
        self.effects.messages.extend(messages);
    }

    pub(super) fn note_snapshots_sent(&mut self, messages: &[Message]) {
        for message in messages {
            if message.get_msg_type() == MessageType::MsgSnapshot {
                self.consensus.snapshots.sent.push(message.to);
            }
        }
    }

    pub(super) fn install_snapshot(&mut self, snapshot: Snapshot) -> Result<(), FatalError> {
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

    /// Takes a snapshot and compacts the log every
    /// `snapshot_interval_entries` applied entries.
    /// Every `snapshot_interval_entries` applied entries, asks for a
    /// snapshot of the table ([`Effects::encode`]): a clone, which the shell
    /// encodes wherever it likes; one at a time.
    pub(super) fn maybe_snapshot(&mut self) -> Result<(), FatalError> {
        let applied = self.consensus.raw.raft.raft_log.applied;
        let cache = self.consensus.raw.store();
        let due = applied >= cache.snapshot_index() + self.config.raft.snapshot_interval_entries
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

    /// Reports role changes, and fails every pending request when this node
    /// stops being the leader of the term it was leading.
    pub(super) fn notice_role_change(&mut self) {
        let raft = &self.consensus.raw.raft;
        let now = (raft.state, raft.term, raft.leader_id);
        if now == self.consensus.reported {
            return;
        }
        let (was_state, was_term, _) = self.consensus.reported;
        self.consensus.reported = now;
        let (state, term, _) = now;
        if was_state == StateRole::Leader && (state != StateRole::Leader || term != was_term) {
            self.consensus.proposed.clear();
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
}
