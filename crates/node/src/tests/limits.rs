//! Limits and quotas: pending requests and the acquires' budget, the
//! waiters of one key, the table's and each identity's locks.

use super::*;

#[test]
fn too_many_pending_requests_are_refused() {
    let mut net = Net::with_config(3, |config| config.limits.pending_requests_max = 8);
    net.elect(1);
    net.blocked.insert((1, MessageType::MsgAppendResponse as i32));
    let max = 8;
    for i in 0..max {
        net.node(1).propose(RequestId(i), vec![grant(&format!("k{i}"), "o1")]);
    }
    net.node(1).propose(RequestId(max), vec![grant("one-too-many", "o1")]);
    assert_eq!(net.take_reply(RequestId(max)), None);
    net.turn().unwrap();
    assert_eq!(net.take_reply(RequestId(max)), Some(Err(RequestError::Overloaded)));
}

#[test]
fn acquires_that_fill_their_budget_leave_room_for_renewals_releases_and_expiries() {
    let mut net = Net::with_config(3, |config| {
        config.limits.pending_requests_max = 8;
        config.limits.pending_acquires_max = 4;
    });
    net.elect(1);
    for replica in &mut net.replicas {
        replica.set_now(0);
    }
    let long = LeaseMs::new(60_000).unwrap();
    let short = LeaseMs::new(1_000).unwrap();
    net.node(1).acquire(RequestId(1), key("held"), long, owner("holder"), Value::none(), 0);
    net.node(1).acquire(RequestId(2), key("short"), short, owner("o1"), Value::none(), 0);
    net.node(1).acquire(RequestId(3), key("renewed"), short, owner("o1"), Value::none(), 0);
    net.settle();
    applied_token(net.take_reply(RequestId(1)));
    let short_token = applied_token(net.take_reply(RequestId(2)));
    let renewed = applied_token(net.take_reply(RequestId(3)));
    // A careless client: four acquires wait for a key held for a minute.
    for id in 10..14 {
        net.node(1).acquire(
            RequestId(id),
            key("held"),
            long,
            owner(&format!("w{id}")),
            Value::none(),
            50_000,
        );
    }
    net.settle();
    net.node(1).acquire(RequestId(20), key("free"), long, owner("o1"), Value::none(), 0);
    net.settle();
    assert_eq!(
        net.take_reply(RequestId(20)),
        Some(Err(RequestError::Overloaded)),
        "past the acquires' budget"
    );
    // Renewals still flow...
    let renew = Command::Renew { key: key("renewed"), token: renewed, lease_ms: long, user: None };
    net.node(1).propose(RequestId(21), vec![renew]);
    net.settle();
    assert_eq!(
        net.take_reply(RequestId(21)),
        Some(Ok(Response::Applied(vec![ApplyResult::Renewed { token: renewed, lease_ms: long }])))
    );
    // ...and so do the leader's own expiries.
    net.node(1).set_now(1_500);
    net.settle();
    assert!(
        net.node(1).table().holder(b"short").is_none(),
        "the lease of token {short_token} ran out unexpired"
    );
    assert!(net.node(3).table().holder(b"short").is_none());
    assert!(net.node(1).table().holder(b"renewed").is_some());
}

#[test]
fn the_waiters_of_one_key_are_bounded() {
    let mut net = Net::with_config(3, |config| config.limits.waiters_per_key_max = 2);
    net.elect(1);
    let lease_ms = LeaseMs::new(60_000).unwrap();
    net.node(1).acquire(RequestId(1), key("hot"), lease_ms, owner("holder"), Value::none(), 0);
    net.settle();
    let holder = applied_token(net.take_reply(RequestId(1)));
    for id in 2..=4 {
        net.node(1).acquire(
            RequestId(id),
            key("hot"),
            lease_ms,
            owner(&format!("w{id}")),
            Value::none(),
            50_000,
        );
    }
    net.node(1).acquire(RequestId(5), key("cold"), lease_ms, owner("w5"), Value::none(), 50_000);
    net.settle();
    assert!(net.take_reply(RequestId(2)).is_none() && net.take_reply(RequestId(3)).is_none());
    assert_eq!(
        net.take_reply(RequestId(4)),
        Some(Err(RequestError::TooManyWaiters { key: key("hot"), max: 2 }))
    );
    assert!(matches!(net.take_reply(RequestId(5)), Some(Ok(_))), "another key is not bounded by this one");
    // The first waiter gets the key when it is freed.
    net.node(1)
        .propose(RequestId(6), vec![Command::Release { key: key("hot"), token: Some(holder), user: None }]);
    net.settle();
    assert!(applied_token(net.take_reply(RequestId(2))) > holder);
}

