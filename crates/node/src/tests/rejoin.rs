//! A node that lost its data, and first contact with peers: rejoining
//! without a vote until caught up, hellos' reports, and the record of a
//! new peer made durable before anything it caused leaves.

use super::*;

/// What node `id` would say of `about` in a hello, as a build before
/// hellos named a configuration.
fn report_of<D: TestStore>(net: &mut Net<D>, id: u64, about: u64) -> crate::rejoin::PeerReport {
    let report = net.node(id).hello_state().report_for(about);
    crate::rejoin::PeerReport { voters: Vec::new(), applied: 0, ..report }
}

/// Opens node `id` again on a blank store, as after a lost disk, rejoining
/// under `floor` (or as a new member without one).
fn reopen_blank(net: &mut Net<MemStore>, id: u64, floor: Option<crate::rejoin::Floor>) -> MemStore {
    let mut store = MemStore::new();
    if floor.is_some() {
        let membership = crate::rejoin::Membership { rejoin: floor, ..Default::default() };
        store.write(&WriteBatch { membership: Some(membership), ..Default::default() }).unwrap();
    }
    let config = test_config(id, net.replicas.len() as u64);
    net.replicas[(id - 1) as usize] = Replica::open(config, store.recover().unwrap(), &logger()).unwrap();
    net.stores[(id - 1) as usize] = store.clone();
    store
}

/// Node 1 leads and commits a grant with node 3's acknowledgement alone;
/// then node 1 goes down and node 3 loses its disk. Returns the token.
fn commit_with_node_3_then_lose_it(net: &mut Net<MemStore>) -> FencingToken {
    net.elect(1);
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    net.settle();
    let _ = applied_token(net.take_reply(RequestId(1)));
    // Node 2 misses what follows.
    net.blocked.insert((2, MessageType::MsgAppend as i32));
    net.blocked.insert((2, MessageType::MsgHeartbeat as i32));
    net.node(1).propose(RequestId(2), vec![grant("b", "o1")]);
    net.settle();
    let token = applied_token(net.take_reply(RequestId(2)));
    assert!(net.node(2).table().holder(b"b").is_none());
    net.blocked.clear();
    net.down.insert(1);
    token
}

#[test]
fn a_node_that_lost_its_data_and_started_as_new_would_issue_a_token_twice() {
    // What the rejoin rules are for: without them, node 2 is elected with
    // the blank node 3's vote and grants "b" again, under the same token.
    let mut net = Net::new(3);
    let token = commit_with_node_3_then_lose_it(&mut net);
    reopen_blank(&mut net, 3, None);
    net.node(2).campaign().unwrap();
    net.settle();
    assert!(net.node(2).is_leader_ready(), "{:?}", net.node(2).status());
    net.node(2).propose(RequestId(3), vec![grant("b", "o2")]);
    net.settle();
    assert_eq!(applied_token(net.take_reply(RequestId(3))), token, "the hazard did not show");
}

#[test]
fn a_node_that_lost_its_data_rejoins_without_a_vote_until_caught_up() {
    use crate::rejoin::{decide, Start};
    let mut net = Net::new(3);
    let token = commit_with_node_3_then_lose_it(&mut net);
    let peers: BTreeSet<u64> = [1, 2].into_iter().collect();
    // Node 1 is down and node 2 never heard from node 3: not enough to
    // decide anything.
    let mut reports = std::collections::BTreeMap::new();
    reports.insert(2, report_of(&mut net, 2, 3));
    assert!(!reports[&2].knows_you);
    assert_eq!(decide(&peers, &reports, crate::rejoin::ClusterState::New), Start::Wait);
    // Node 1 comes back: it knows node 3, so node 3 rejoins.
    net.down.clear();
    reports.insert(1, report_of(&mut net, 1, 3));
    let Start::Rejoin(floor) = decide(&peers, &reports, crate::rejoin::ClusterState::New) else {
        panic!("{reports:?}")
    };
    let store = reopen_blank(&mut net, 3, Some(floor));
    assert!(net.node(3).status().rejoining);

    // Node 2, missing "b", campaigns: node 1 refuses it and node 3 does
    // not vote, so it cannot win. Node 3 never campaigns on its own.
    net.down.insert(1);
    net.node(2).campaign().unwrap();
    for _ in 0..3_000 {
        net.node(3).tick();
    }
    net.settle();
    assert_ne!(net.node(2).status().role, crate::Role::Leader, "elected with a rejoining node's vote");
    assert_ne!(net.node(3).status().role, crate::Role::Leader);
    assert!(net.node(3).status().rejoining);

    // With node 1 back, a leader that has "b" is elected and node 3 catches
    // up: it votes again, and "b" keeps its token everywhere.
    net.down.clear();
    net.elect(1);
    net.settle();
    assert!(!net.node(3).status().rejoining, "{:?}", net.node(3).status());
    net.node(1).propose(RequestId(3), vec![grant("b", "o2")]);
    net.settle();
    assert!(
        matches!(net.take_reply(RequestId(3)), Some(Err(RequestError::Held { holder_token, .. })) if holder_token == token)
    );
    for id in 1..=3 {
        assert_eq!(net.node(id).table().holder(b"b").map(|lock| lock.token), Some(token), "node {id}");
    }
    // The floor is kept: reopened, node 3 sees at once that it caught up.
    drop(net.replicas.remove(2));
    let voters: Vec<NodeId> = (1..=3).map(NodeId).collect();
    let reopened = Replica::open(
        short_leases(Config::new(NodeId(3), voters)),
        store.clone().recover().unwrap(),
        &logger(),
    )
    .unwrap();
    assert!(!reopened.status().rejoining);
}

