//! The replica's own checks: a leader's entries apply in the order it
//! proposed them.

use super::*;

fn replica() -> Replica {
    let logger = Logger::root(slog::Discard, slog::o!());
    let config = Config::new(NodeId(1), vec![NodeId(1)]);
    Replica::open(config, Recovered::default(), &logger).expect("a blank replica opens")
}

fn entry(term: u64, index: u64) -> Entry {
    Entry { term, index, ..Entry::default() }
}

#[test]
fn own_entries_applied_in_proposal_order_pass_and_older_terms_are_forgotten() {
    let mut replica = replica();
    replica.consensus.proposed = [(1, 5), (2, 7), (2, 8)].into();
    replica.applied_in_proposal_order(&entry(2, 7));
    assert_eq!(replica.consensus.proposed, [(2, 8)]);
    // An entry of an earlier term (proposed then, committed now) checks
    // nothing and takes nothing.
    replica.applied_in_proposal_order(&entry(1, 6));
    assert_eq!(replica.consensus.proposed, [(2, 8)]);
    replica.applied_in_proposal_order(&entry(2, 8));
    assert!(replica.consensus.proposed.is_empty());
}

#[test]
#[should_panic(expected = "apply in the order it proposed them")]
fn an_own_entry_that_skips_one_proposed_before_it_stops_the_node() {
    let mut replica = replica();
    replica.consensus.proposed = [(2, 7), (2, 8)].into();
    replica.applied_in_proposal_order(&entry(2, 8));
}
