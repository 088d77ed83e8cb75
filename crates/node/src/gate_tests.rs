//! Each rule of the gate, fed the message it must refuse, and the message a
//! real peer sends, which it must let through.

#![allow(clippy::unwrap_used)]

use fencelock_fsm::LockTable;
use fencelock_types::{ClusterId, Command, FencingToken, Key, LeaseMs, Owner};
use raft::prelude::{ConfState, Entry, EntryType, Message, MessageType, Snapshot};

use super::{
    check, Local, Refusal, RefusalLog, Refusals, LOG_EVERY_MS, TERM_FIRST_MAX, TERM_JUMP_MAX, TERM_MAX,
};
use crate::types::NodeId;

const VOTERS: [NodeId; 3] = [NodeId(1), NodeId(2), NodeId(3)];

/// Node 2, with a log up to 10, committed to 8, tokens issued up to 5.
fn local() -> Local<'static> {
    Local {
        id: NodeId(2),
        voters: &VOTERS,
        term: 3,
        leader: 1,
        last_index: 10,
        persisted: 10,
        commit: 8,
        last_token: FencingToken::new(5),
        cluster_id: None,
    }
}

fn message(kind: MessageType) -> Message {
    let mut message = Message::default();
    message.set_msg_type(kind);
    message.from = 1;
    message.to = 2;
    message.term = 3;
    message
}

fn entry(index: u64, term: u64) -> Entry {
    Entry { index, term, ..Default::default() }
}

/// An append of entries 11 and 12 after entry 10 of term 3.
fn append() -> Message {
    let mut append = message(MessageType::MsgAppend);
    append.index = 10;
    append.log_term = 3;
    append.commit = 9;
    append.set_entries(vec![entry(11, 3), entry(12, 3)].into());
    append
}

/// A snapshot at index 20 of a table whose tokens went up to `tokens`.
fn snapshot(tokens: u64, voters: Vec<u64>) -> Message {
    snapshot_of(tokens, voters, None)
}

fn snapshot_of(tokens: u64, voters: Vec<u64>, cluster_id: Option<ClusterId>) -> Message {
    let mut table = LockTable::new();
    if let Some(id) = cluster_id {
        table.apply(Command::Bootstrap { cluster_id: id, token_floor: 0, level: 1 });
    }
    for n in 0..tokens {
        table.apply(Command::Grant {
            session: None,
            key: Key::new(format!("k{n}").into_bytes()).unwrap(),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            owner: Owner::new(b"o".to_vec()).unwrap(),
            value: fencelock_types::Value::none(),
        });
    }
    let mut snapshot = Snapshot::default();
    snapshot.set_data(table.snapshot().into());
    snapshot.mut_metadata().index = 20;
    snapshot.mut_metadata().term = 3;
    snapshot.mut_metadata().set_conf_state(ConfState::from((voters, vec![])));
    let mut message = message(MessageType::MsgSnapshot);
    message.set_snapshot(snapshot);
    message
}

#[test]
fn what_a_real_peer_sends_passes() {
    assert_eq!(check(&append(), &local()), Ok(()));
    for kind in [
        MessageType::MsgAppendResponse,
        MessageType::MsgRequestVote,
        MessageType::MsgRequestVoteResponse,
        MessageType::MsgRequestPreVote,
        MessageType::MsgRequestPreVoteResponse,
        MessageType::MsgHeartbeat,
        MessageType::MsgHeartbeatResponse,
        MessageType::MsgTimeoutNow,
    ] {
        assert_eq!(check(&message(kind), &local()), Ok(()), "{kind:?}");
    }
    let mut ack = message(MessageType::MsgAppendResponse);
    ack.index = 10;
    assert_eq!(check(&ack, &local()), Ok(()));
    assert_eq!(check(&snapshot(5, vec![3, 1, 2]), &local()), Ok(()));
    assert_eq!(check(&snapshot(7, vec![1, 2, 3]), &local()), Ok(()));
    let mut highest = message(MessageType::MsgHeartbeat);
    highest.term = 3 + TERM_JUMP_MAX;
    assert_eq!(check(&highest, &local()), Ok(()));
}

