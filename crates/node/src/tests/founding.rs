//! Founding a cluster and its command level: the cluster's name, the
//! token floor, raising the level once every member knows it, and a
//! replica whose build is behind the cluster's level.

use super::*;

#[test]
fn the_first_leader_names_the_cluster_and_the_name_outlives_leaders_and_restarts() {
    let stores: Vec<MemStore> = (0..3).map(|_| MemStore::new()).collect();
    let mut net = Net::with_stores(stores.clone());
    assert!(net.replicas.iter().all(|replica| replica.cluster_id().is_none()));
    net.elect(2);
    net.settle();
    let named = net.node(2).cluster_id().expect("the first leader names the cluster");
    // The name it drew (each node draws its own: here, made from its id).
    assert_eq!(named, test_config(2, 3).founding.cluster_id);
    for id in [3, 1] {
        net.elect(id);
        net.settle();
        for replica in &net.replicas {
            assert_eq!(replica.cluster_id(), Some(named), "node {:?}", replica.status().id);
        }
    }
    drop(net);
    let mut net = Net::with_stores(stores);
    net.elect(3);
    net.settle();
    for replica in &net.replicas {
        assert_eq!(replica.status().cluster_id, Some(named));
    }
}

#[test]
fn the_founding_leader_raises_tokens_to_its_floor_before_any_grant() {
    let stores: Vec<MemStore> = (0..3).map(|_| MemStore::new()).collect();
    let mut net = Net::build(stores, |config| config.founding.token_floor = 5_000 + config.id.0);
    net.elect(2);
    net.node(2).propose(RequestId(1), vec![grant("a", "o1")]);
    net.settle();
    // Node 2 founded the cluster: its floor, and the first grant above it.
    assert_eq!(applied_token(net.take_reply(RequestId(1))), FencingToken::new(5_003).unwrap());
    net.elect(3);
    net.node(3).propose(RequestId(2), vec![grant("b", "o1")]);
    net.settle();
    assert_eq!(applied_token(net.take_reply(RequestId(2))), FencingToken::new(5_004).unwrap());
}

#[test]
fn a_grant_asked_before_the_founding_leader_is_ready_still_gets_a_token_above_the_floor() {
    // A request that reaches a new leader before it is ready waits; the
    // founding entry must go first, or that grant takes token 1 in a
    // cluster re-created from nothing.
    let stores: Vec<MemStore> = (0..3).map(|_| MemStore::new()).collect();
    let mut net = Net::build(stores, |config| config.founding.token_floor = 5_000);
    net.node(1).campaign().unwrap();
    let mut turns = 0;
    while net.node(1).status().role != crate::Role::Leader {
        net.turn().unwrap();
        turns += 1;
        assert!(turns < 100, "node 1 never led");
    }
    assert!(!net.node(1).is_leader_ready());
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    net.settle();
    let token = applied_token(net.take_reply(RequestId(1)));
    assert!(token.get() > 5_000, "token {token} was issued below the founding floor");
}

#[test]
fn a_cluster_from_before_command_levels_takes_shared_locks_once_every_member_says_it_knows_them() {
    use fencelock_types::Share;
    // Founded as a build before levels founds: level 1.
    let mut net = Net::with_config(3, |config| config.founding.founding_level = 1);
    net.elect(1);
    assert_eq!(net.node(1).table().level(), 1);
    let lease_ms = LeaseMs::new(30_000).unwrap();
    let shared = |net: &mut Net<MemStore>, id: u64| {
        net.node(1).acquire_shared(RequestId(id), key("rw"), lease_ms, owner("r"), Share::Read, 0);
        net.settle();
        net.take_reply(RequestId(id))
    };
    let last_token = net.node(1).table().last_token();
    // Refused before anything is proposed, naming the members to upgrade.
    let refused = shared(&mut net, 1);
    assert!(
        matches!(&refused, Some(Err(RequestError::LevelNotReached { needed: 2, level: 1, behind })) if behind == &[NodeId(2), NodeId(3)]),
        "{refused:?}"
    );
    let value = Value::new(b"leader-1".to_vec()).unwrap();
    net.node(1).acquire(RequestId(2), key("e"), lease_ms, owner("c"), value, 0);
    net.settle();
    assert!(matches!(net.take_reply(RequestId(2)), Some(Err(RequestError::LevelNotReached { .. }))));
    assert_eq!(net.node(1).table().last_token(), last_token);
    // Node 2 knows level 2; node 3 is a build before levels (0): no raise.
    net.node(1).peer_level(NodeId(2), fencelock_types::LEVEL);
    net.node(1).peer_level(NodeId(3), 0);
    net.settle();
    assert_eq!(net.node(1).table().level(), 1);
    let refused = shared(&mut net, 3);
    assert!(
        matches!(&refused, Some(Err(RequestError::LevelNotReached { behind, .. })) if behind == &[NodeId(3)]),
        "{refused:?}"
    );
    // Node 3 upgraded: its new hello says so, and the leader raises the
    // level on every replica.
    net.node(1).peer_level(NodeId(3), fencelock_types::LEVEL);
    net.settle();
    for id in 1..=3 {
        assert_eq!(net.node(id).table().level(), fencelock_types::LEVEL);
    }
    let token = applied_token(shared(&mut net, 4));
    assert!(Some(token) > last_token);
    for id in 1..=3 {
        assert!(net.node(id).table().holds(b"rw", token));
    }
}