#[test]
fn quotas_bound_the_table_and_each_identity_counting_locks_in_flight() {
    let mut net = Net::with_config(3, |config| {
        config.limits.locks_max = 5;
        config.limits.locks_per_identity_max = 3;
    });
    net.elect(1);
    let lease_ms = LeaseMs::new(60_000).unwrap();
    // Four grants of one identity in one turn: the fourth is refused although
    // none of the first three has applied yet.
    for (id, name) in [(1, "alice"), (2, "alice/w2"), (3, "alice/w3"), (4, "alice/w4")] {
        net.node(1).acquire(RequestId(id), key(&format!("a{id}")), lease_ms, owner(name), Value::none(), 0);
    }
    net.settle();
    for id in 1..=3 {
        applied_token(net.take_reply(RequestId(id)));
    }
    let refused = net.take_reply(RequestId(4));
    assert_eq!(
        refused,
        Some(Err(RequestError::QuotaExceeded(crate::Quota::Identity { identity: "alice".into(), max: 3 })))
    );
    // A retry of a holder adds no lock: it is not refused.
    net.node(1).acquire(RequestId(5), key("a1"), lease_ms, owner("alice"), Value::none(), 0);
    // Others fill the table to 5; the sixth lock is refused.
    net.node(1).acquire(RequestId(6), key("b1"), lease_ms, owner("bob"), Value::none(), 0);
    net.node(1).acquire(RequestId(7), key("c1"), lease_ms, owner("carol"), Value::none(), 0);
    net.node(1).acquire(RequestId(8), key("d1"), lease_ms, owner("dave"), Value::none(), 0);
    net.settle();
    assert!(matches!(net.take_reply(RequestId(5)), Some(Ok(_))));
    applied_token(net.take_reply(RequestId(6)));
    applied_token(net.take_reply(RequestId(7)));
    assert_eq!(
        net.take_reply(RequestId(8)),
        Some(Err(RequestError::QuotaExceeded(crate::Quota::Table { max: 5 })))
    );
    assert_eq!(net.node(1).table().len(), 5);
    assert_eq!(net.node(2).table().locks_of(b"alice"), 3);
    // A waiter handed a lock of another identity is held to its own quota:
    // bob waits for alice's a1; alice releases; bob (1 lock) gets it.
    net.node(1).acquire(RequestId(9), key("a1"), lease_ms, owner("bob/2"), Value::none(), 50_000);
    net.settle();
    assert!(net.take_reply(RequestId(9)).is_none());
    let a1 = net.node(1).table().holder(b"a1").unwrap().token;
    net.node(1)
        .propose(RequestId(10), vec![Command::Release { key: key("a1"), token: Some(a1), user: None }]);
    net.settle();
    assert!(applied_token(net.take_reply(RequestId(9))) > a1);
    assert_eq!((net.node(1).table().locks_of(b"bob"), net.node(1).table().locks_of(b"alice")), (2, 2));
    // Freed places can be taken again.
    net.node(1).acquire(RequestId(11), key("a9"), lease_ms, owner("alice"), Value::none(), 0);
    net.settle();
    assert_eq!(
        net.take_reply(RequestId(11)),
        Some(Err(RequestError::QuotaExceeded(crate::Quota::Table { max: 5 })))
    );
    let b1 = net.node(1).table().holder(b"b1").unwrap().token;
    net.node(1)
        .propose(RequestId(12), vec![Command::Release { key: key("b1"), token: Some(b1), user: None }]);
    net.settle();
    net.node(1).acquire(RequestId(13), key("a9"), lease_ms, owner("alice"), Value::none(), 0);
    net.settle();
    applied_token(net.take_reply(RequestId(13)));
}

#[test]
fn a_waiter_over_its_quota_is_answered_and_the_key_goes_to_the_next() {
    let mut net = Net::with_config(3, |config| config.limits.locks_per_identity_max = 1);
    net.elect(1);
    let lease_ms = LeaseMs::new(60_000).unwrap();
    net.node(1).acquire(RequestId(1), key("hot"), lease_ms, owner("holder"), Value::none(), 0);
    net.node(1).acquire(RequestId(2), key("mine"), lease_ms, owner("greedy"), Value::none(), 0);
    net.settle();
    let holder = applied_token(net.take_reply(RequestId(1)));
    applied_token(net.take_reply(RequestId(2)));
    net.node(1).acquire(RequestId(3), key("hot"), lease_ms, owner("greedy/2"), Value::none(), 50_000);
    net.node(1).acquire(RequestId(4), key("hot"), lease_ms, owner("patient"), Value::none(), 50_000);
    net.settle();
    net.node(1)
        .propose(RequestId(5), vec![Command::Release { key: key("hot"), token: Some(holder), user: None }]);
    net.settle();
    assert_eq!(
        net.take_reply(RequestId(3)),
        Some(Err(RequestError::QuotaExceeded(crate::Quota::Identity { identity: "greedy".into(), max: 1 })))
    );
    assert!(applied_token(net.take_reply(RequestId(4))) > holder);
    assert_eq!(net.node(3).table().holder(b"hot").unwrap().owner, owner("patient"));
}
