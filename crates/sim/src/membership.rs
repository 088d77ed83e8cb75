//! Membership changes during the faults, made as an operator makes them
//! (docs/operations.md, "Change the membership").
//!
//! With `--membership seed` (the default), one seed in seven
//! ([`membership_changes`]) has an operator; with `always`, every seed;
//! with `never`, none. It carries
//! out one to three operations, one at a time, each no earlier than a time
//! drawn in the fault phase:
//! - grow: a new node (a new id, a blank disk) is added as a learner; once
//!   the cluster answers, it starts, joining with the members the answer
//!   named (`fencelockd --join`), takes a snapshot and catches up; the
//!   operator asks for its promotion until it is a voter;
//! - shrink: a voter is removed (half the time the leader, which hands
//!   leadership over first), unless that would leave fewer than three;
//! - replace: a grow, then the removal of another voter.
//!
//! Each step is one `ClientRequest::ChangeMembers` an admin client sends to
//! some node over a connection of its own. A refusal (not the leader, a
//! change under way, a learner not caught up, a quorum that would not
//! survive, a leadership lost) is asked again later, at the hinted leader
//! or the next node; so is a request without an answer (every change is
//! safe to retry). A removed node stops once it applies its removal
//! (`FatalError::Removed`): it never starts again, and counts no more
//! (the end's convergence is over the members only). One that never hears
//! of its removal is stopped by the operator a while later. A node whose
//! disk is lost restarts as `fencelockd --join` would have it: a voter
//! rejoins with the members the cluster names, a learner joins again,
//! a node that is no member stays down. The faults go on meanwhile, new
//! nodes included; no operation starts after the heal, and the one under
//! way is finished.
//!
//! Everything the operator decides draws from a stream of its own, derived
//! from the seed, and a seed without an operator takes no step of it: it
//! replays exactly as before membership changes were simulated. (Its nodes
//! still draw from the seed's main stream as they start, so a seed with an
//! operator runs otherwise than without one.)

use fencelock_fsm::MemberAddrs;
use fencelock_raft::reply::Membership;
use fencelock_raft::{rejoin::ClusterState, ClientRequest, Member, MemberChange, MemberRole, NodeId, Reply};
use fencelock_raft::{Answer, RequestError, Role};
use fencelock_types::LEVEL;

use crate::invariants::membership::Expected;
use crate::operator::{Operation, Step};
use crate::rng::Rng;
use crate::world::{Ask, Event, Rejoin, SimNode, World};

/// The salt that sets the stream choosing the seeds with an operator apart
/// from the seed's main one (the operator's own stream has another, in
/// `operator.rs`).
const CHOICE_SALT: u64 = 0x6d65_6d62_6572_7321;

/// One seed in this many has an operator.
const SEEDS_PER_OPERATOR: u64 = 7;
/// The voters the operator leaves at least (a cluster of three must stay
/// three to lose one).
const VOTERS_MIN: usize = 3;
/// How long the operator waits for an answer before it gives the
/// connection up and asks again elsewhere, in ms.
const REQUEST_TIMEOUT_MS: u64 = 3_000;
/// How soon it asks again after a refusal, and after being sent to
/// another node, in ms.
const RETRY_MS: (u64, u64) = (100, 1_000);
const REDIRECT_MS: (u64, u64) = (5, 50);
/// The pause between two steps of an operation, and at least between two
/// operations, in ms.
const STEP_MS: (u64, u64) = (10, 200);
const BETWEEN_MS: (u64, u64) = (500, 3_000);
/// How long after a removal the operator stops the removed node if it has
/// not stopped by itself, in ms.
const DECOMMISSION_MS: u64 = 5_000;

/// Whether seed `seed` changes its cluster's membership: one seed in
/// [`SEEDS_PER_OPERATOR`].
pub fn membership_changes(seed: u64) -> bool {
    Rng::new(seed ^ CHOICE_SALT).range(0, SEEDS_PER_OPERATOR) == 0
}