#[test]
fn a_snapshot_of_another_cluster_is_refused() {
    let ours = ClusterId::new([1; 16]);
    let named = Local { cluster_id: Some(ours), ..local() };
    assert_eq!(check(&snapshot_of(5, vec![1, 2, 3], Some(ours)), &named), Ok(()));
    let theirs = snapshot_of(5, vec![1, 2, 3], Some(ClusterId::new([2; 16])));
    assert_eq!(check(&theirs, &named), Err(Refusal::BadSnapshot));
    assert_eq!(check(&snapshot_of(5, vec![1, 2, 3], None), &named), Err(Refusal::BadSnapshot));
    // A node that has not learnt the name yet takes the cluster's snapshot.
    assert_eq!(check(&snapshot_of(5, vec![1, 2, 3], Some(ours)), &local()), Ok(()));
}

#[test]
fn a_message_for_another_node_or_from_a_stranger_is_refused() {
    let mut other = append();
    other.to = 3;
    assert_eq!(check(&other, &local()), Err(Refusal::NotForThisNode));
    for from in [2, 0] {
        let mut stranger = append();
        stranger.from = from;
        assert_eq!(check(&stranger, &local()), Err(Refusal::NotAPeer), "from {from}");
    }
    // From outside the configuration, what a leader sends and a candidate
    // asks passes at a term no lower than this node's (a member added
    // after the configuration this node applied); no answer does.
    for from in [4, u64::MAX] {
        let mut older = append();
        older.from = from;
        older.term = 2;
        older.log_term = 2;
        older.set_entries(vec![entry(11, 2)].into());
        assert_eq!(check(&older, &local()), Err(Refusal::NotAPeer), "an append of an older term from {from}");
        for kind in [
            MessageType::MsgAppendResponse,
            MessageType::MsgRequestVoteResponse,
            MessageType::MsgRequestPreVoteResponse,
            MessageType::MsgHeartbeatResponse,
            MessageType::MsgTimeoutNow,
        ] {
            let mut other = message(kind);
            other.from = from;
            other.term = 4;
            assert_eq!(check(&other, &local()), Err(Refusal::NotAPeer), "{kind:?} from {from}");
        }
        let mut newer = append();
        newer.from = from;
        assert_eq!(check(&newer, &local()), Ok(()), "an append from {from}");
        let mut heartbeat = message(MessageType::MsgHeartbeat);
        heartbeat.from = from;
        heartbeat.term = 4;
        assert_eq!(check(&heartbeat, &local()), Ok(()), "a heartbeat from {from}");
        let mut install = snapshot(5, vec![1, 2, 3, 4]);
        install.from = from;
        assert_eq!(check(&install, &local()), Ok(()), "a snapshot from {from}");
        for kind in [MessageType::MsgRequestVote, MessageType::MsgRequestPreVote] {
            let mut vote = message(kind);
            vote.from = from;
            vote.term = 4;
            vote.index = 10;
            vote.log_term = 3;
            assert_eq!(check(&vote, &local()), Ok(()), "{kind:?} from {from}");
            vote.term = 2;
            vote.log_term = 2;
            assert_eq!(
                check(&vote, &local()),
                Err(Refusal::NotAPeer),
                "{kind:?} of an older term from {from}"
            );
        }
    }
}

#[test]
fn proposals_reads_transfers_and_local_types_are_refused() {
    for kind in [
        MessageType::MsgPropose,
        MessageType::MsgReadIndex,
        MessageType::MsgReadIndexResp,
        MessageType::MsgTransferLeader,
        MessageType::MsgHup,
        MessageType::MsgBeat,
        MessageType::MsgUnreachable,
        MessageType::MsgSnapStatus,
        MessageType::MsgCheckQuorum,
    ] {
        assert_eq!(check(&message(kind), &local()), Err(Refusal::ForbiddenType), "{kind:?}");
    }
    // The empty proposal that kills a raft-rs leader, and one that carries
    // a forged grant.
    let mut propose = message(MessageType::MsgPropose);
    propose.term = 0;
    assert_eq!(check(&propose, &local()), Err(Refusal::ForbiddenType));
    propose.set_entries(vec![Entry { data: b"forged".to_vec().into(), ..Default::default() }].into());
    assert_eq!(check(&propose, &local()), Err(Refusal::ForbiddenType));
}

