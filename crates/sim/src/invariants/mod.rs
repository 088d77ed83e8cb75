//! The properties every run must keep, checked as the run goes. Each lives
//! in its own module and sees the same observations:
//!
//! - [`mutual_exclusion`]: at most one holder per key in any applied state;
//! - [`tokens`]: tokens strictly increase, and none is issued twice;
//! - [`convergence`]: all nodes hold equal tables at equal applied index;
//! - [`durability`]: no acknowledged grant, renew or release is lost;
//! - [`renewal`]: a lock is expired only when the expiring leader's clock
//!   says its last grant or renewal has run out;
//! - [`liveness`]: after the faults heal, the cluster converges and serves
//!   every client again.

pub mod convergence;
pub mod durability;
pub mod liveness;
pub mod mutual_exclusion;
pub mod renewal;
pub mod tokens;

use fencelock_fsm::LockTable;
use fencelock_raft::AppliedEvent;

/// One applied change, as node `node` saw it.
#[derive(Debug)]
pub struct Applied<'a> {
    pub node: usize,
    /// The node's own clock when it applied the change.
    pub local_ms: u64,
    pub is_leader: bool,
    /// The node is applying again, after a restart, entries it had applied
    /// before: the clock it applies them with is not the one they were
    /// decided by.
    pub replaying: bool,
    pub event: &'a AppliedEvent,
}

/// All the checkers, fed together.
#[derive(Debug, Default)]
pub struct Checker {
    pub mutual_exclusion: mutual_exclusion::Check,
    pub tokens: tokens::Check,
    pub convergence: convergence::Check,
    pub durability: durability::Check,
    pub renewal: renewal::Check,
    pub liveness: liveness::Check,
    /// Per node: the highest index it applied, and the highest it had
    /// applied before its last restart.
    applied_max: Vec<u64>,
    replay_until: Vec<u64>,
}

impl Checker {
    pub fn new(nodes: usize) -> Checker {
        Checker {
            mutual_exclusion: mutual_exclusion::Check::new(nodes),
            tokens: tokens::Check::new(nodes),
            renewal: renewal::Check::new(nodes),
            applied_max: vec![0; nodes],
            replay_until: vec![0; nodes],
            ..Checker::default()
        }
    }

    /// A node (re)opened on its disk with `table`.
    pub fn opened(&mut self, node: usize, table: &LockTable) {
        self.replay_until[node] = self.applied_max[node];
        self.reset(node, table);
    }

    fn reset(&mut self, node: usize, table: &LockTable) {
        self.mutual_exclusion.reset(node, table);
        self.tokens.reset(node, table);
    }

    /// Node `node` applied the changes of one turn, ending with `table` at
    /// `applied_index`.
    pub fn turn(
        &mut self,
        node: usize,
        local_ms: u64,
        is_leader: bool,
        events: &[AppliedEvent],
        applied_index: u64,
        table: &LockTable,
    ) -> Result<(), String> {
        // After a snapshot install the table jumped; the rest of the turn is
        // checked against the table the turn ends with.
        let restored_at = events.iter().position(|event| matches!(event, AppliedEvent::Restored));
        let checked = &events[..restored_at.unwrap_or(events.len())];
        let replaying = applied_index <= self.replay_until[node];
        self.applied_max[node] = self.applied_max[node].max(applied_index);
        for event in checked {
            let applied = Applied { node, local_ms, is_leader, replaying, event };
            self.mutual_exclusion.applied(&applied)?;
            self.tokens.applied(&applied)?;
            self.renewal.applied(&applied)?;
        }
        for event in events {
            self.durability.applied(event);
        }
        if restored_at.is_some() {
            self.reset(node, table);
            self.renewal.restored(node, table, local_ms);
        }
        self.convergence.observed(node, applied_index, table)
    }
}
