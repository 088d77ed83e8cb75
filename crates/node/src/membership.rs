//! Membership changes on the replica: what a change request becomes (a
//! raft conf change, an answer at once, or a leadership hand-over first),
//! how a conf-change entry applies (raft's configuration, and the member
//! directory in the table), leadership transfers, and the peers the gate
//! takes messages from.
//!
//! One change is under way at a time, each a single raft-rs conf change:
//! a learner added, a learner promoted, a member removed. raft-rs applies
//! a change of one voter as a simple change, safe without a joint phase;
//! the apply path also takes joint configurations (raft-rs leaves them on
//! its own), should a snapshot or a later version bring one.
//!
//! A new member must start from a snapshot: the initial configuration is
//! in no log entry (each node of a new cluster writes it itself), so a
//! learner fed the log from its first entry would never learn the voters.
//! Every replica takes a snapshot when a member is added (the log before
//! it compacted), and a joining replica refuses appends until it has
//! installed one ([`Replica::refuse_append_while_joining`]).

use fencelock_fsm::MemberAddrs;
use fencelock_types::pb;
use protobuf::Message as _;
use raft::prelude::{ConfChangeSingle, ConfChangeType, ConfChangeV2, ConfState, Entry};
use raft::{ProgressState, StateRole};
use slog::{info, warn};

use super::Replica;
use crate::types::{FatalError, Member, MemberChange, MemberRole, NodeId, RequestError, RequestId, Response};

/// A learner is caught up, and may be promoted, once its log is within
/// this many entries of the leader's.
pub const PROMOTE_LAG_MAX: u64 = 1_000;

/// How long a leadership transfer may take before it is answered failed,
/// on the leader's clock.
pub const TRANSFER_WAIT_MS: u64 = 10_000;

/// A leadership transfer waiting for its answer.
#[derive(Debug)]
pub(super) struct Transfer {
    pub id: RequestId,
    pub to: NodeId,
    pub until_ms: u64,
}

/// What a change request becomes.
enum Plan {
    /// Nothing to change (a retry of one that applied): answer the
    /// membership as it is.
    Done,
    /// The leader itself is to be removed: leadership goes first.
    HandOver(NodeId),
    Propose(ConfChangeSingle, Vec<pb::MemberRecord>),
}

impl Replica {
    /// Accepts a membership change. The answer (the membership after it)
    /// comes once its entry applied here, or at once when it is refused or
    /// there is nothing to change.
    pub fn change_members(&mut self, id: RequestId, change: MemberChange) {
        self.change_members_checked(id, change, false);
    }

    /// [`Replica::change_members`]; `confirmed`: a ReadIndex has shown that
    /// this node led when the request's answer was decided. An answer that
    /// does not go through the log (done already, or refused by the
    /// configuration) waits for that: a leader deposed without knowing it
    /// (paused, cut off) would answer from an old configuration, say
    /// "not a member" of a node the new leader added.
    pub(super) fn change_members_checked(&mut self, id: RequestId, change: MemberChange, confirmed: bool) {
        let plan = self.plan(&change);
        let without_log = matches!(plan, Ok(Plan::Done) | Err(RequestError::BadMemberChange(_)));
        if without_log && !confirmed {
            self.service.reads.member_checks.insert(id, change);
            self.consensus.raw.read_index(id.0.to_le_bytes().to_vec());
            return;
        }
        let plan = match plan {
            Ok(plan) => plan,
            Err(err) => {
                self.service.reply(id, Err(err));
                return;
            }
        };
        match plan {
            Plan::Done => {
                let response = self.members_response();
                self.service.reply(id, Ok(response));
            }
            Plan::HandOver(to) => {
                info!(self.logger, "removing the leader: handing leadership over first"; "to" => to.0);
                self.consensus.raw.transfer_leader(to.0);
                self.service.reply(id, Err(RequestError::NotLeader { leader_hint: Some(to) }));
            }
            Plan::Propose(single, members) => {
                let (kind, node) = (single.get_change_type(), single.node_id);
                let mut change = ConfChangeV2::default();
                change.set_changes(vec![single].into());
                let context = pb::ConfChangeContext {
                    tags: protobuf::SingularPtrField::some(pb::EntryTags {
                        proposer: self.id.0,
                        requests: vec![pb::RequestTag {
                            request_id: id.0,
                            commands: 0,
                            ..Default::default()
                        }]
                        .into(),
                        ..Default::default()
                    }),
                    members: members.into(),
                    ..Default::default()
                };
                let context = context.write_to_bytes().unwrap_or_default();
                match self.consensus.raw.propose_conf_change(context, change) {
                    Ok(()) => {
                        info!(self.logger, "membership change proposed"; "change" => ?kind, "node" => node);
                        self.consensus.member_request = Some(id);
                    }
                    Err(err) => {
                        warn!(self.logger, "raft refused a membership change"; "error" => %err);
                        self.service.reply(id, Err(RequestError::Dropped));
                    }
                }
            }
        }
    }