/// Where node `node` is reached, as its addition names it.
fn addrs(node: usize) -> MemberAddrs {
    MemberAddrs {
        peer_addr: format!("node-{}:7001", node + 1),
        client_addr: format!("node-{}:7101", node + 1),
    }
}

/// A member's node, and whether it votes.
fn member_node(member: &Member) -> (usize, bool) {
    ((member.id.0 - 1) as usize, member.role != MemberRole::Learner)
}

impl World {
    /// The client number on the operator's requests: past every client's.
    pub(crate) fn operator_client(&self) -> usize {
        self.clients.len()
    }

    /// Sets the operator's timer, replacing any earlier one.
    pub(crate) fn wake_operator(&mut self, delay_ms: u64) {
        let Some(operator) = self.operator.as_mut() else { return };
        operator.generation += 1;
        let generation = operator.generation;
        self.schedule(delay_ms, Event::Operator { generation });
    }

    /// A pause drawn from the operator's stream.
    fn operator_pause(&mut self, (low, high): (u64, u64)) -> u64 {
        self.operator.as_mut().map_or(low, |operator| operator.rng.range(low, high))
    }

    pub(crate) fn operator_wakes(&mut self, generation: u64) -> Result<(), String> {
        let Some(operator) = self.operator.as_mut() else { return Ok(()) };
        if generation != operator.generation || self.finished {
            return Ok(());
        }
        if operator.waiting.take().is_some() {
            // No answer in time: the connection is given up, and the same
            // change asked of the next node (a retry is safe).
            operator.target = (operator.target + 1) % self.nodes.len();
            self.operator_close();
            return self.operator_send();
        }
        if operator.steps.is_empty() {
            if self.healed {
                return Ok(());
            }
            let Some((at_ms, operation)) = operator.plan.front().copied() else { return Ok(()) };
            if self.now_ms < at_ms {
                self.wake_operator(at_ms - self.now_ms);
                return Ok(());
            }
            operator.plan.pop_front();
            self.begin(operation);
        }
        self.operator_send()
    }

    /// Lays out the steps of `operation`; a new node gets its place now.
    fn begin(&mut self, operation: Operation) {
        let steps = match operation {
            Operation::Shrink => vec![Step::Remove { node: None, keep: None }],
            Operation::Grow | Operation::Replace => {
                let node = self.new_node();
                let mut steps = vec![Step::Add(node), Step::Promote(node)];
                if operation == Operation::Replace {
                    steps.push(Step::Remove { node: None, keep: Some(node) });
                }
                steps
            }
        };
        self.note(&format!("operator: {operation:?}"));
        if let Some(operator) = self.operator.as_mut() {
            operator.steps = steps.into();
        }
    }

    /// A place for a new node, with the next id (ids are never reused): it
    /// starts once the cluster has added it.
    fn new_node(&mut self) -> usize {
        let node = self.nodes.len();
        let Some(operator) = self.operator.as_mut() else { unreachable!("only the operator adds nodes") };
        let mut added = SimNode::draw(
            NodeId(node as u64 + 1),
            Vec::new(),
            &self.config,
            &self.swarm,
            LEVEL,
            &mut operator.rng,
        );
        added.config.founding.joining = true;
        added.config.founding.initial_cluster_state = ClusterState::Existing;
        added.awaiting_add = true;
        added.join_when_blank = true;
        self.nodes.push(added);
        node
    }

