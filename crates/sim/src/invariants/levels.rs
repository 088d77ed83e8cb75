//! The cluster's command level, on every node, and its raise.
//!
//! The level is a function of the log index: every replica applies the
//! same Bootstrap and RaiseLevel at the same index, and neither lowers it.
//! So everything the nodes show is a sighting of that function: a node's
//! table at the end of a turn says "level L at applied index i", and a
//! change it applied says "at least N at index i", N the level of the
//! command that made it. The sightings of every node and every incarnation
//! must fit one non-decreasing function:
//! - the level never goes down as a node applies, across its restarts (it
//!   applies again from its snapshot, and must find the same levels) or
//!   through a snapshot it installs;
//! - all nodes show the same level at the same applied index;
//! - no change is applied at an index where the level is below what its
//!   command needs ([`fencelock_types::Command::level`]): a Proclaim (2), a
//!   grant of a key the clients take shared (2; they take keys under
//!   [`super::shared::PREFIX`] only with GrantShared), anything of a
//!   session (3). A lock with a value below level 2 counts as such a change
//!   too: the leader refuses a Grant with a value until then, as a build
//!   before level 2 would drop the value.
//!
//! Kept as, for each level L, the lowest index seen at L or above and the
//! highest seen below L: they must not cross. A change applied above the
//! level within the turn that raised it is caught once any node shows a
//! turn's end between the two indexes (the leader, which applies entries
//! as they commit, mostly does).
//!
//! Besides: a refusal (`RequestError::LevelNotReached`) names a level
//! below the one needed and not below the level the refusing node's table
//! was at; and at the end of a run, healed, with every node upgraded, the
//! cluster is at [`LEVEL`].

use fencelock_fsm::LockTable;
use fencelock_raft::AppliedEvent;
use fencelock_types::LEVEL;

use super::shared;

/// One sighting of the level function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sighting {
    index: u64,
    node: usize,
    level: u32,
    what: Seen,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// The node's table was at `level` at applied index `index`.
    Table,
    /// The node applied a change at `index` that needs `level`.
    Change(&'static str),
}

impl std::fmt::Display for Sighting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let node = self.node + 1;
        match self.what {
            Seen::Table => {
                write!(f, "node {node}'s table was at level {} at applied index {}", self.level, self.index)
            }
            Seen::Change(what) => {
                write!(
                    f,
                    "node {node} applied {what} (a level-{} change) at index {}",
                    self.level, self.index
                )
            }
        }
    }
}

/// What one node last showed.
#[derive(Clone, Copy, Debug, Default)]
struct NodeView {
    /// Its table's (applied index, level) at the end of its last turn.
    last: Option<(u64, u32)>,
    /// Its table's level when its last turn began: what a refusal it
    /// answered in that turn was decided at.
    before: Option<u32>,
}

#[derive(Debug, Default)]
pub struct Check {
    nodes: Vec<NodeView>,
    /// At `[L - 2]` for each level L from 2 to [`LEVEL`]: the sighting at
    /// L or above with the lowest index, and the one below L with the
    /// highest.
    at_least: Vec<Option<Sighting>>,
    below: Vec<Option<Sighting>>,
    judged_changes: u64,
    judged_refusals: u64,
    raised: u64,
}

impl Check {
    pub fn new(nodes: usize) -> Check {
        let levels = LEVEL.saturating_sub(1) as usize;
        Check {
            nodes: vec![NodeView::default(); nodes],
            at_least: vec![None; levels],
            below: vec![None; levels],
            ..Check::default()
        }
    }

    /// Node `node` (re)started: it starts again from its disk.
    pub fn reset(&mut self, node: usize) {
        self.nodes[node] = NodeView::default();
    }

    /// A turn of node `node` applied `events` (all of them, those after a
    /// snapshot install too: each is judged at its own index) and ended
    /// with `table` at `applied_index`.
    pub fn turn(
        &mut self,
        node: usize,
        events: &[(u64, fencelock_raft::AppliedEvent)],
        applied_index: u64,
        table: &LockTable,
    ) -> Result<(), String> {
        for (index, event) in events {
            if let Some((level, what)) = needs(event) {
                self.judged_changes += 1;
                self.sight(Sighting { index: *index, node, level, what: Seen::Change(what) })?;
            }
        }
        let level = table.level();
        let view = &mut self.nodes[node];
        view.before = view.last.map(|(_, level)| level);
        if events.is_empty() && view.last == Some((applied_index, level)) {
            return Ok(());
        }
        view.last = Some((applied_index, level));
        if level < 2
            && !events.is_empty()
            && table.list(b"", usize::MAX).any(|(_, lock)| !lock.value.as_bytes().is_empty())
        {
            let what = Seen::Change("a Grant with a value");
            self.sight(Sighting { index: applied_index, node, level: 2, what })?;
        }
        self.sight(Sighting { index: applied_index, node, level, what: Seen::Table })
    }

