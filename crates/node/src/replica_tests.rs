//! The replica's own checks: a leader's entries apply in the order it
//! proposed them; an entry's proposer is read as a full decode reads it.

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

fn tags(proposer: u64, requests: &[(u64, u32)]) -> pb::EntryTags {
    let requests = requests.iter().map(|(id, commands)| pb::RequestTag {
        request_id: *id,
        commands: *commands,
        ..Default::default()
    });
    pb::EntryTags { proposer, requests: requests.collect::<Vec<_>>().into(), ..Default::default() }
}

proptest::proptest! {
    /// The proposer read alone is the one a full decode of the tags gives,
    /// whatever the tags.
    #[test]
    fn the_proposer_read_alone_is_the_full_decodes(
        proposer in 0u64..5,
        requests in proptest::collection::vec((0u64..u64::MAX, 0u32..100), 0..70),
    ) {
        let bytes = tags(proposer, &requests).write_to_bytes().unwrap();
        let decoded = pb::EntryTags::parse_from_bytes(&bytes).unwrap();
        proptest::prop_assert_eq!(tags_proposer(&bytes).unwrap(), decoded.proposer);
    }
}

#[test]
fn a_proposer_given_twice_is_read_as_the_last_and_nonsense_is_an_error() {
    // Protobuf keeps the last of a field given twice: so does the reader.
    let mut bytes = tags(2, &[(7, 1)]).write_to_bytes().unwrap();
    bytes.extend(tags(5, &[]).write_to_bytes().unwrap());
    assert_eq!(pb::EntryTags::parse_from_bytes(&bytes).unwrap().proposer, 5);
    assert_eq!(tags_proposer(&bytes).unwrap(), 5);
    assert_eq!(tags_proposer(&[]).unwrap(), 0);
    // A truncated varint, a length past the end.
    assert!(tags_proposer(&[0x08, 0x80]).is_err());
    assert!(tags_proposer(&[0x12, 0x09, 0x08]).is_err());
}
