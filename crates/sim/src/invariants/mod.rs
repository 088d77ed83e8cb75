//! The properties every run must keep, checked as the run goes. Each lives
//! in its own module and sees the same observations:
//!
//! - [`mutual_exclusion`]: at most one holder per plain lock's key in any
//!   applied state;
//! - [`tokens`]: tokens strictly increase, and none is issued twice;
//! - [`convergence`]: all nodes hold equal tables at equal applied index;
//! - [`durability`]: no acknowledged grant, renew or release is lost;
//! - [`renewal`]: a lock is expired only when the expiring leader's clock
//!   says its last grant or renewal has run out;
//! - [`liveness`]: after the faults heal, the cluster converges and serves
//!   every client again;
//! - [`holders`]: what a client was told holds in real time: a client told
//!   Granted or Renewed keeps the key for its lease, measured from when it
//!   sent the request, unless it let go first;
//! - [`reads`]: a linearizable read names a holder the key had while the
//!   read was in flight;
//! - [`expiry`]: after the heal, a lock nobody renews is freed within its
//!   lease (stretched by drift) and a bound, once a leader is ready;
//! - [`watches`]: a watch's answer tells exactly the changes the log made
//!   under its prefix after its position, in order, with their indexes;
//! - [`shared`]: read-write locks and semaphores, on every node (readers
//!   only beside readers, a writer alone, at most N permits) and in what
//!   their clients were promised, as [`holders`] judges plain locks;
//! - [`sessions`]: a session's end frees all it held, holders name only
//!   open sessions of their owner, on every node after each change; a
//!   client told its session is alive keeps it, and what it holds under
//!   it, for its TTL;
//! - [`levels`]: the command level is one non-decreasing function of the
//!   log index on every node (across restarts and snapshot installs too),
//!   no change is applied below the level its command needs, refusals
//!   agree with the refusing node's table, and a cluster founded below
//!   this build's level ends the run raised to it;
//! - [`membership`]: at most one leader per term; a node stops as removed
//!   only when asked to; at the end every member holds the same member
//!   set, and every change the operator was told applied stands in it.
//!
//! The per-node checks are sized for every node a run may start, those a
//! membership change adds included; a node's view starts again whenever it
//! (re)opens, so a new member is judged from its first table on, and the
//! checks across nodes (tokens, convergence, durability) take it like any
//! other.

pub mod convergence;
pub mod durability;
pub mod expiry;
#[cfg(test)]
mod fixtures;
pub mod holders;
pub mod levels;
pub mod liveness;
pub mod membership;
pub mod mutual_exclusion;
pub mod reads;
pub mod renewal;
pub mod sessions;
pub mod shared;
pub mod tokens;
pub mod watches;

use fencelock_fsm::LockTable;
use fencelock_raft::AppliedEvent;

/// One applied change, as node `node` saw it.
#[derive(Debug)]
pub struct Applied<'a> {
    pub node: usize,
    /// The node's own clock when it applied the change.
    pub local_ms: u64,
    pub is_leader: bool,
    /// The index of the log entry that made the change.
    pub index: u64,
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
    pub holders: holders::Check,
    pub reads: reads::Check,
    pub expiry: expiry::Check,
    pub watches: watches::Check,
    pub shared: shared::Check,
    pub sessions: sessions::Check,
    pub levels: levels::Check,
    pub membership: membership::Check,
    /// Applied changes each per-node check judged.
    judged_changes: u64,
    /// Per node: the highest index it applied, and the highest it had
    /// applied before its last restart.
    applied_max: Vec<u64>,
    replay_until: Vec<u64>,
}

impl Checker {
    /// A checker for `nodes` nodes (every node a run may start) whose
    /// clocks drift at most `drift_ppm_max` parts per million.
    pub fn new(nodes: usize, drift_ppm_max: u64) -> Checker {
        Checker {
            mutual_exclusion: mutual_exclusion::Check::new(nodes),
            tokens: tokens::Check::new(nodes),
            renewal: renewal::Check::new(nodes),
            holders: holders::Check::new(drift_ppm_max),
            expiry: expiry::Check::new(drift_ppm_max),
            shared: shared::Check::new(nodes, drift_ppm_max),
            sessions: sessions::Check::new(nodes, drift_ppm_max),
            levels: levels::Check::new(nodes),
            applied_max: vec![0; nodes],
            replay_until: vec![0; nodes],
            ..Checker::default()
        }
    }