    /// Node `node` refused a request that needs level `needed`, saying the
    /// cluster is at `level`, in the turn it just took.
    pub fn refused(&mut self, node: usize, needed: u32, level: u32) -> Result<(), String> {
        self.judged_refusals += 1;
        let name = node + 1;
        if needed <= level {
            return Err(format!(
                "node {name} refused a request that needs level {needed} as above the cluster's level {level}"
            ));
        }
        match self.nodes[node].before {
            Some(table) if table > level => Err(format!(
                "node {name} refused a request that needs level {needed}, saying the cluster is at level {level}, \
                 while its table was at level {table}"
            )),
            _ => Ok(()),
        }
    }

    /// The run ended with every node on a table at `level`, healed, every
    /// node a build of [`LEVEL`] for a while: the leader must have raised
    /// a cluster founded at `founding_level` to it.
    pub fn finish(&mut self, founding_level: u32, level: u32) -> Result<(), String> {
        if level != LEVEL {
            return Err(format!(
                "the cluster, founded at command level {founding_level}, ended at level {level}, not {LEVEL}, though \
                 every node has said it applies {LEVEL} since the heal"
            ));
        }
        if founding_level < LEVEL {
            self.raised += 1;
        }
        Ok(())
    }

    /// How often each part judged something, for the sweep's report.
    pub fn judged(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("level-gated changes", self.judged_changes),
            ("level refusals", self.judged_refusals),
            ("levels raised", self.raised),
        ]
    }

    /// Fits `seen` into the level function, or says what it contradicts.
    fn sight(&mut self, seen: Sighting) -> Result<(), String> {
        for at in 0..self.at_least.len() {
            let bound = at as u32 + 2;
            if seen.level >= bound {
                let low = self.at_least[at].is_none_or(|lowest| seen.index < lowest.index);
                if low {
                    self.at_least[at] = Some(seen);
                }
                if let Some(below) = self.below[at].filter(|below| below.index >= seen.index) {
                    return Err(crossed(&seen, &below));
                }
            } else if seen.what == Seen::Table {
                // A change says only how high the level is at least.
                let high = self.below[at].is_none_or(|highest| seen.index > highest.index);
                if high {
                    self.below[at] = Some(seen);
                }
                if let Some(above) = self.at_least[at].filter(|above| above.index <= seen.index) {
                    return Err(crossed(&above, &seen));
                }
            }
        }
        Ok(())
    }
}

/// The message for a sighting at a level that one at a later or equal
/// index, below it, contradicts.
fn crossed(high: &Sighting, low: &Sighting) -> String {
    let broken = match high.what {
        Seen::Table => "the command level went down along the log",
        Seen::Change(_) => "a change was applied above the command level",
    };
    format!("{high}, but {low}: {broken}")
}

