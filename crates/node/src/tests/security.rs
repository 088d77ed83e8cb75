//! Messages a node must not act on: from strangers or for others, forged
//! raft messages, and a snapshot that does not restore.

use super::*;

#[test]
fn a_snapshot_that_does_not_restore_is_dropped_and_the_node_serves_on() {
    let mut net = Net::new(3);
    net.elect(1);
    let term = net.node(2).status().term;
    let mut message = Message::default();
    message.set_msg_type(MessageType::MsgSnapshot);
    message.to = 2;
    message.from = 3;
    message.term = term + 5;
    let mut snapshot = Snapshot::default();
    snapshot.set_data(b"not a lock table".to_vec().into());
    snapshot.mut_metadata().index = 1_000;
    snapshot.mut_metadata().term = term + 5;
    message.set_snapshot(snapshot);
    net.node(2).step(message);
    net.settle();
    assert_eq!(net.node(2).status().term, term);
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    net.settle();
    assert!(matches!(net.take_reply(RequestId(1)), Some(Ok(Response::Applied(_)))));
    assert_eq!(net.node(2).table().len(), 1);
}

#[test]
fn messages_from_strangers_or_for_others_are_dropped() {
    let mut net = Net::new(3);
    net.elect(1);
    let term = net.node(2).status().term;
    // A stranger may send what a leader sends or a candidate asks (it may
    // be a member of a configuration node 2 missed), never an answer; no
    // one may send as node 2 or to another node.
    for (from, to, kind) in [
        (9, 2, MessageType::MsgRequestVoteResponse),
        (9, 2, MessageType::MsgRequestPreVoteResponse),
        (9, 2, MessageType::MsgHeartbeatResponse),
        (2, 2, MessageType::MsgHeartbeat),
        (1, 3, MessageType::MsgHeartbeat),
    ] {
        let mut message = Message::default();
        message.set_msg_type(kind);
        message.from = from;
        message.to = to;
        message.term = term + 10;
        message.commit = 1_000;
        net.node(2).step(message);
    }
    // Nor a stranger's heartbeat from an earlier term.
    let mut stale = Message::default();
    stale.set_msg_type(MessageType::MsgHeartbeat);
    stale.from = 9;
    stale.to = 2;
    stale.term = term - 1;
    net.node(2).step(stale);
    assert_eq!(net.node(2).stats().refused.get(crate::gate::Refusal::NotAPeer), 5);
    net.settle();
    assert_eq!(net.node(2).status().term, term, "a stranger moved the term");
    assert_eq!(net.node(2).status().leader, Some(NodeId(1)));
}

/// Every forged message of the security review, to a follower and to the
/// leader: no node dies, no term is taken from them, nothing they carry
/// reaches the table, and tokens go on increasing.
#[test]
fn forged_raft_messages_are_dropped_and_the_cluster_serves_on() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    net.settle();
    let first = applied_token(net.take_reply(RequestId(1)));
    let term = net.node(1).status().term;
    let table = net.node(1).table().snapshot();

    for to in [1, 2] {
        let from = if to == 1 { 3 } else { 1 };
        // A heartbeat whose term would overflow at the next election.
        let mut huge = forged(&mut net, MessageType::MsgHeartbeat, from, to);
        huge.term = u64::MAX;
        net.node(to).step(huge);
        // The empty proposal that kills a raft-rs leader, and one that
        // carries a grant of its own.
        let empty = forged(&mut net, MessageType::MsgPropose, from, to);
        net.node(to).step(empty);
        let mut steal = forged(&mut net, MessageType::MsgPropose, from, to);
        let batch = fencelock_types::encode_batch(&[grant("a", "thief")]);
        steal.set_entries(vec![Entry { data: batch.into(), ..Default::default() }].into());
        net.node(to).step(steal);
        // An acknowledgement of entries the leader never wrote.
        let mut ack = forged(&mut net, MessageType::MsgAppendResponse, from, to);
        ack.index = net.node(to).status().log.last_index + 100;
        net.node(to).step(ack);
        // A snapshot far ahead that would erase the locks and restart tokens.
        let mut snapshot = Snapshot::default();
        snapshot.set_data(fencelock_fsm::LockTable::new().snapshot().into());
        snapshot.mut_metadata().index = net.node(to).status().log.commit_index + 100;
        snapshot.mut_metadata().term = term;
        snapshot.mut_metadata().set_conf_state(raft::prelude::ConfState::from((vec![1, 2, 3], vec![])));
        let mut install = forged(&mut net, MessageType::MsgSnapshot, from, to);
        install.set_snapshot(snapshot);
        net.node(to).step(install);
        // A membership change slipped into an append.
        let mut change = forged(&mut net, MessageType::MsgAppend, from, to);
        let last = net.node(to).status().log.last_index;
        change.index = last;
        change.log_term = term;
        let mut entry = Entry { index: last + 1, term, ..Default::default() };
        entry.set_entry_type(raft::prelude::EntryType::EntryConfChange);
        change.set_entries(vec![entry].into());
        net.node(to).step(change);
        net.settle();
        assert!(net.node(to).stats().refused.total() >= 6, "node {to}: {:?}", net.node(to).stats().refused);
    }
    for id in 1..=3 {
        let status = net.node(id).status();
        assert_eq!(status.term, term, "node {id} took a forged term");
        assert_eq!(net.node(id).table().snapshot(), table, "node {id}'s table changed");
    }
    net.node(1).propose(RequestId(2), vec![grant("b", "o1")]);
    net.settle();
    assert!(applied_token(net.take_reply(RequestId(2))) > first, "tokens did not go on increasing");
}