#[test]
fn a_rejoining_node_gives_its_vote_in_the_floor_term_to_that_term_leader() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    net.settle();
    let term = net.node(1).status().term;
    let floor = crate::rejoin::Floor { term, last_index: net.node(1).status().log.last_index };
    let store = reopen_blank(&mut net, 3, Some(floor));
    net.settle();
    let status = net.node(3).status();
    assert!(!status.rejoining);
    assert_eq!(status.term, term, "caught up without a new election");
    // Its vote in this term is taken: recorded for node 1, durably.
    assert_eq!(store.clone().recover().unwrap().hard_state.vote, 1);
}

#[test]
fn the_first_message_from_a_peer_is_recorded_before_anything_it_caused_leaves() {
    let stores: Vec<QueuedStore> = (0..3).map(|_| QueuedStore::default()).collect();
    let mut net = Net::with_stores(stores.clone());
    let term = net.node(2).status().term;
    net.node(1).campaign().unwrap();
    // Nodes 2 and 3 answer node 1's pre-vote: the first it hears from
    // them. Its vote requests, which that answer caused, wait until its
    // disk has the record of it, and its disk does not sync.
    turns_persisting(&mut net, &stores, &[2, 3], 20);
    assert_eq!(net.node(2).status().term, term, "a vote request left before the peers were recorded");
    assert_ne!(net.node(1).status().role, crate::Role::Leader);
    let known = |store: &QueuedStore| store.inner.clone().recover().unwrap().membership.known;
    assert!(known(&stores[0]).is_empty());
    turns_persisting(&mut net, &stores, &[1, 2, 3], 40);
    assert!(net.node(1).is_leader_ready());
    assert_eq!(known(&stores[0]), [2, 3].into_iter().collect());
    assert_eq!(known(&stores[1]), [1].into_iter().collect());
}

#[test]
fn a_heartbeat_that_commits_past_the_log_does_not_bring_the_node_down() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    net.settle();
    // Node 3 comes back blank; the leader still thinks it holds the log.
    reopen_blank(&mut net, 3, None);
    let mut heartbeat = Message::default();
    heartbeat.set_msg_type(MessageType::MsgHeartbeat);
    heartbeat.from = 1;
    heartbeat.to = 3;
    heartbeat.term = net.node(1).status().term;
    heartbeat.commit = net.node(1).status().log.commit_index;
    net.node(3).step(heartbeat);
    net.settle();
    assert_eq!(net.node(3).table().snapshot(), net.node(1).table().snapshot());
}

#[test]
fn a_leader_sends_nothing_early_until_a_new_peer_is_recorded() {
    let stores: Vec<QueuedStore> = (0..3).map(|_| QueuedStore::default()).collect();
    let mut net = Net::with_stores(stores.clone());
    net.down.insert(3);
    net.node(1).campaign().unwrap();
    turns_persisting(&mut net, &stores, &[1, 2, 3], 40);
    assert!(net.node(1).is_leader_ready());
    // Node 3 comes up and answers a heartbeat: the first node 1 hears from
    // it. Node 1's disk does not sync, so its appends of a new entry, which
    // would leave before its own write, wait for the record of node 3.
    net.down.clear();
    for _ in 0..3 {
        net.node(1).tick();
    }
    turns_persisting(&mut net, &stores, &[2, 3], 10);
    let last = net.node(2).status().log.last_index;
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    turns_persisting(&mut net, &stores, &[2, 3], 10);
    assert_eq!(net.node(2).status().log.last_index, last, "an append left before node 3 was recorded");
    turns_persisting(&mut net, &stores, &[1, 2, 3], 20);
    assert!(net.node(2).status().log.last_index > last);
    assert!(matches!(net.take_reply(RequestId(1)), Some(Ok(Response::Applied(_)))));
}
