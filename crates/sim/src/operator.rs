//! [`Operator`]: the membership operator's plan, drawn from a stream of its
//! own, where it is in it, and what it was told. `membership.rs` carries its
//! operations out and says how.

use std::collections::{BTreeSet, VecDeque};

use crate::rng::Rng;

/// The salt that sets the operator's stream apart from the seed's main one.
const OPERATOR_SALT: u64 = 0x6f70_6572_6174_6f72;
/// The operations of one run, at most.
const OPERATIONS_MAX: u64 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Operation {
    Grow,
    Shrink,
    Replace,
}

/// One membership change the operator asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Add this new node as a learner, then start it.
    Add(usize),
    Promote(usize),
    /// Remove a voter, chosen when the step begins (never `keep`, the node
    /// the operation added).
    Remove {
        node: Option<usize>,
        keep: Option<usize>,
    },
}

/// The operator: its plan, where it is in it, and what it was told.
#[derive(Debug)]
pub(crate) struct Operator {
    pub(crate) rng: Rng,
    /// Operations not begun, each with the earliest time it may.
    pub(crate) plan: VecDeque<(u64, Operation)>,
    /// The steps left of the operation under way.
    pub(crate) steps: VecDeque<Step>,
    /// The number of the request in flight, if one is: its timer is the
    /// operator's.
    pub(crate) waiting: Option<u64>,
    /// The node it talks to, and its connection, if open.
    pub(crate) target: usize,
    pub(crate) conn: Option<(usize, u64)>,
    pub(crate) next_seq: u64,
    /// Bumped whenever its timer is set: only the latest counts.
    pub(crate) generation: u64,
    /// The members as the cluster's answers said.
    pub(crate) voters: BTreeSet<usize>,
    pub(crate) learners: BTreeSet<usize>,
    /// Changes acknowledged: members added, and removed.
    pub added: u64,
    pub removed: u64,
    /// It has asked for a change: nodes may hear from nodes outside their
    /// configuration from now on.
    pub asked: bool,
}

impl Operator {
    /// The operator of seed `seed`'s cluster of `nodes`, its operations
    /// drawn within the first `fault_ms`.
    pub(crate) fn draw(seed: u64, nodes: usize, fault_ms: u64) -> Operator {
        let mut rng = Rng::new(seed ^ OPERATOR_SALT);
        let count = rng.range(1, OPERATIONS_MAX + 1);
        let mut at_ms = rng.range(fault_ms / 20, fault_ms / 4);
        let mut plan = VecDeque::new();
        for _ in 0..count {
            plan.push_back((at_ms, rng.pick(&[Operation::Grow, Operation::Shrink, Operation::Replace])));
            at_ms += rng.range(fault_ms / 10, fault_ms / 4);
        }
        Operator {
            rng,
            plan,
            steps: VecDeque::new(),
            waiting: None,
            target: 0,
            conn: None,
            next_seq: 0,
            generation: 0,
            voters: (0..nodes).collect(),
            learners: BTreeSet::new(),
            added: 0,
            removed: 0,
            asked: false,
        }
    }

    /// The most nodes its plan adds.
    pub(crate) fn nodes_added_max(&self) -> usize {
        self.plan.iter().filter(|(_, operation)| *operation != Operation::Shrink).count()
    }

    /// When its first operation may begin.
    pub(crate) fn first_at_ms(&self) -> Option<u64> {
        self.plan.front().map(|(at_ms, _)| *at_ms)
    }
}

impl std::fmt::Display for Step {
    /// With node numbers (ids), as the rest of the trace names nodes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Add(node) => write!(f, "add {}", node + 1),
            Step::Promote(node) => write!(f, "promote {}", node + 1),
            Step::Remove { node: Some(node), .. } => write!(f, "remove {}", node + 1),
            Step::Remove { node: None, .. } => write!(f, "remove a voter"),
        }
    }
}