#[test]
fn a_term_that_is_zero_or_could_overflow_is_refused() {
    for term in [0, TERM_MAX + 1, u64::MAX - 1, u64::MAX] {
        let mut heartbeat = message(MessageType::MsgHeartbeat);
        heartbeat.term = term;
        assert_eq!(check(&heartbeat, &local()), Err(Refusal::BadTerm), "term {term}");
    }
    // Far past the node's own term: the forged heartbeats that used to
    // brick a cluster (2^48 - 1, 2^48), refused at once.
    for term in [3 + TERM_JUMP_MAX + 1, (1 << 48) - 1, 1 << 48, TERM_MAX] {
        let mut heartbeat = message(MessageType::MsgHeartbeat);
        heartbeat.term = term;
        assert_eq!(check(&heartbeat, &local()), Err(Refusal::BadTerm), "term {term}");
    }
    let mut log_term = append();
    log_term.log_term = u64::MAX;
    assert_eq!(check(&log_term, &local()), Err(Refusal::BadTerm));
    let mut commit_term = message(MessageType::MsgAppendResponse);
    commit_term.commit_term = u64::MAX;
    assert_eq!(check(&commit_term, &local()), Err(Refusal::BadTerm));
}

#[test]
fn entries_that_do_not_follow_their_index_in_order_are_refused() {
    let cases: [(Vec<Entry>, Refusal); 6] = [
        (vec![entry(12, 3)], Refusal::BadEntries),
        (vec![entry(11, 3), entry(13, 3)], Refusal::BadEntries),
        (vec![entry(11, 3), entry(11, 3)], Refusal::BadEntries),
        (vec![entry(11, 4)], Refusal::BadTerm),
        (vec![entry(11, 2)], Refusal::BadTerm),
        (vec![entry(11, 3), entry(12, 0)], Refusal::BadTerm),
    ];
    for (entries, reason) in cases {
        let mut bad = append();
        bad.set_entries(entries.clone().into());
        assert_eq!(check(&bad, &local()), Err(reason), "{entries:?}");
    }
    let mut overflowing = append();
    overflowing.index = u64::MAX;
    overflowing.set_entries(vec![entry(0, 3)].into());
    assert_eq!(check(&overflowing, &local()), Err(Refusal::BadEntries));
    let mut far = message(MessageType::MsgHeartbeat);
    far.commit = u64::MAX;
    assert_eq!(check(&far, &local()), Err(Refusal::BadEntries));
    let mut entries_elsewhere = message(MessageType::MsgHeartbeat);
    entries_elsewhere.set_entries(vec![entry(11, 3)].into());
    assert_eq!(check(&entries_elsewhere, &local()), Err(Refusal::BadEntries));
}