/// A level past this build's, in an entry from the network, is refused by
/// the followers' gate (`above_build_level`): it never commits, and no node
/// stops (before, every replica applied it and stopped, and again at every
/// restart: one forged append crash-looped a plain-TCP cluster).
#[test]
fn entries_that_raise_the_level_past_the_build_are_refused_not_applied() {
    let mut net = Net::new(3);
    net.elect(1);
    let above = fencelock_types::LEVEL + 1;
    net.node(1).propose(RequestId(1), vec![Command::RaiseLevel { level: above }]);
    for _ in 0..100 {
        if let Err(err) = net.turn() {
            panic!("a node stopped: {err:?}");
        }
    }
    for id in 1..=3 {
        assert!(net.node(id).table().level() <= fencelock_types::LEVEL, "node {id} applied it");
    }
    for id in 2..=3 {
        let refused = net.node(id).stats().refused.get(crate::gate::Refusal::AboveBuildLevel);
        assert!(refused > 0, "node {id} did not refuse it");
    }
}

/// The replica's own stop, behind the gate: a table whose level passes the
/// build's (as a leader's own entry would make it) stops the replica.
#[test]
fn a_replica_stops_when_its_table_level_passes_its_build() {
    let mut net = Net::new(1);
    net.elect(1);
    let above = fencelock_types::LEVEL + 1;
    net.node(1).propose(RequestId(1), vec![Command::RaiseLevel { level: above }]);
    let mut stopped = None;
    for _ in 0..100 {
        if let Err(err) = net.turn() {
            stopped = Some(err);
            break;
        }
    }
    assert!(matches!(stopped, Some(FatalError::TooOld { level }) if level == above), "{stopped:?}");
}

#[test]
fn a_cluster_founded_at_this_builds_level_is_never_raised_to_it_again() {
    // The window: the new leader is ready and has proposed its Bootstrap,
    // which has not applied yet (the table is unfounded, at level 1). A
    // tick then must not take the unfounded table's level for the
    // cluster's and propose a RaiseLevel to the level being founded.
    let mut net = Net::new(3);
    for id in 2..=3 {
        net.node(1).peer_level(NodeId(id), fencelock_types::LEVEL);
    }
    net.node(1).campaign().unwrap();
    for _ in 0..100 {
        net.turn().unwrap();
        if net.node(1).status().leader_ready {
            break;
        }
    }
    assert!(net.node(1).status().leader_ready);
    assert!(net.node(1).table().cluster_id().is_none(), "the Bootstrap applied already: no window to test");
    // The Bootstrap is the leader's last entry: proposed as it became ready.
    let bootstrap_index = net.node(1).status().log.last_index;
    net.node(1).tick();
    net.settle();
    assert!(net.node(1).table().cluster_id().is_some());
    for id in 1..=3 {
        let status = net.node(id).status();
        assert_eq!(net.node(id).table().level(), fencelock_types::LEVEL);
        assert_eq!(status.log.applied_index, bootstrap_index, "node {id}: an entry after the Bootstrap");
    }
}