    /// Sends the current step's change, choosing the voter to remove if
    /// it has not been chosen.
    fn operator_send(&mut self) -> Result<(), String> {
        let Some(operator) = self.operator.as_mut() else { return Ok(()) };
        let Some(mut step) = operator.steps.front().copied() else { return Ok(()) };
        if let Step::Remove { node: None, keep } = step {
            let candidates: Vec<usize> =
                operator.voters.iter().copied().filter(|voter| Some(*voter) != keep).collect();
            if operator.voters.len() <= VOTERS_MIN || candidates.is_empty() {
                let voters = operator.voters.len();
                operator.steps.pop_front();
                self.note(&format!("operator: {voters} voters, none removed"));
                let pause = self.operator_pause(STEP_MS);
                self.wake_operator(pause);
                return Ok(());
            }
            let leader = self.leader_node().filter(|leader| candidates.contains(leader));
            let Some(operator) = self.operator.as_mut() else { return Ok(()) };
            let node = match leader {
                Some(leader) if operator.rng.chance(500_000) => leader,
                _ => operator.rng.pick(&candidates),
            };
            step = Step::Remove { node: Some(node), keep };
            operator.steps[0] = step;
        }
        let Some(operator) = self.operator.as_ref() else { return Ok(()) };
        let (node, change) = match step {
            Step::Add(node) => {
                let known = operator
                    .voters
                    .iter()
                    .chain(&operator.learners)
                    .map(|member| (NodeId(*member as u64 + 1), addrs(*member)))
                    .collect();
                let MemberAddrs { peer_addr, client_addr } = addrs(node);
                (
                    node,
                    MemberChange::AddLearner { id: NodeId(node as u64 + 1), peer_addr, client_addr, known },
                )
            }
            Step::Promote(node) => (node, MemberChange::Promote(NodeId(node as u64 + 1))),
            Step::Remove { node: Some(node), .. } => (node, MemberChange::Remove(NodeId(node as u64 + 1))),
            Step::Remove { node: None, .. } => unreachable!("chosen above"),
        };
        let Some(conn) = self.operator_connection() else {
            // Nobody there: the operator tries the next node shortly.
            if let Some(operator) = self.operator.as_mut() {
                operator.target = (operator.target + 1) % self.nodes.len();
            }
            let pause = self.operator_pause(REDIRECT_MS);
            self.wake_operator(pause);
            return Ok(());
        };
        let client = self.operator_client();
        let Some(operator) = self.operator.as_mut() else { return Ok(()) };
        operator.next_seq += 1;
        operator.asked = true;
        let (seq, target) = (operator.next_seq, operator.target);
        operator.waiting = Some(seq);
        self.checker.membership.asked(node, matches!(change, MemberChange::Remove(_)));
        self.note(&format!("operator asks {} to {step}", target + 1));
        let delay = self.network.delay_min_ms + self.network.delay_jitter_ms / 2;
        let request = ClientRequest::ChangeMembers(change);
        self.schedule(delay, Event::Request { node: target, conn, ask: Ask { client, seq, conn }, request });
        self.wake_operator(REQUEST_TIMEOUT_MS);
        Ok(())
    }

    /// The node that leads now, if one does.
    fn leader_node(&self) -> Option<usize> {
        self.nodes.iter().position(|node| {
            node.node
                .as_ref()
                .and_then(fencelock_raft::Node::status)
                .is_some_and(|status| status.role == Role::Leader)
        })
    }

    /// The operator's connection to its target, opened if it has none.
    fn operator_connection(&mut self) -> Option<u64> {
        let operator = self.operator.as_ref()?;
        let target = operator.target;
        if let Some((node, conn)) = operator.conn {
            if node == target && self.client_conns.contains(&conn) {
                return Some(conn);
            }
            self.operator_close();
        }
        self.nodes[target].node.as_ref()?;
        self.next_conn += 1;
        let conn = self.next_conn;
        self.client_conns.insert(conn);
        self.nodes[target].conns.insert(conn);
        self.operator.as_mut()?.conn = Some((target, conn));
        Some(conn)
    }

    /// The operator closes its connection; the node hears of it after
    /// what was sent on it.
    fn operator_close(&mut self) {
        let Some((node, conn)) = self.operator.as_mut().and_then(|operator| operator.conn.take()) else {
            return;
        };
        if self.client_conns.remove(&conn) {
            let delay = self.network.delay_min_ms + self.network.delay_jitter_ms + 1;
            self.schedule(delay, Event::Close { node, conn });
        }
    }