#[test]
fn only_decodable_version_2_membership_changes_pass() {
    use protobuf::Message as _;
    use raft::prelude::{ConfChangeSingle, ConfChangeType, ConfChangeV2};
    let with = |kind: EntryType, data: Vec<u8>, context: Vec<u8>| {
        let mut change = append();
        let mut entry = entry(11, 3);
        entry.set_entry_type(kind);
        entry.data = data.into();
        entry.context = context.into();
        change.set_entries(vec![entry].into());
        check(&change, &local())
    };
    let change_of = |ids: &[u64]| {
        let mut change = ConfChangeV2::default();
        let singles: Vec<ConfChangeSingle> = ids
            .iter()
            .map(|id| raft_proto::new_conf_change_single(*id, ConfChangeType::AddLearnerNode))
            .collect();
        change.set_changes(singles.into());
        change.write_to_bytes().unwrap()
    };
    let context = fencelock_types::pb::ConfChangeContext::default().write_to_bytes().unwrap();
    assert_eq!(with(EntryType::EntryConfChangeV2, change_of(&[4]), context.clone()), Ok(()));
    // raft-rs's own entry to leave a joint configuration: empty.
    assert_eq!(with(EntryType::EntryConfChangeV2, Vec::new(), Vec::new()), Ok(()));
    // Version 1, never proposed; garbage; node 0; too many changes; a
    // context that is not one.
    assert_eq!(with(EntryType::EntryConfChange, Vec::new(), Vec::new()), Err(Refusal::ForbiddenEntry));
    assert_eq!(with(EntryType::EntryConfChangeV2, vec![0xff; 7], Vec::new()), Err(Refusal::ForbiddenEntry));
    assert_eq!(with(EntryType::EntryConfChangeV2, change_of(&[0]), Vec::new()), Err(Refusal::ForbiddenEntry));
    let many: Vec<u64> = (1..=super::MEMBERS_MAX as u64 + 1).collect();
    assert_eq!(
        with(EntryType::EntryConfChangeV2, change_of(&many), Vec::new()),
        Err(Refusal::ForbiddenEntry)
    );
    assert_eq!(
        with(EntryType::EntryConfChangeV2, change_of(&[4]), vec![0xff; 9]),
        Err(Refusal::ForbiddenEntry)
    );
}

#[test]
fn a_snapshot_configuration_raft_could_not_restore_is_refused() {
    use raft::prelude::ConfState;
    let conf = |voters: Vec<u64>, learners: Vec<u64>, outgoing: Vec<u64>, learners_next: Vec<u64>| {
        let mut conf = ConfState::from((voters, learners));
        conf.voters_outgoing = outgoing;
        conf.learners_next = learners_next;
        conf
    };
    // What membership changes make.
    assert!(super::conf_state_restores(&conf(vec![1, 2, 3], vec![], vec![], vec![])));
    assert!(super::conf_state_restores(&conf(vec![1, 2, 3], vec![4, 5], vec![], vec![])));
    assert!(super::conf_state_restores(&conf(vec![1, 2, 4], vec![], vec![1, 2, 3], vec![])));
    assert!(super::conf_state_restores(&conf(vec![1, 2], vec![], vec![1, 2, 3], vec![3])));
    // No voters; node 0; a voter that is a learner too; a learner-next not
    // an outgoing voter; too many members.
    assert!(!super::conf_state_restores(&conf(vec![], vec![4], vec![], vec![])));
    assert!(!super::conf_state_restores(&conf(vec![0, 1], vec![], vec![], vec![])));
    assert!(!super::conf_state_restores(&conf(vec![1, 2], vec![2], vec![], vec![])));
    assert!(!super::conf_state_restores(&conf(vec![1, 2], vec![], vec![], vec![3])));
    let many: Vec<u64> = (1..=4 * super::MEMBERS_MAX as u64 + 1).collect();
    assert!(!super::conf_state_restores(&conf(many, vec![], vec![], vec![])));

    let mut learner_and_voter = snapshot(5, vec![1, 2, 3]);
    learner_and_voter.mut_snapshot().mut_metadata().mut_conf_state().learners = vec![3];
    assert_eq!(check(&learner_and_voter, &local()), Err(Refusal::BadSnapshot));
    // A grown cluster's snapshot passes.
    let mut grown = snapshot(5, vec![1, 2, 3, 4]);
    grown.mut_snapshot().mut_metadata().mut_conf_state().learners = vec![5];
    assert_eq!(check(&grown, &local()), Ok(()));
}

#[test]
fn an_acknowledgement_past_the_last_index_is_refused() {
    let mut ack = message(MessageType::MsgAppendResponse);
    ack.index = 11;
    assert_eq!(check(&ack, &local()), Err(Refusal::AckPastLastIndex));
}

