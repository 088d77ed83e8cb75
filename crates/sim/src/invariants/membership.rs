//! Membership, judged from what the simulation sees of it: the roles the
//! nodes report, the nodes that stop as removed, the operator's
//! acknowledged changes (`crate::membership`), and each member's
//! configuration at the end.
//!
//! - At most one node leads each term, across every node, restart and
//!   configuration (a node that wins a term twice, after a restart, is one
//!   leader).
//! - A node stops as removed only after the operator asked to remove it.
//! - At the end, every member holds the same member set, no node that
//!   stopped as removed is in it, and every change the operator was told
//!   applied stands in it: an added node is a member, a promoted one a
//!   voter, a removed one gone (a change asked since for the same node and
//!   never answered leaves it in doubt, and unjudged).

use std::collections::{BTreeMap, BTreeSet};

/// What an acknowledged change made of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    Learner,
    Voter,
    Gone,
}

/// A node's view of the members at the end: (node, is a voter), in node
/// order.
pub type Members = Vec<(usize, bool)>;

#[derive(Debug, Default)]
pub struct Check {
    /// The node that led each term.
    leaders: BTreeMap<u64, usize>,
    /// Per node: what its last acknowledged change made of it.
    expected: BTreeMap<usize, Expected>,
    /// Nodes with a change asked and not yet answered.
    in_doubt: BTreeSet<usize>,
    /// Nodes the operator asked to remove, answered or not.
    asked_removed: BTreeSet<usize>,
    /// Nodes that stopped as removed.
    stopped: BTreeSet<usize>,
    acknowledged: u64,
}

impl Check {
    /// Node `node` became leader in `term`.
    pub fn elected(&mut self, node: usize, term: u64) -> Result<(), String> {
        match self.leaders.insert(term, node) {
            Some(earlier) if earlier != node => {
                Err(format!("nodes {} and {} both led term {term}", earlier + 1, node + 1))
            }
            _ => Ok(()),
        }
    }

    /// The operator asks for a change of `node`'s membership.
    pub fn asked(&mut self, node: usize, removal: bool) {
        self.in_doubt.insert(node);
        if removal {
            self.asked_removed.insert(node);
        }
    }

    /// The operator was told its change of `node` applied.
    pub fn acknowledged(&mut self, node: usize, expected: Expected) {
        self.in_doubt.remove(&node);
        self.expected.insert(node, expected);
        self.acknowledged += 1;
    }

    /// Node `node` stopped, saying it applied its removal at `index`.
    pub fn stopped_removed(&mut self, node: usize, index: u64) -> Result<(), String> {
        if !self.asked_removed.contains(&node) {
            return Err(format!(
                "node {} stopped as removed from the cluster at index {index}, but no one asked to remove it",
                node + 1
            ));
        }
        self.stopped.insert(node);
        Ok(())
    }

    /// At the end: each member's view of the members.
    pub fn finish(&self, views: &[(usize, Members)]) -> Result<(), String> {
        let Some((first, members)) = views.first() else { return Ok(()) };
        for (node, view) in views {
            if view != members {
                return Err(format!(
                    "node {} holds the members {} and node {} holds {}",
                    first + 1,
                    names(members),
                    node + 1,
                    names(view)
                ));
            }
        }
        let role = |node: usize| members.iter().find(|(member, _)| *member == node).map(|(_, voter)| *voter);
        if let Some(node) = self.stopped.iter().find(|node| role(**node).is_some()) {
            return Err(format!(
                "node {} stopped as removed, yet is a member at the end: {}",
                node + 1,
                names(members)
            ));
        }
        for (node, expected) in &self.expected {
            if self.in_doubt.contains(node) {
                continue;
            }
            let holds = match (expected, role(*node)) {
                (Expected::Learner, Some(voter)) => !voter,
                (Expected::Voter, Some(voter)) => voter,
                (Expected::Gone, None) => true,
                _ => false,
            };
            if !holds {
                return Err(format!(
                    "the operator was told node {} is {expected:?}, but the members at the end are {}",
                    node + 1,
                    names(members)
                ));
            }
        }
        Ok(())
    }