    fn plan(&self, change: &MemberChange) -> Result<Plan, RequestError> {
        if self.consensus.raw.raft.state != StateRole::Leader || !self.service.leader_ready {
            return Err(RequestError::NotLeader { leader_hint: self.leader_hint() });
        }
        let busy = |why: String| Err(RequestError::MemberChangeBusy(why));
        let bad = |why: String| Err(RequestError::BadMemberChange(why));
        if self.consensus.member_request.is_some() || self.consensus.raw.raft.has_pending_conf() {
            return busy("a membership change is under way; try again once it has applied".into());
        }
        let conf = self.consensus.raw.raft.prs().conf().to_conf_state();
        if !conf.voters_outgoing.is_empty() {
            return busy("the cluster is leaving a joint configuration; try again in a moment".into());
        }
        let is_voter = |id: NodeId| conf.voters.contains(&id.0);
        let is_learner = |id: NodeId| conf.learners.contains(&id.0);
        match change {
            MemberChange::AddLearner { id, peer_addr, client_addr, known } => {
                if id.0 == 0 {
                    return bad("node id 0 is reserved".into());
                }
                let addrs = MemberAddrs { peer_addr: peer_addr.clone(), client_addr: client_addr.clone() };
                if is_voter(*id) || is_learner(*id) {
                    // A retry of the add that applied is answered as done.
                    return match self.service.table.member(id.0) {
                        Some(known) if *known == addrs => Ok(Plan::Done),
                        _ => bad(format!(
                            "node {} is a member already{}; remove it first, or add the new node under a new id",
                            id.0,
                            self.service.table
                                .member(id.0)
                                .map(|known| format!(" (peer {}, client {})", known.peer_addr, known.client_addr))
                                .unwrap_or_default()
                        )),
                    };
                }
                let taken = self.service.table.members().find(|(other, known)| {
                    (is_voter(NodeId(*other)) || is_learner(NodeId(*other)))
                        && known.peer_addr == addrs.peer_addr
                });
                if let Some((other, _)) = taken {
                    return bad(format!("peer address {} is member {other}'s", addrs.peer_addr));
                }
                let record = pb::MemberRecord {
                    id: id.0,
                    peer_addr: addrs.peer_addr,
                    client_addr: addrs.client_addr,
                    ..Default::default()
                };
                let mut records = vec![record];
                for (other, addrs) in known {
                    let member = is_voter(*other) || is_learner(*other);
                    let named = self.service.table.member(other.0).is_some();
                    let complete = !addrs.peer_addr.is_empty() && !addrs.client_addr.is_empty();
                    if member
                        && !named
                        && complete
                        && *other != *id
                        && records.len() < crate::gate::MEMBERS_MAX
                    {
                        records.push(pb::MemberRecord {
                            id: other.0,
                            peer_addr: addrs.peer_addr.clone(),
                            client_addr: addrs.client_addr.clone(),
                            ..Default::default()
                        });
                    }
                }
                Ok(Plan::Propose(single(id.0, ConfChangeType::AddLearnerNode), records))
            }
            MemberChange::Promote(id) => {
                if is_voter(*id) {
                    return Ok(Plan::Done);
                }
                if !is_learner(*id) {
                    return bad(format!("node {} is not a member; add it first", id.0));
                }
                let last_index = self.consensus.raw.raft.raft_log.last_index();
                let progress = self.consensus.raw.raft.prs().get(id.0);
                let matched = progress.map_or(0, |progress| progress.matched);
                let replicating = progress.is_some_and(|progress| progress.state == ProgressState::Replicate);
                if !replicating || matched.saturating_add(PROMOTE_LAG_MAX) < last_index {
                    return busy(format!(
                        "learner {} has not caught up yet: it holds the log up to index {matched} of {last_index}; \
                         promote it once it has",
                        id.0
                    ));
                }
                let mut voters = conf.voters.clone();
                voters.push(id.0);
                self.check_quorum_after(&voters)?;
                Ok(Plan::Propose(single(id.0, ConfChangeType::AddNode), Vec::new()))
            }
            MemberChange::Remove(id) => {
                if !is_voter(*id) && !is_learner(*id) {
                    // Gone already: a retry of the removal that applied.
                    return Ok(Plan::Done);
                }
                if is_voter(*id) {
                    let voters: Vec<u64> =
                        conf.voters.iter().copied().filter(|voter| *voter != id.0).collect();
                    if voters.is_empty() {
                        return bad(format!("node {} is the last voter", id.0));
                    }
                    self.check_quorum_after(&voters)?;
                    if *id == self.id {
                        // The most caught-up other voter takes over.
                        return match self.most_caught_up(&voters, false) {
                            Some(to) => Ok(Plan::HandOver(to)),
                            None => bad(format!("node {} is the last voter", id.0)),
                        };
                    }
                }
                Ok(Plan::Propose(single(id.0, ConfChangeType::RemoveNode), Vec::new()))
            }
        }
    }

