//! Leases and waiting: a freed or expired key handed to its first waiter,
//! waiters failing over on a leader change, lock delays holding an expired
//! key back, and the bound on the shortest lease.

use super::*;

#[test]
fn a_hot_key_handoff_to_the_first_waiter_costs_one_entry_and_a_try_acquire_waits_its_turn() {
    let mut net = Net::new(3);
    net.elect(1);
    let lease_ms = LeaseMs::new(1000).unwrap();
    net.node(1).acquire(RequestId(1), key("hot"), lease_ms, owner("holder"), Value::none(), 0);
    net.settle();
    let holder = applied_token(net.take_reply(RequestId(1)));
    net.node(1).acquire(RequestId(2), key("hot"), lease_ms, owner("waiter"), Value::none(), 60_000);
    net.settle();
    assert!(net.take_reply(RequestId(2)).is_none(), "the waiter waits");

    let before = net.node(1).stats();
    net.node(1)
        .propose(RequestId(3), vec![Command::Release { key: key("hot"), token: Some(holder), user: None }]);
    net.node(1).acquire(RequestId(4), key("hot"), lease_ms, owner("impatient"), Value::none(), 0);
    net.node(1).run_ready().unwrap();
    let after = net.node(1).stats();
    assert_eq!(after.entries_proposed - before.entries_proposed, 1, "release and handoff share one entry");
    assert_eq!(after.commands_proposed - before.commands_proposed, 2);

    net.settle();
    assert_eq!(
        net.take_reply(RequestId(3)),
        Some(Ok(Response::Applied(vec![ApplyResult::Released { token: holder }])))
    );
    let next = applied_token(net.take_reply(RequestId(2)));
    assert!(next > holder);
    assert_eq!(
        net.take_reply(RequestId(4)),
        Some(Err(RequestError::Held { key: key("hot"), holder_token: next })),
        "the try-acquire jumped the queue"
    );
}

#[test]
fn an_expiry_hands_the_key_to_the_first_waiter_and_waiters_fail_over_with_a_retryable_error() {
    let mut net = Net::new(3);
    net.elect(1);
    let lease_ms = LeaseMs::new(1000).unwrap();
    for replica in &mut net.replicas {
        replica.set_now(0);
    }
    net.node(1).acquire(RequestId(1), key("a"), lease_ms, owner("o1"), Value::none(), 0);
    net.settle();
    let first = applied_token(net.take_reply(RequestId(1)));
    net.node(1).acquire(RequestId(2), key("a"), lease_ms, owner("o2"), Value::none(), 60_000);
    net.node(1).acquire(RequestId(3), key("a"), lease_ms, owner("o3"), Value::none(), 60_000);
    net.settle();
    net.node(1).set_now(1_000);
    net.settle();
    let second = applied_token(net.take_reply(RequestId(2)));
    assert!(second > first);
    assert!(net.node(2).table().holder(b"a").is_some_and(|lock| lock.token == second));

    // Waiters live on the leader only: a new leader means queue again.
    net.elect(2);
    assert!(matches!(net.take_reply(RequestId(3)), Some(Err(RequestError::NotLeader { .. }))));
}

#[test]
fn a_lock_delay_holds_an_expired_key_back_across_a_leader_change_then_hands_it_to_the_first_waiter() {
    let mut net = Net::with_config(3, |config| {
        config.leases.lock_delays = vec![(b"jobs/".to_vec(), LeaseMs::new(3_000).unwrap())];
    });
    net.elect(1);
    for replica in &mut net.replicas {
        replica.set_now(0);
    }
    let lease_ms = LeaseMs::new(1_000).unwrap();
    net.node(1).acquire(RequestId(1), key("jobs/a"), lease_ms, owner("o1"), Value::none(), 0);
    net.node(1).acquire(RequestId(2), key("free/a"), lease_ms, owner("o1"), Value::none(), 0);
    net.settle();
    let first = applied_token(net.take_reply(RequestId(1)));
    applied_token(net.take_reply(RequestId(2)));
    net.node(1).acquire(RequestId(3), key("jobs/a"), lease_ms, owner("o2"), Value::none(), 60_000);
    net.settle();
    // Both leases run out: the key under the rule is held back, the other
    // is free at once.
    for replica in &mut net.replicas {
        replica.set_now(1_000);
    }
    net.settle();
    assert!(net.node(1).table().holder(b"free/a").is_none());
    for id in 1..=3 {
        let lock = net.node(id).table().holder(b"jobs/a").cloned();
        assert!(lock.is_some_and(|lock| lock.delayed && lock.token == first), "node {id}");
    }
    assert_eq!(net.take_reply(RequestId(3)), None, "a waiter was granted a key held back");
    // A try-acquire is told, with the time left; its former owner too.
    for (id, who) in [(4, "o3"), (5, "o1")] {
        net.node(1).acquire(RequestId(id), key("jobs/a"), lease_ms, owner(who), Value::none(), 0);
        net.settle();
        assert_eq!(
            net.take_reply(RequestId(id)),
            Some(Err(RequestError::Delayed {
                key: key("jobs/a"),
                holder_token: first,
                left_ms: Some(3_000)
            })),
        );
    }
    // A leader change mid-delay: the new leader counts the delay from its
    // own apply, so the key stays held back at least that long.
    for replica in &mut net.replicas {
        replica.set_now(2_500);
    }
    net.elect(2);
    net.node(2).acquire(RequestId(6), key("jobs/a"), lease_ms, owner("o2"), Value::none(), 60_000);
    net.settle();
    for replica in &mut net.replicas {
        replica.set_now(3_900);
    }
    net.settle();
    assert!(
        net.node(2).table().holder(b"jobs/a").is_some_and(|lock| lock.delayed),
        "the delay was cut short"
    );
    assert_eq!(net.take_reply(RequestId(6)), None);
    // Over: the first waiter gets the key, with a greater token.
    for replica in &mut net.replicas {
        replica.set_now(4_000);
    }
    net.settle();
    let next = applied_token(net.take_reply(RequestId(6)));
    assert!(next > first);
    for id in 1..=3 {
        let lock = net.node(id).table().holder(b"jobs/a").cloned();
        assert!(lock.is_some_and(|lock| !lock.delayed && lock.token == next), "node {id}");
    }
}

#[test]
fn the_shortest_lease_must_outlast_two_election_timeouts() {
    let mut config = Config::new(NodeId(1), vec![NodeId(1)]);
    config.raft.election_ticks = 10;
    config.leases.lease_min_ms = 2_000;
    // 10 ticks, randomized up to 20, of 100 ms: elections take up to 2 s.
    assert!(config.validate_timing(100).is_err());
    assert!(config.validate_timing(50).is_ok());
    config.leases.lease_max_ms = 1_000;
    assert!(config.validate().is_err(), "min above max");
}