    /// How often each check judged something.
    pub fn judged(&self) -> [(&'static str, u64); 2] {
        [("terms led", self.leaders.len() as u64), ("membership changes", self.acknowledged)]
    }
}

fn names(members: &Members) -> String {
    let named: Vec<String> = members
        .iter()
        .map(|(node, voter)| format!("{}{}", node + 1, if *voter { "" } else { " (learner)" }))
        .collect();
    format!("[{}]", named.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_leaders_of_one_term_are_caught() {
        let mut check = Check::default();
        check.elected(0, 3).unwrap();
        // The same node again (a restart), and another term.
        check.elected(0, 3).unwrap();
        check.elected(1, 4).unwrap();
        let err = check.elected(2, 3).unwrap_err();
        assert!(err.contains("nodes 1 and 3 both led term 3"), "{err}");
        assert_eq!(check.judged()[0], ("terms led", 2));
    }

    #[test]
    fn a_node_that_stops_as_removed_unasked_is_caught() {
        let mut check = Check::default();
        let err = check.stopped_removed(1, 40).unwrap_err();
        assert!(
            err.contains("node 2 stopped as removed from the cluster at index 40, but no one asked"),
            "{err}"
        );
        check.asked(1, true);
        check.stopped_removed(1, 40).unwrap();
        // Asked to be added or promoted is not asked to be removed.
        check.asked(3, false);
        assert!(check.stopped_removed(3, 41).is_err());
    }

    #[test]
    fn members_that_disagree_at_the_end_are_caught() {
        let check = Check::default();
        let views = [(0, vec![(0, true), (1, true), (2, true)]), (1, vec![(0, true), (1, true), (2, false)])];
        let err = check.finish(&views).unwrap_err();
        assert!(
            err.contains("node 1 holds the members [1, 2, 3] and node 2 holds [1, 2, 3 (learner)]"),
            "{err}"
        );
    }

    #[test]
    fn an_acknowledged_change_that_did_not_stand_is_caught() {
        let members = vec![(0, true), (1, true), (3, false)];
        let views: Vec<(usize, Members)> =
            [0, 1, 3].into_iter().map(|node| (node, members.clone())).collect();
        // Told removed, still a member.
        let mut check = Check::default();
        check.asked(1, true);
        check.acknowledged(1, Expected::Gone);
        let err = check.finish(&views).unwrap_err();
        assert!(
            err.contains("told node 2 is Gone, but the members at the end are [1, 2, 4 (learner)]"),
            "{err}"
        );
        // Told promoted, still a learner; told added, missing.
        let mut check = Check::default();
        check.acknowledged(3, Expected::Voter);
        assert!(check.finish(&views).unwrap_err().contains("told node 4 is Voter"));
        let mut check = Check::default();
        check.acknowledged(4, Expected::Learner);
        assert!(check.finish(&views).unwrap_err().contains("told node 5 is Learner"));
        // A node that stopped as removed is no member.
        let mut check = Check::default();
        check.asked(3, true);
        check.stopped_removed(3, 9).unwrap();
        assert!(check.finish(&views).unwrap_err().contains("node 4 stopped as removed, yet is a member"));
    }

    #[test]
    fn changes_that_stand_or_are_in_doubt_pass() {
        let members = vec![(0, true), (2, true), (3, false)];
        let views: Vec<(usize, Members)> =
            [0, 2, 3].into_iter().map(|node| (node, members.clone())).collect();
        let mut check = Check::default();
        check.acknowledged(3, Expected::Learner);
        check.asked(1, true);
        check.acknowledged(1, Expected::Gone);
        check.stopped_removed(1, 12).unwrap();
        check.acknowledged(2, Expected::Voter);
        // Node 4's promotion was asked and never answered: in doubt.
        check.asked(3, false);
        check.finish(&views).unwrap();
        check.acknowledged(3, Expected::Learner);
        check.finish(&views).unwrap();
        assert_eq!(check.judged()[1], ("membership changes", 4));
        assert!(Check::default().finish(&[]).is_ok(), "no views, nothing to judge");
    }
}