/// The level the change `event` made needs, and what to call it, when
/// above 1.
fn needs(event: &AppliedEvent) -> Option<(u32, &'static str)> {
    match event {
        AppliedEvent::Proclaimed { .. } => Some((2, "a Proclaim")),
        AppliedEvent::Granted { session: Some(_), .. } => Some((3, "a grant under a session")),
        AppliedEvent::Granted { key, .. } if shared::is_shared(key.as_bytes()) => {
            Some((2, "a grant of a shared key"))
        }
        AppliedEvent::SessionOpened { .. } => Some((3, "a session's opening")),
        AppliedEvent::SessionRenewed { .. } => Some((3, "a session's renewal")),
        AppliedEvent::SessionEnded { .. } => Some((3, "a session's end")),
        AppliedEvent::Granted { .. }
        | AppliedEvent::Renewed { .. }
        | AppliedEvent::Released { .. }
        | AppliedEvent::Expired { .. }
        | AppliedEvent::Delayed { .. }
        | AppliedEvent::DelayLifted { .. }
        | AppliedEvent::Restored => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use fencelock_types::{Command, LeaseMs, Owner, Value};

    /// An empty table at `level`.
    fn at(level: u32) -> LockTable {
        LockTable::at_level(level)
    }

    fn proclaimed() -> AppliedEvent {
        AppliedEvent::Proclaimed { key: key(), token: token(1) }
    }

    fn opened(n: u64) -> AppliedEvent {
        AppliedEvent::SessionOpened { session: token(n), ttl_ms: LeaseMs::new(1_000).unwrap() }
    }

    #[test]
    fn a_level_that_goes_down_on_a_node_as_it_applies_is_caught() {
        let mut check = Check::new(1);
        check.turn(0, &[], 3, &at(1)).unwrap();
        check.turn(0, &[], 10, &at(3)).unwrap();
        let err = check.turn(0, &[], 12, &at(2)).unwrap_err();
        assert!(
            err.contains(
                "node 1's table was at level 3 at applied index 10, but node 1's table was at level 2 at applied \
                 index 12: the command level went down"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_restart_or_a_snapshot_that_brings_a_lower_level_is_caught() {
        // A restart applies again from the snapshot at index 5: the same
        // levels as before are fine, a lower one at the same index is not.
        let mut check = Check::new(2);
        check.turn(0, &[], 5, &at(1)).unwrap();
        check.turn(0, &[], 20, &at(3)).unwrap();
        check.reset(0);
        check.turn(0, &[], 5, &at(1)).unwrap();
        check.turn(0, &[], 20, &at(3)).unwrap();
        check.reset(0);
        let err = check.turn(0, &[], 20, &at(1)).unwrap_err();
        assert!(err.contains("was at level 1 at applied index 20"), "{err}");
        // Node 2 installs a snapshot of index 30 at level 2, after node 1
        // was at 3 at index 20.
        let mut check = Check::new(2);
        check.turn(0, &[], 20, &at(3)).unwrap();
        let restored = [(30, AppliedEvent::Restored)];
        let err = check.turn(1, &restored, 30, &at(2)).unwrap_err();
        assert!(err.contains("node 2's table was at level 2 at applied index 30"), "{err}");
    }

    #[test]
    fn nodes_at_different_levels_at_one_index_are_caught() {
        let mut check = Check::new(3);
        check.turn(0, &[], 7, &at(2)).unwrap();
        check.turn(1, &[], 7, &at(2)).unwrap();
        let err = check.turn(2, &[], 7, &at(3)).unwrap_err();
        assert!(err.contains("node 3's table was at level 3 at applied index 7, but node 1's"), "{err}");
    }

    #[test]
    fn a_change_applied_above_the_level_is_caught_whichever_node_shows_it_first() {
        // A level-3 command applied at index 4 by a node at level 1 there.
        let mut check = Check::new(2);
        let err = check.turn(0, &[(4, opened(9))], 4, &at(1)).unwrap_err();
        assert!(
            err.contains(
                "node 1 applied a session's opening (a level-3 change) at index 4, but node 1's table was at level 1"
            ),
            "{err}"
        );
        // In the turn that raised the level (it ends at 3), judged once
        // another node shows a level below 2 at a later index.
        let mut check = Check::new(2);
        check.turn(0, &[(4, proclaimed())], 8, &at(3)).unwrap();
        let err = check.turn(1, &[], 6, &at(1)).unwrap_err();
        assert!(
            err.contains("node 1 applied a Proclaim (a level-2 change) at index 4, but node 2's"),
            "{err}"
        );
        // Applied after the raise: fine, and a level-2 change says nothing
        // of level 3 (the level may be 3 there).
        let mut check = Check::new(2);
        check.turn(1, &[], 6, &at(1)).unwrap();
        check.turn(0, &[(7, proclaimed())], 8, &at(3)).unwrap();
        check.turn(0, &[(9, proclaimed())], 9, &at(3)).unwrap();
    }

    #[test]
    fn a_grant_of_a_shared_key_or_a_lock_with_a_value_below_level_2_is_caught() {
        let shared = AppliedEvent::Granted {
            key: fencelock_types::Key::new(b"k-sem".to_vec()).unwrap(),
            token: token(1),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            existing: false,
            session: None,
        };
        let err = Check::new(1).turn(0, &[(2, shared)], 2, &at(1)).unwrap_err();
        assert!(err.contains("a grant of a shared key (a level-2 change) at index 2"), "{err}");
        // A plain grant is level 1, but with a value the table must be at 2.
        let valued = |value: &[u8]| {
            let mut table = at(1);
            table.apply(Command::Grant {
                key: key(),
                lease_ms: LeaseMs::new(1_000).unwrap(),
                owner: Owner::new(b"a".to_vec()).unwrap(),
                value: Value::new(value.to_vec()).unwrap(),
                session: None,
            });
            table
        };
        Check::new(1).turn(0, &[(2, granted(1, false))], 2, &valued(b"")).unwrap();
        let err = Check::new(1).turn(0, &[(2, granted(1, false))], 2, &valued(b"a")).unwrap_err();
        assert!(err.contains("node 1 applied a Grant with a value (a level-2 change) at index 2"), "{err}");
    }

    #[test]
    fn a_refusal_that_contradicts_the_nodes_table_is_caught() {
        let mut check = Check::new(1);
        check.turn(0, &[], 3, &at(2)).unwrap();
        check.turn(0, &[], 3, &at(2)).unwrap();
        check.refused(0, 3, 2).unwrap();
        let err = check.refused(0, 2, 2).unwrap_err();
        assert!(err.contains("refused a request that needs level 2 as above the cluster's level 2"), "{err}");
        let err = check.refused(0, 2, 1).unwrap_err();
        assert!(err.contains("saying the cluster is at level 1, while its table was at level 2"), "{err}");
        // The turn that answered it raised the level: decided before, fine.
        let mut check = Check::new(1);
        check.turn(0, &[], 3, &at(1)).unwrap();
        check.turn(0, &[], 5, &at(3)).unwrap();
        check.refused(0, 2, 1).unwrap();
    }

    #[test]
    fn a_cluster_not_raised_by_the_end_is_caught() {
        let mut check = Check::new(3);
        let err = check.finish(1, 1).unwrap_err();
        assert!(err.contains("founded at command level 1, ended at level 1, not 3"), "{err}");
        check.finish(2, LEVEL).unwrap();
        check.finish(LEVEL, LEVEL).unwrap();
        assert_eq!(check.judged()[2], ("levels raised", 1));
    }
}
