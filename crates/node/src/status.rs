//! A replica's status as it reports it: its role and term, where its log
//! stands, its table's size, and the configuration it knows. Plain data,
//! read by the shells, the metrics and the simulator; built by
//! [`Replica::status`](super::Replica::status) and `Node::report`.

use fencelock_types::{ClusterId, FencingToken};

use crate::types::NodeId;

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
    /// Where its log stands.
    pub log: LogProgress,
    pub locks: usize,
    pub last_token: Option<FencingToken>,
    pub pending_requests: usize,
    /// This node lost its data and has not caught up yet: it does not vote.
    pub rejoining: bool,
    /// The cluster's id, once this node has applied it.
    pub cluster_id: Option<ClusterId>,
    /// The configuration it knows, and whom it hears from.
    pub conf: ConfView,
    pub starting: bool,
}

/// Where a node's log stands: part of [`NodeStatus`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogProgress {
    pub commit_index: u64,
    pub applied_index: u64,
    pub last_index: u64,
    pub snapshot_index: u64,
    /// The size of the last snapshot's table, in bytes.
    pub snapshot_bytes: u64,
}

/// The configuration a node knows, and the members it hears from: part of
/// [`NodeStatus`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfView {
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
}

impl ConfView {
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
            log: LogProgress::default(),
            locks: 0,
            last_token: None,
            pending_requests: 0,
            rejoining: false,
            cluster_id: None,
            conf: ConfView { reachable: vec![id.0], ..ConfView::default() },
            starting: false,
        }
    }

    /// [`ConfView::has_quorum`].
    pub fn has_quorum(&self) -> bool {
        self.conf.has_quorum()
    }
}