#[test]
fn a_rejection_hinting_past_the_log_or_asking_for_a_snapshot_is_refused() {
    let mut reject = message(MessageType::MsgAppendResponse);
    reject.reject = true;
    reject.index = super::INDEX_MAX;
    reject.reject_hint = 10;
    assert_eq!(check(&reject, &local()), Ok(()));
    reject.reject_hint = 11;
    assert_eq!(check(&reject, &local()), Err(Refusal::AckPastLastIndex));
    let mut snapshot_please = message(MessageType::MsgAppendResponse);
    snapshot_please.request_snapshot = 5;
    assert_eq!(check(&snapshot_please, &local()), Err(Refusal::AckPastLastIndex));
}

#[test]
fn a_log_position_without_a_term_or_past_the_senders_is_refused() {
    let mut no_term = append();
    no_term.log_term = 0;
    assert_eq!(check(&no_term, &local()), Err(Refusal::BadTerm));
    let mut vote = message(MessageType::MsgRequestVote);
    vote.index = 10;
    vote.log_term = 4;
    assert_eq!(check(&vote, &local()), Err(Refusal::BadTerm));
    vote.log_term = 3;
    assert_eq!(check(&vote, &local()), Ok(()));
}

#[test]
fn a_vote_answer_before_the_log_is_durable_or_a_timeout_not_from_the_leader_is_refused() {
    let unpersisted = Local { persisted: 9, ..local() };
    for kind in [MessageType::MsgRequestVoteResponse, MessageType::MsgRequestPreVoteResponse] {
        assert_eq!(check(&message(kind), &unpersisted), Err(Refusal::NotNow), "{kind:?}");
    }
    let mut timeout = message(MessageType::MsgTimeoutNow);
    timeout.from = 3;
    assert_eq!(check(&timeout, &local()), Err(Refusal::NotNow));
    let mut later = message(MessageType::MsgTimeoutNow);
    later.term = 4;
    assert_eq!(check(&later, &local()), Err(Refusal::NotNow));
}

#[test]
fn a_snapshot_that_would_erase_locks_or_move_tokens_back_is_refused() {
    // Tokens behind this node's 5: a forged empty table.
    assert_eq!(check(&snapshot(0, vec![1, 2, 3]), &local()), Err(Refusal::BadSnapshot));
    assert_eq!(check(&snapshot(4, vec![1, 2, 3]), &local()), Err(Refusal::BadSnapshot));
    // A configuration raft-rs could not restore.
    assert_eq!(check(&snapshot(5, vec![]), &local()), Err(Refusal::BadSnapshot));
    // Not ahead of the commit index.
    let mut old = snapshot(5, vec![1, 2, 3]);
    old.mut_snapshot().mut_metadata().index = 8;
    assert_eq!(check(&old, &local()), Err(Refusal::BadSnapshot));
    // Bytes that are no lock table.
    let mut garbage = snapshot(5, vec![1, 2, 3]);
    garbage.mut_snapshot().set_data(b"not a lock table".to_vec().into());
    assert_eq!(check(&garbage, &local()), Err(Refusal::BadSnapshot));
    // A term past the message's.
    let mut future = snapshot(5, vec![1, 2, 3]);
    future.mut_snapshot().mut_metadata().term = 4;
    assert_eq!(check(&future, &local()), Err(Refusal::BadTerm));
}

#[test]
fn refusals_are_counted_by_reason_and_logged_once_per_interval() {
    let mut refusals = Refusals::default();
    refusals.count(Refusal::BadTerm);
    refusals.count(Refusal::BadTerm);
    refusals.count(Refusal::NotAPeer);
    assert_eq!(
        (refusals.get(Refusal::BadTerm), refusals.get(Refusal::NotAPeer), refusals.total()),
        (2, 1, 3)
    );
    let mut log = RefusalLog::default();
    assert_eq!(log.should_log(Refusal::BadTerm, 100), Some(0));
    assert_eq!(log.should_log(Refusal::BadTerm, 200), None);
    assert_eq!(log.should_log(Refusal::BadTerm, 300), None);
    // Another reason has a line of its own.
    assert_eq!(log.should_log(Refusal::NotAPeer, 300), Some(0));
    assert_eq!(log.should_log(Refusal::BadTerm, 100 + LOG_EVERY_MS), Some(2));
    let names: std::collections::BTreeSet<&str> = Refusal::ALL.iter().map(|reason| reason.name()).collect();
    assert_eq!(names.len(), Refusal::ALL.len());
}