    /// The node side of `conn` is gone; true if it was the operator's,
    /// which then asks again elsewhere.
    pub(crate) fn operator_connection_reset(&mut self, conn: u64) -> bool {
        let nodes = self.nodes.len();
        let Some(operator) = self.operator.as_mut() else { return false };
        if operator.conn.is_none_or(|(_, open)| open != conn) {
            return false;
        }
        operator.conn = None;
        operator.target = (operator.target + 1) % nodes;
        if operator.waiting.take().is_some() {
            let pause = self.operator_pause(REDIRECT_MS);
            self.wake_operator(pause);
        }
        true
    }

    /// An answer to the operator arrives; one it no longer waits for is
    /// dropped.
    pub(crate) fn operator_reply(&mut self, ask: Ask, reply: Reply) -> Result<(), String> {
        let nodes = self.nodes.len();
        let Some(operator) = self.operator.as_mut() else { return Ok(()) };
        let current = operator.waiting == Some(ask.seq);
        if !current || operator.conn.is_none_or(|(_, conn)| conn != ask.conn) {
            return Ok(());
        }
        operator.waiting = None;
        let Some(step) = operator.steps.front().copied() else { unreachable!("a step is in flight") };
        let pause = match &reply {
            Ok(_) => 0,
            Err(RequestError::NotLeader { leader_hint }) => {
                operator.target = match leader_hint {
                    Some(leader) if (1..=nodes as u64).contains(&leader.0) => (leader.0 - 1) as usize,
                    _ => (operator.target + 1) % nodes,
                };
                operator.rng.range(REDIRECT_MS.0, REDIRECT_MS.1)
            }
            Err(
                RequestError::LeadershipLost { .. }
                | RequestError::Dropped
                | RequestError::Overloaded
                | RequestError::Stopped
                | RequestError::MemberChangeBusy(_),
            ) => operator.rng.range(RETRY_MS.0, RETRY_MS.1),
            // Members the leader has not heard from lately: ask again once
            // they are back.
            Err(RequestError::BadMemberChange(why)) if why.contains("not a majority") => {
                operator.rng.range(RETRY_MS.0, RETRY_MS.1)
            }
            Err(other) => return Err(format!("the operator's \"{step}\" was answered {other:?}")),
        };
        if self.trace_clients || reply.is_ok() {
            self.note(&format!("operator answered \"{step}\": {reply:?}"));
        }
        match reply.map(Membership::take) {
            Ok(Ok(Membership { members, .. })) => self.step_done(step, &members),
            Ok(Err(other)) => {
                Err(format!("the operator's \"{step}\" was answered {other:?}, not the membership"))
            }
            Err(_) => {
                self.wake_operator(pause);
                Ok(())
            }
        }
    }