    /// A node (re)opened on its disk with `table`.
    pub fn opened(&mut self, node: usize, table: &LockTable) {
        self.replay_until[node] = self.applied_max[node];
        self.levels.reset(node);
        self.reset(node, table);
    }

    fn reset(&mut self, node: usize, table: &LockTable) {
        self.mutual_exclusion.reset(node, table);
        self.tokens.reset(node, table);
        self.shared.reset(node, table);
        self.sessions.reset(node, table);
    }

    /// A node's clock jumped forward: what clients were promised shrinks.
    pub fn clock_jumped(&mut self, now_ms: u64, jump_ms: u64) {
        self.holders.clock_jumped(now_ms, jump_ms);
        self.shared.clock_jumped(now_ms, jump_ms);
        self.sessions.clock_jumped(now_ms, jump_ms);
    }

    /// How often each check judged something, for the sweep's report.
    pub fn judged(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("applied changes", self.judged_changes),
            ("client promises", self.holders.judged()),
            ("reads", self.reads.judged()),
            ("lock expiries", self.expiry.judged()),
            ("acknowledgements", self.durability.acknowledgements() as u64),
            ("tables compared", self.convergence.compared()),
            ("watch answers", self.watches.judged().0),
            ("watch events", self.watches.judged().1),
        ]
        .into_iter()
        .chain(self.shared.judged())
        .chain(self.sessions.judged())
        .chain(self.levels.judged())
        .chain(self.membership.judged())
        .collect()
    }

    /// Node `node` applied the changes of one turn at true time `now_ms`
    /// (`local_ms` on its clock), ending with `table` at `applied_index`.
    #[allow(clippy::too_many_arguments)]
    pub fn turn(
        &mut self,
        node: usize,
        local_ms: u64,
        now_ms: u64,
        is_leader: bool,
        events: &[(u64, AppliedEvent)],
        applied_index: u64,
        table: &LockTable,
    ) -> Result<(), String> {
        // After a snapshot install the table jumped; the rest of the turn is
        // checked against the table the turn ends with.
        let restored_at = events.iter().position(|(_, event)| matches!(event, AppliedEvent::Restored));
        let checked = &events[..restored_at.unwrap_or(events.len())];
        let replaying = applied_index <= self.replay_until[node];
        self.applied_max[node] = self.applied_max[node].max(applied_index);
        if !events.is_empty() {
            // The shares of the holders granted this turn, before the
            // changes that granted them are judged.
            self.shared.learn(node, table)?;
        }
        for (index, event) in checked {
            let applied = Applied { node, local_ms, is_leader, index: *index, replaying, event };
            self.mutual_exclusion.applied(&applied)?;
            self.shared.applied(&applied)?;
            self.sessions.applied(&applied)?;
            self.tokens.applied(&applied)?;
            self.renewal.applied(&applied)?;
            self.judged_changes += 1;
        }
        for (index, event) in events {
            self.holders.applied(event, now_ms)?;
            self.shared.first_applied(event, now_ms)?;
            self.sessions.first_applied(event, now_ms)?;
            self.reads.applied(event, now_ms);
            self.expiry.applied(*index, event, now_ms);
        }
        for (index, event) in events {
            self.durability.applied(*index, event);
        }
        self.watches.applied(events);
        self.levels.turn(node, events, applied_index, table)?;
        if restored_at.is_some() {
            self.reset(node, table);
            self.renewal.restored(node, table, local_ms);
        } else if !events.is_empty() {
            self.shared.compare(node, table)?;
            self.sessions.compare(node, table)?;
        }
        self.convergence.observed(node, applied_index, table)
    }
}
