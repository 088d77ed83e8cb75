//! What a node's hello says of its raft state, in one place: the node
//! builds it ([`HelloState`], then [`HelloState::report_for`] each peer), the
//! network layer writes it into the [`PeerHello`] that opens a peer
//! connection and reads it back out ([`PeerReport::write`],
//! [`PeerReport::read`]) without looking at terms or levels, and the
//! receiving node decides from it (how to start, a peer's level).
//!
//! The hello's other fields (node id, addresses, cluster id) are the
//! network layer's: it routes and refuses connections by them.

use std::collections::BTreeSet;

use crate::client_pb::PeerHello;

/// The most voters a hello's configuration is read with (a configuration
/// has at most 64 members; the rest of a longer list is dropped).
pub const MEMBERS_IN_HELLO_MAX: usize = 64;

/// What a peer said of itself and of this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerReport {
    /// The peer has had raft messages from this node before.
    pub knows_you: bool,
    pub term: u64,
    pub last_index: u64,
    /// The command level the peer's build applies (0: a build before
    /// levels, which applies level 1).
    pub level: u32,
    /// The peer's hello names a cluster: it is a member of a running (or
    /// once running) cluster, whose id it has applied.
    pub named: bool,
    /// The voters of the configuration the peer applied (empty while it
    /// starts, and from builds before this field), and the index it had
    /// applied then: of two reports, the one applied further names the
    /// newer configuration (configurations change only by applying
    /// entries). A blank node decides from the newest it hears, not from
    /// its `--peers`, which go stale as members change.
    pub voters: Vec<u64>,
    pub applied: u64,
}

impl PeerReport {
    /// What `hello` says (`named`: it names a cluster). A voter list longer
    /// than a configuration can be is cut.
    pub fn read(hello: &PeerHello) -> PeerReport {
        PeerReport {
            knows_you: hello.knows_you,
            term: hello.term,
            last_index: hello.last_index,
            level: hello.level,
            named: !hello.cluster_id.is_empty(),
            voters: hello.voters.iter().copied().take(MEMBERS_IN_HELLO_MAX).collect(),
            applied: hello.applied,
        }
    }

    /// Writes the report into `hello`; `named` is the hello's cluster id,
    /// which the network layer sets.
    pub fn write(&self, hello: &mut PeerHello) {
        hello.knows_you = self.knows_you;
        hello.term = self.term;
        hello.last_index = self.last_index;
        hello.level = self.level;
        hello.voters.clone_from(&self.voters);
        hello.applied = self.applied;
    }
}

/// What every hello of a node says: only `knows_you` differs per peer.
/// The default is a starting node's: nothing yet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HelloState {
    pub term: u64,
    pub last_index: u64,
    /// The peers this node has had raft messages from.
    pub known: BTreeSet<u64>,
    /// It has applied a cluster id.
    pub named: bool,
    /// The voters of its configuration, and the index it has applied.
    pub voters: Vec<u64>,
    pub applied: u64,
}

impl HelloState {
    /// The report of a hello to `peer`, at this build's command level.
    pub fn report_for(&self, peer: u64) -> PeerReport {
        PeerReport {
            knows_you: self.known.contains(&peer),
            term: self.term,
            last_index: self.last_index,
            level: crate::LEVEL,
            named: self.named,
            voters: self.voters.clone(),
            applied: self.applied,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_survives_its_hello_and_says_named_by_the_cluster_id() {
        let state = HelloState {
            term: 7,
            last_index: 42,
            known: [2, 3].into_iter().collect(),
            named: true,
            voters: vec![1, 2, 3],
            applied: 40,
        };
        let report = state.report_for(2);
        assert!(report.knows_you && !state.report_for(4).knows_you);
        let mut hello = PeerHello { cluster_id: vec![1; 16], ..Default::default() };
        report.write(&mut hello);
        assert_eq!(PeerReport::read(&hello), report);
        // Without a cluster id the hello names none, whatever was built.
        hello.cluster_id.clear();
        assert!(!PeerReport::read(&hello).named);
    }

    #[test]
    fn a_starting_nodes_hello_says_only_its_level_and_a_long_voter_list_is_cut() {
        assert_eq!(
            HelloState::default().report_for(2),
            PeerReport { level: crate::LEVEL, ..PeerReport::default() }
        );
        let hello = PeerHello { voters: (1..=1_000).collect(), ..Default::default() };
        assert_eq!(PeerReport::read(&hello).voters.len(), MEMBERS_IN_HELLO_MAX);
    }
}