    /// Refuses a change after which the voters this leader heard from
    /// recently (itself included) would not be a majority: the cluster
    /// would stop committing, the change included.
    fn check_quorum_after(&self, voters: &[u64]) -> Result<(), RequestError> {
        let prs = self.consensus.raw.raft.prs();
        let active = voters
            .iter()
            .filter(|voter| {
                **voter == self.id.0 || prs.get(**voter).is_some_and(|progress| progress.recent_active)
            })
            .count();
        if active <= voters.len() / 2 {
            return Err(RequestError::BadMemberChange(format!(
                "after this change only {active} of the {} voters would be reachable, not a majority: the cluster \
                 would stop; bring members back first",
                voters.len()
            )));
        }
        Ok(())
    }

    /// On a graceful stop: if this node leads, hands leadership to the most
    /// caught-up other voter it heard from recently, and returns it, so
    /// that the cluster does not wait an election timeout for a leader.
    /// `None` when it does not lead or no other voter is reachable.
    pub fn hand_off(&mut self) -> Option<NodeId> {
        if self.consensus.raw.raft.state != StateRole::Leader {
            return None;
        }
        let others: Vec<u64> = self
            .consensus
            .raw
            .raft
            .prs()
            .conf()
            .voters()
            .ids()
            .iter()
            .filter(|voter| *voter != self.id.0)
            .collect();
        let to = self.most_caught_up(&others, true)?;
        info!(self.logger, "stopping: handing leadership over"; "to" => to.0);
        self.consensus.raw.transfer_leader(to.0);
        Some(to)
    }

    /// The voter among `voters` whose log matches this leader's furthest
    /// (of equals, the last); with `reachable_only`, among those it heard
    /// from recently.
    fn most_caught_up(&self, voters: &[u64], reachable_only: bool) -> Option<NodeId> {
        let prs = self.consensus.raw.raft.prs();
        voters
            .iter()
            .filter(|voter| {
                !reachable_only || prs.get(**voter).is_some_and(|progress| progress.recent_active)
            })
            .max_by_key(|voter| prs.get(**voter).map_or(0, |progress| progress.matched))
            .map(|voter| NodeId(*voter))
    }

    /// Hands leadership to voter `to`; answered when this node sees `to`
    /// lead, or failed after [`TRANSFER_WAIT_MS`].
    pub fn transfer(&mut self, id: RequestId, to: NodeId) {
        if self.consensus.raw.raft.state != StateRole::Leader {
            self.service.reply(id, Err(RequestError::NotLeader { leader_hint: self.leader_hint() }));
            return;
        }
        if to == self.id {
            self.service.reply(id, Ok(Response::Transferred { leader: to }));
            return;
        }
        if !self.consensus.raw.raft.prs().conf().voters().contains(to.0) {
            self.service
                .reply(id, Err(RequestError::BadMemberChange(format!("node {} is not a voter", to.0))));
            return;
        }
        if let Some(earlier) = self.consensus.transfer.take() {
            self.service.reply(
                earlier.id,
                Err(RequestError::TransferFailed("another transfer was asked for".into())),
            );
        }
        info!(self.logger, "transferring leadership"; "to" => to.0);
        self.consensus.raw.transfer_leader(to.0);
        self.consensus.transfer =
            Some(Transfer { id, to, until_ms: self.service.now_ms.saturating_add(TRANSFER_WAIT_MS) });
    }