    /// The cluster answered `step` with its `members`: they must show it.
    fn step_done(&mut self, step: Step, members: &[Member]) -> Result<(), String> {
        let role = |node: usize| members.iter().map(member_node).find(|(member, _)| *member == node);
        let (node, expected) = match step {
            Step::Add(node) => (node, Expected::Learner),
            Step::Promote(node) => (node, Expected::Voter),
            Step::Remove { node: Some(node), .. } => (node, Expected::Gone),
            Step::Remove { node: None, .. } => unreachable!("chosen when sent"),
        };
        let shown = match (expected, role(node)) {
            // A retried add of a node promoted since cannot happen: one
            // change at a time, in order.
            (Expected::Learner, Some(_)) | (Expected::Gone, None) => true,
            (Expected::Voter, Some((_, voter))) => voter,
            _ => false,
        };
        if !shown {
            return Err(format!(
                "the cluster answered the operator's \"{step}\" with members {:?}, which do not show it",
                members.iter().map(|member| (member.id.0, member.role)).collect::<Vec<_>>()
            ));
        }
        self.checker.membership.acknowledged(node, expected);
        let Some(operator) = self.operator.as_mut() else { return Ok(()) };
        operator.steps.pop_front();
        match expected {
            Expected::Learner => {
                operator.learners.insert(node);
                operator.added += 1;
                // It starts with the members the cluster named, as
                // `fencelockd --join` does.
                self.nodes[node].config.voters = members.iter().map(|member| member.id).collect();
                self.nodes[node].awaiting_add = false;
                self.note(&format!("operator starts {}, a new learner", node + 1));
                self.start_node(node)?;
            }
            Expected::Voter => {
                operator.learners.remove(&node);
                operator.voters.insert(node);
            }
            Expected::Gone => {
                operator.voters.remove(&node);
                operator.learners.remove(&node);
                operator.removed += 1;
                // It is never started again; if it runs, it stops once it
                // applies its removal, or the operator stops it.
                self.nodes[node].retire();
                self.schedule(DECOMMISSION_MS, Event::Decommission(node));
            }
        }
        let next_ms = match self.operator.as_ref() {
            Some(operator) if operator.steps.is_empty() => {
                let at_ms = operator.plan.front().map_or(0, |(at_ms, _)| *at_ms);
                at_ms.saturating_sub(self.now_ms).max(self.operator_pause(BETWEEN_MS))
            }
            _ => self.operator_pause(STEP_MS),
        };
        self.wake_operator(next_ms);
        Ok(())
    }

    /// The operator stops `node`, which it removed, if it still runs (it
    /// may never hear of its removal: the leader stops sending to it).
    pub(crate) fn decommission(&mut self, node: usize) {
        if self.stop(node) {
            self.note(&format!("operator stops {}: removed, and it has not stopped by itself", node + 1));
        }
    }

    /// Node `node`, blank, heard from `by` of a configuration that does
    /// not hold it as a voter: the process exits (code 4), saying to start
    /// it with `--join`, which the operator does a while later.
    pub(crate) fn member_elsewhere(&mut self, node: usize, by: u64) -> Result<(), String> {
        self.note(&format!(
            "{} is blank and node {by}'s configuration does not hold it: it stops, to --join",
            node + 1
        ));
        self.stop(node);
        self.nodes[node].join_when_blank = true;
        let delay = self.operator_pause(RETRY_MS);
        self.schedule(delay, Event::Restart(node));
        Ok(())
    }

    /// Node `node` applied its removal at `index` (or its disk says so):
    /// its process ends, for good.
    pub(crate) fn node_removed(&mut self, node: usize, index: u64) -> Result<(), String> {
        self.note(&format!("{} applied its removal at index {index}: it stops", node + 1));
        self.checker.membership.stopped_removed(node, index)?;
        self.stop(node);
        self.nodes[node].retire();
        Ok(())
    }

    /// Before `node` restarts on a blank disk (its disk was lost, or it
    /// never held anything), once the membership has changed. A founder
    /// restarts with its first command (its `--peers` stale, with
    /// `existing`): it decides from the configuration its peers' hellos
    /// name, and stops if that configuration holds it no more
    /// ([`World::member_elsewhere`]). A node that was added (or told to
    /// join) starts as `fencelockd --join` does: it asks the cluster's
    /// leader for the members, and rejoins with them as a voter (without a
    /// vote until it has caught up), or joins again as a learner; a node
    /// that is no member any more stays down. Without a ready leader to
    /// ask, it asks again later.
    pub(crate) fn rejoin_as_member(&mut self, node: usize) -> Rejoin {
        if !self.operator.as_ref().is_some_and(|operator| operator.asked) {
            return Rejoin::Start;
        }
        if !self.nodes[node].join_when_blank {
            if self.formed {
                self.nodes[node].config.founding.initial_cluster_state = ClusterState::Existing;
            }
            return Rejoin::Start;
        }
        let Some(members) = self.leader_members() else {
            return Rejoin::Later(self.operator_pause(RETRY_MS));
        };
        let Some((_, voter)) = members.iter().find(|(member, _)| *member == node).copied() else {
            self.note(&format!("{} starts blank and is no member any more: it stays down", node + 1));
            self.nodes[node].retire();
            return Rejoin::Never;
        };
        let config = &mut self.nodes[node].config;
        config.voters = members.iter().map(|(member, _)| NodeId(*member as u64 + 1)).collect();
        config.founding.joining = !voter;
        config.founding.initial_cluster_state = ClusterState::Existing;
        Rejoin::Start
    }