#[test]
fn the_term_bound_follows_the_node_s_own_term_and_never_reaches_the_ceiling() {
    // A node at term 0 (blank, or a learner never contacted) may join a
    // cluster far along; past that, the bound moves with the node's term.
    assert_eq!(super::term_bound(0), TERM_FIRST_MAX);
    assert_eq!(super::term_bound(1), 1 + TERM_JUMP_MAX);
    assert_eq!(super::term_bound(TERM_FIRST_MAX), TERM_FIRST_MAX + TERM_JUMP_MAX);
    assert_eq!(super::term_bound(u64::MAX), TERM_MAX);
    // A node whose term was pushed to 2^48 by a build before the relative
    // bound: its next campaign (2^48 + 1) is taken by its peers at 2^48, so
    // the cluster elects again.
    let poisoned = Local { term: 1 << 48, ..local() };
    let mut vote = message(MessageType::MsgRequestPreVote);
    vote.term = (1 << 48) + 1;
    vote.index = 10;
    vote.log_term = 3;
    assert_eq!(check(&vote, &poisoned), Ok(()));
    // raft-rs's `term + 1` at the ceiling cannot overflow.
    const { assert!(TERM_MAX < u64::MAX / 2) };
}

/// An append whose entry 11 carries `commands`.
fn append_of(commands: &[Command]) -> Message {
    let mut append = append();
    append.mut_entries()[0].data = fencelock_types::encode_batch(commands).into();
    append
}

#[test]
fn entries_past_the_builds_level_or_the_token_bound_are_refused() {
    let level = fencelock_types::LEVEL;
    let cluster_id = ClusterId::new([7; 16]);
    assert_eq!(check(&append_of(&[Command::RaiseLevel { level }]), &local()), Ok(()));
    assert_eq!(
        check(&append_of(&[Command::Noop, Command::RaiseLevel { level: level + 1 }]), &local()),
        Err(Refusal::AboveBuildLevel)
    );
    assert_eq!(
        check(&append_of(&[Command::Bootstrap { cluster_id, token_floor: 9, level: level + 1 }]), &local()),
        Err(Refusal::AboveBuildLevel)
    );
    let floor = |token_floor| append_of(&[Command::Bootstrap { cluster_id, token_floor, level: 1 }]);
    assert_eq!(check(&floor(super::TOKENS_MAX), &local()), Ok(()));
    assert_eq!(check(&floor(super::TOKENS_MAX + 1), &local()), Err(Refusal::ForbiddenEntry));
    assert_eq!(check(&floor(u64::MAX), &local()), Err(Refusal::ForbiddenEntry));
}

#[test]
fn snapshots_past_the_builds_level_or_the_token_bound_are_refused() {
    let with = |command: Command| {
        let mut message = snapshot(5, vec![1, 2, 3]);
        let mut table = LockTable::restore(message.get_snapshot().get_data()).unwrap();
        table.apply(command);
        message.mut_snapshot().set_data(table.snapshot().into());
        message
    };
    let level = fencelock_types::LEVEL;
    assert_eq!(check(&with(Command::RaiseLevel { level }), &local()), Ok(()));
    assert_eq!(
        check(&with(Command::RaiseLevel { level: level + 1 }), &local()),
        Err(Refusal::AboveBuildLevel)
    );
    let cluster_id = ClusterId::new([7; 16]);
    let floor = |token_floor| with(Command::Bootstrap { cluster_id, token_floor, level: 1 });
    assert_eq!(check(&floor(super::TOKENS_MAX), &local()), Ok(()));
    assert_eq!(check(&floor(u64::MAX), &local()), Err(Refusal::BadSnapshot));
}