    /// Answers the transfer once this node knows who leads now (done if
    /// it is the target), or once its time is up.
    pub(super) fn check_transfer(&mut self) {
        let Some(transfer) = &self.consensus.transfer else { return };
        let leader = match self.consensus.raw.raft.state {
            StateRole::Leader => None,
            _ => self.leader_hint(),
        };
        let reply = match leader {
            Some(leader) if leader == transfer.to => Ok(Response::Transferred { leader }),
            Some(leader) => Err(RequestError::TransferFailed(format!(
                "node {} took over instead of node {}",
                leader.0, transfer.to.0
            ))),
            None if self.service.now_ms >= transfer.until_ms => Err(RequestError::TransferFailed(format!(
                "node {} did not take over within {} ms (is it caught up and reachable?)",
                transfer.to.0, TRANSFER_WAIT_MS
            ))),
            None => return,
        };
        if let Some(transfer) = self.consensus.transfer.take() {
            self.service.reply(transfer.id, reply);
        }
    }

    /// On losing leadership: answers the membership change in flight (its
    /// outcome unknown). A transfer waits to learn the new leader.
    pub(super) fn fail_member_requests(&mut self) {
        let leader_hint = self.leader_hint();
        if let Some(id) = self.consensus.member_request.take() {
            self.service.reply(id, Err(RequestError::LeadershipLost { leader_hint }));
        }
        for id in std::mem::take(&mut self.service.reads.member_checks).into_keys() {
            self.service.reply(id, Err(RequestError::NotLeader { leader_hint }));
        }
    }