    /// The members as the current leader applied them: what `fencelockd
    /// --join` learns, from a `member add` that only a leader able to
    /// commit it answers. So only a ready leader of the highest term any
    /// node knows, and not paused, answers here. A deposed leader that has
    /// not heard of the new term yet (a paused one, seed 4266667818) would
    /// answer with the members from before a change the cluster committed
    /// since, and a node it omits would stay down for good. `None`: no node
    /// can answer now.
    fn leader_members(&self) -> Option<Vec<(usize, bool)>> {
        let replicas = || self.nodes.iter().filter_map(|node| Some((node, node.node.as_ref()?.replica()?)));
        let term = replicas().map(|(_, replica)| replica.status().term).max()?;
        let (_, replica) = replicas().find(|(node, replica)| {
            replica.is_leader_ready()
                && replica.status().term == term
                && node.clock.paused(self.now_ms).is_none()
        })?;
        Some(replica.members().iter().map(member_node).collect())
    }

    /// The nodes whose tables must agree at the end: every node, or, once
    /// the membership may have changed, the members of the configuration
    /// of the node that applied the most (`None` while no node can say).
    pub(crate) fn member_nodes(&self) -> Option<Vec<usize>> {
        if self.operator.is_none() {
            return Some((0..self.nodes.len()).collect());
        }
        let (_, members) = self
            .nodes
            .iter()
            .filter_map(|node| node.node.as_ref()?.replica())
            .map(|replica| (replica.status().log.applied_index, replica.members()))
            .filter(|(_, members)| !members.is_empty())
            .max_by_key(|(index, _)| *index)?;
        let nodes: Vec<usize> = members.iter().map(|member| member_node(member).0).collect();
        nodes.iter().all(|node| *node < self.nodes.len()).then_some(nodes)
    }

    /// At the end: every member holds the same members, and they show
    /// what the operator was told (`invariants::membership`).
    pub(crate) fn members_agree(&self) -> Result<(), String> {
        let views: Vec<(usize, Vec<(usize, bool)>)> = self
            .member_nodes()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|node| {
                let (_, members) = self.nodes[node].node.as_ref()?.members()?;
                Some((node, members.iter().map(member_node).collect()))
            })
            .collect();
        self.checker.membership.finish(&views)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::operator::Operator;

    #[test]
    fn about_one_seed_in_seven_changes_its_membership() {
        let changing = (0..7_000).filter(|seed| membership_changes(*seed)).count();
        assert!((850..1_150).contains(&changing), "{changing}");
    }

    #[test]
    fn the_seeds_that_found_node_bugs_change_no_membership() {
        // They replay the runs that found those bugs.
        for seed in [754, 132_174_523, 2_774_141_204] {
            assert!(!membership_changes(seed), "{seed}");
        }
    }

    #[test]
    fn an_operator_plans_one_to_three_operations_in_the_fault_phase() {
        let mut kinds = BTreeSet::new();
        for seed in 0..200 {
            let operator = Operator::draw(seed, 3, 20_000);
            assert!((1..=3).contains(&operator.plan.len()));
            assert!(operator.plan.iter().all(|(at_ms, _)| *at_ms < 20_000));
            assert_eq!(operator.voters.len(), 3);
            assert!(operator.nodes_added_max() <= operator.plan.len());
            kinds.extend(operator.plan.iter().map(|(_, operation)| format!("{operation:?}")));
        }
        assert_eq!(kinds.len(), 3, "{kinds:?}");
    }
}