    /// Applies a conf-change entry: raft's configuration, then the member
    /// directory from its context. One that does not decode, or that raft
    /// refuses, changes nothing, alike on every replica.
    pub(super) fn apply_conf_change_v2(&mut self, entry: &Entry) -> Result<(), FatalError> {
        let mut change = ConfChangeV2::default();
        if let Err(err) = change.merge_from_bytes(&entry.data) {
            warn!(self.logger, "undecodable conf change"; "index" => entry.index, "error" => %err);
            return Ok(());
        }
        // raft-rs's own entry to leave a joint configuration has none.
        let context = match entry.context.is_empty() {
            true => pb::ConfChangeContext::default(),
            false => pb::ConfChangeContext::parse_from_bytes(&entry.context).unwrap_or_default(),
        };
        let ours = context.get_tags().proposer == self.id.0;
        let request = context.get_tags().get_requests().first().map(|tag| RequestId(tag.request_id));
        let applied = self.consensus.raw.apply_conf_change(&change);
        match applied {
            Ok(conf_state) => {
                for single in change.get_changes() {
                    match single.get_change_type() {
                        ConfChangeType::RemoveNode => self.service.table.remove_member(single.node_id),
                        // A new member starts from a snapshot that holds it
                        // (raft-rs ignores one that does not): one taken
                        // now, with the log before it compacted.
                        ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                            self.consensus.snapshots.wanted = true
                        }
                    }
                }
                // The addresses the change names, of the members it left in
                // the configuration: the one added, and the others' as the
                // proposer knew them.
                for record in context.get_members() {
                    let addr_ok =
                        |addr: &str| !addr.is_empty() && addr.len() <= fencelock_fsm::MEMBER_ADDR_MAX;
                    if holds(&conf_state, record.id)
                        && addr_ok(&record.peer_addr)
                        && addr_ok(&record.client_addr)
                    {
                        self.service.table.set_member(
                            record.id,
                            MemberAddrs {
                                peer_addr: record.peer_addr.clone(),
                                client_addr: record.client_addr.clone(),
                            },
                        );
                    }
                }
                info!(self.logger, "membership changed"; "index" => entry.index,
                    "voters" => ?conf_state.voters, "learners" => ?conf_state.learners,
                    "voters_outgoing" => ?conf_state.voters_outgoing);
                self.write(super::WriteBatch { conf_state: Some(conf_state.clone()), ..Default::default() });
                self.consensus.raw.mut_store().set_conf_state(conf_state.clone());
                self.conf_changed(&conf_state);
                if ours && request.is_some() && request == self.consensus.member_request {
                    self.consensus.member_request = None;
                    let mut response = self.members_response();
                    if let Response::Members { index, .. } = &mut response {
                        *index = entry.index;
                    }
                    if let Some(id) = request {
                        self.service.reply(id, Ok(response));
                    }
                }
                if !holds(&conf_state, self.id.0) {
                    // Stops once the write of its removal is durable, so
                    // that a restart finds it removed too.
                    warn!(self.logger, "this node was removed from the cluster"; "index" => entry.index);
                    self.consensus.removed = Some((entry.index, self.consensus.persist.disk.submitted));
                }
            }
            Err(err) => {
                warn!(self.logger, "conf change refused"; "index" => entry.index, "error" => %err);
                if ours && request.is_some() && request == self.consensus.member_request {
                    self.consensus.member_request = None;
                    if let Some(id) = request {
                        self.service.reply(
                            id,
                            Err(RequestError::BadMemberChange(format!("raft refused the change: {err}"))),
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// A joining replica with no configuration yet answers an append with
    /// a rejection hinting at its empty log: the leader backs off to its
    /// first index and, once the log there is compacted, sends a snapshot.
    /// An append from the log's start already is dropped unanswered: a
    /// rejection would have the leader send the same append again at once,
    /// a ping-pong of whole logs until the snapshot is ready (and, with
    /// each duplicated rejection starting one more, without bound: found by
    /// the simulator's membership changes, seeds 66, 712 and 824). The
    /// leader sends it again on its next heartbeat's answer. True when the
    /// message is not to be stepped.
    pub(super) fn refuse_append_while_joining(&mut self, message: &raft::prelude::Message) -> bool {
        use raft::prelude::MessageType;
        if !self.config.founding.joining
            || message.get_msg_type() != MessageType::MsgAppend
            || !self.consensus.raw.store().conf_state().voters.is_empty()
        {
            return false;
        }
        if message.index == 0 {
            return true;
        }
        let reject = self.append_rejection(message, message.index, 0);
        self.send(vec![reject]);
        true
    }

    /// After the configuration changed (a change applied, a snapshot
    /// installed): the peers the gate takes messages from.
    pub(super) fn conf_changed(&mut self, conf_state: &ConfState) {
        self.consensus.peers = peers_of(conf_state, &self.config.voters);
        self.consensus.conf_version += 1;
    }

    /// The members of the configuration this node applied, with the
    /// directory's addresses.
    pub fn members(&self) -> Vec<Member> {
        let conf = self.consensus.raw.raft.prs().conf().to_conf_state();
        let mut members: Vec<Member> = Vec::new();
        let mut add = |id: u64, role: MemberRole| {
            if !members.iter().any(|member| member.id.0 == id) {
                members.push(Member { id: NodeId(id), role, addrs: self.service.table.member(id).cloned() });
            }
        };
        let joint = !conf.voters_outgoing.is_empty();
        for id in &conf.voters {
            let role = match joint && !conf.voters_outgoing.contains(id) {
                true => MemberRole::VoterJoining,
                false => MemberRole::Voter,
            };
            add(*id, role);
        }
        for id in &conf.voters_outgoing {
            add(*id, MemberRole::VoterLeaving);
        }
        for id in conf.learners.iter().chain(&conf.learners_next) {
            add(*id, MemberRole::Learner);
        }
        members.sort_by_key(|member| member.id);
        members
    }

    /// Bumped at every configuration change: the shell refreshes its peer
    /// book when it moves.
    pub fn conf_version(&self) -> u64 {
        self.consensus.conf_version
    }

    pub(super) fn members_response(&self) -> Response {
        Response::Members { members: self.members(), index: self.service.table_index }
    }
}

fn single(node_id: u64, change_type: ConfChangeType) -> ConfChangeSingle {
    raft_proto::new_conf_change_single(node_id, change_type)
}

/// Whether `conf_state` holds `id`, in any role.
pub(super) fn holds(conf_state: &ConfState, id: u64) -> bool {
    conf_state
        .voters
        .iter()
        .chain(&conf_state.voters_outgoing)
        .chain(&conf_state.learners)
        .chain(&conf_state.learners_next)
        .any(|member| *member == id)
}

/// The nodes a replica takes raft messages from: the members of its
/// configuration, or, before it has one (a node joining), the members the
/// cluster named.
pub(super) fn peers_of(conf_state: &ConfState, named: &[NodeId]) -> Vec<NodeId> {
    let mut peers: Vec<NodeId> = conf_state
        .voters
        .iter()
        .chain(&conf_state.voters_outgoing)
        .chain(&conf_state.learners)
        .chain(&conf_state.learners_next)
        .map(|id| NodeId(*id))
        .collect();
    if peers.is_empty() {
        peers = named.to_vec();
    }
    peers.sort_unstable();
    peers.dedup();
    peers
}
