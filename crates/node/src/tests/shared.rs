//! Shared locks and semaphores: readers and writers in line, permits
//! handed to waiters (together, within the quotas), expiries and lock
//! delays of shared holders.

use super::*;

#[test]
fn a_waiting_writer_is_not_passed_by_later_readers_and_gets_the_key_when_the_readers_leave() {
    use fencelock_types::Share;
    let mut net = Net::new(3);
    net.elect(1);
    let lease_ms = LeaseMs::new(30_000).unwrap();
    let take = |net: &mut Net<MemStore>, id: u64, who: &str, share: Share, wait_ms: u64| {
        net.node(1).acquire_shared(RequestId(id), key("rw"), lease_ms, owner(who), share, wait_ms);
        net.settle();
    };
    take(&mut net, 1, "r1", Share::Read, 0);
    take(&mut net, 2, "r2", Share::Read, 0);
    let (r1, r2) = (applied_token(net.take_reply(RequestId(1))), applied_token(net.take_reply(RequestId(2))));
    // A writer waits; a reader that comes after it waits behind it, though
    // the readers could let it in; a reader that does not wait is told who
    // holds the key.
    take(&mut net, 3, "w", Share::Write, 60_000);
    take(&mut net, 4, "r3", Share::Read, 60_000);
    take(&mut net, 5, "r4", Share::Read, 0);
    assert!(net.take_reply(RequestId(3)).is_none() && net.take_reply(RequestId(4)).is_none());
    assert!(
        matches!(net.take_reply(RequestId(5)), Some(Err(RequestError::Held { holder_token, .. })) if holder_token == r1)
    );
    // A retry by a holder is answered at once, waiters or not.
    take(&mut net, 6, "r2", Share::Read, 0);
    assert_eq!(applied_token(net.take_reply(RequestId(6))), r2);
    for (id, token) in [(7, r1), (8, r2)] {
        net.node(1).propose(
            RequestId(id),
            vec![Command::Release { key: key("rw"), token: Some(token), user: None }],
        );
        net.settle();
    }
    let w = applied_token(net.take_reply(RequestId(3)));
    assert!(w > r2);
    assert!(net.take_reply(RequestId(4)).is_none(), "a reader got in beside the writer");
    let shared = net.node(2).table().shared(b"rw").unwrap().clone();
    assert_eq!(shared.holders.keys().copied().collect::<Vec<_>>(), [w]);
    net.node(1).propose(RequestId(9), vec![Command::Release { key: key("rw"), token: Some(w), user: None }]);
    net.settle();
    let r3 = applied_token(net.take_reply(RequestId(4)));
    assert!(r3 > w);
    // The same on every node, and through a snapshot.
    for id in 1..=3 {
        assert!(net.node(id).table().holds(b"rw", r3));
    }
}

#[test]
fn a_semaphore_hands_an_expired_permit_to_its_first_waiter_even_after_a_leader_change() {
    use fencelock_types::Share;
    let mut net = Net::with_config(3, |config| {
        config.raft.election_ticks = 10;
        config.raft.election_ticks_max = Some(11);
    });
    net.elect(1);
    for replica in &mut net.replicas {
        replica.set_now(0);
    }
    let lease_ms = LeaseMs::new(1_000).unwrap();
    let permit = |net: &mut Net<MemStore>, leader: u64, id: u64, who: &str, permits: u32, wait_ms: u64| {
        net.node(leader).acquire_shared(
            RequestId(id),
            key("sem"),
            lease_ms,
            owner(who),
            Share::Permit(permits),
            wait_ms,
        );
        net.settle();
    };
    permit(&mut net, 1, 1, "a", 2, 0);
    permit(&mut net, 1, 2, "b", 2, 0);
    let (a, b) = (applied_token(net.take_reply(RequestId(1))), applied_token(net.take_reply(RequestId(2))));
    assert!(b > a);
    // A third waits; another number of permits is a mismatch, in the log.
    permit(&mut net, 1, 3, "c", 2, 60_000);
    permit(&mut net, 1, 4, "d", 3, 0);
    assert!(net.take_reply(RequestId(3)).is_none());
    match net.take_reply(RequestId(4)) {
        Some(Ok(Response::Applied(results))) => assert_eq!(results, [ApplyResult::Mismatch { permits: 2 }]),
        other => panic!("a mismatched permit answered {other:?}"),
    }
    // "b" renews; "a" does not, and expires: "c" gets its permit.
    net.node(1).set_now(600);
    net.node(1)
        .propose(RequestId(5), vec![Command::Renew { key: key("sem"), token: b, lease_ms, user: None }]);
    net.settle();
    net.node(1).set_now(1_100);
    net.settle();
    let c = applied_token(net.take_reply(RequestId(3)));
    assert!(c > b);
    let holders: Vec<_> = net.node(3).table().shared(b"sem").unwrap().holders.keys().copied().collect();
    assert_eq!(holders, [b, c]);
    // A new leader tracks the permits' leases from its own clock and
    // expires them: nobody renews now.
    for replica in &mut net.replicas {
        replica.set_now(1_100);
    }
    net.elect(2);
    for now in [2_000, 3_000, 4_000] {
        net.node(2).set_now(now);
        net.settle();
    }
    assert!(net.node(2).table().shared(b"sem").is_none(), "{:?}", net.node(2).table().shared(b"sem"));
    assert!(net.node(1).table().shared(b"sem").is_none());
}

#[test]
fn a_shared_keys_holders_that_lapse_together_leave_in_one_entry_and_one_renewed_meanwhile_stays() {
    // The leader used to keep one Expire per key in flight, one scan (10 ms)
    // after another: a thousand readers that died together took 10 s to
    // leave. Now a key's due holders go in one request; an Expire whose
    // holder renews before the request's turn is dropped from it.
    use fencelock_types::Share;
    let mut net = Net::new(3);
    net.elect(1);
    for replica in &mut net.replicas {
        replica.set_now(0);
    }
    let lease_ms = LeaseMs::new(1_000).unwrap();
    let holders = 200u64;
    for id in 1..=holders {
        net.node(1).acquire_shared(
            RequestId(id),
            key("pool"),
            lease_ms,
            owner(&format!("holder-{id}")),
            Share::Permit(holders as u32),
            0,
        );
    }
    net.settle();
    let tokens: Vec<FencingToken> =
        (1..=holders).map(|id| applied_token(net.take_reply(RequestId(id)))).collect();
    assert_eq!(net.node(1).table().shared(b"pool").unwrap().holders.len(), holders as usize);
    // All are due at 1,100; one renews, its Renew ahead of the Expires on
    // the key's queue.
    let renewed = tokens[57];
    net.node(1).set_now(1_100);
    net.node(1).propose(
        RequestId(1_000),
        vec![Command::Renew { key: key("pool"), token: renewed, lease_ms, user: None }],
    );
    let before = net.node(1).status().log.last_index;
    net.settle();
    assert!(matches!(net.take_reply(RequestId(1_000)), Some(Ok(Response::Applied(_)))));
    // The clock has not moved: one scan, so every lapsed holder went in one
    // request, and the renewed one stayed.
    for id in [1, 2, 3] {
        let left: Vec<FencingToken> =
            net.node(id).table().shared(b"pool").unwrap().holders.keys().copied().collect();
        assert_eq!(left, [renewed], "node {id}");
    }
    let entries = net.node(1).status().log.last_index - before;
    assert!(entries <= 3, "{entries} entries for one renew and one key's expiry");
}

#[test]
fn the_readers_queued_behind_a_writer_are_granted_together_in_the_entry_that_frees_the_key() {
    // They were granted one entry after another: each admitted reader
    // handed on to the next only once its own grant had applied.
    use fencelock_types::Share;
    let mut net = Net::new(3);
    net.elect(1);
    let lease_ms = LeaseMs::new(30_000).unwrap();
    let take = |net: &mut Net<MemStore>, id: u64, who: &str, share: Share, wait_ms: u64| {
        net.node(1).acquire_shared(RequestId(id), key("rw"), lease_ms, owner(who), share, wait_ms);
        net.settle();
    };
    take(&mut net, 1, "w1", Share::Write, 0);
    let w1 = applied_token(net.take_reply(RequestId(1)));
    for (id, who) in [(2, "r1"), (3, "r2"), (4, "r3"), (5, "r4"), (6, "r5")] {
        take(&mut net, id, who, Share::Read, 60_000);
    }
    // A second writer, then a reader that must not pass it.
    take(&mut net, 7, "w2", Share::Write, 60_000);
    take(&mut net, 8, "r6", Share::Read, 60_000);
    assert!((2..=8).all(|id| net.take_reply(RequestId(id)).is_none()));
    let before = net.node(1).status().log.last_index;
    net.node(1).propose(RequestId(9), vec![Command::Release { key: key("rw"), token: Some(w1), user: None }]);
    net.settle();
    assert_eq!(
        net.node(1).status().log.last_index - before,
        1,
        "the release and the five grants take one entry"
    );
    let readers: Vec<FencingToken> = (2..=6).map(|id| applied_token(net.take_reply(RequestId(id)))).collect();
    assert!(readers.windows(2).all(|pair| pair[0] < pair[1]), "granted in line: {readers:?}");
    assert!(readers[0] > w1);
    assert!(net.take_reply(RequestId(7)).is_none() && net.take_reply(RequestId(8)).is_none());
    for id in 1..=3 {
        let holders: Vec<FencingToken> =
            net.node(id).table().shared(b"rw").unwrap().holders.keys().copied().collect();
        assert_eq!(holders, readers, "node {id}");
    }
    // The readers leave together: the second writer alone, the last reader
    // still waits behind it.
    let releases = readers
        .iter()
        .map(|token| Command::Release { key: key("rw"), token: Some(*token), user: None })
        .collect();
    net.node(1).propose(RequestId(10), releases);
    net.settle();
    let w2 = applied_token(net.take_reply(RequestId(7)));
    assert!(net.take_reply(RequestId(8)).is_none(), "a reader got in beside the writer");
    for id in 1..=3 {
        let holders: Vec<FencingToken> =
            net.node(id).table().shared(b"rw").unwrap().holders.keys().copied().collect();
        assert_eq!(holders, [w2], "node {id}");
    }
}

#[test]
fn permits_freed_together_go_to_as_many_waiters_in_the_same_entry_within_the_quotas() {
    use fencelock_types::Share;
    let mut net = Net::with_config(3, |config| config.limits.locks_max = 5);
    net.elect(1);
    let lease_ms = LeaseMs::new(30_000).unwrap();
    let permit = |net: &mut Net<MemStore>, id: u64, who: &str, wait_ms: u64| {
        net.node(1).acquire_shared(
            RequestId(id),
            key("pool"),
            lease_ms,
            owner(who),
            Share::Permit(3),
            wait_ms,
        );
        net.settle();
    };
    for (id, who) in [(1, "a"), (2, "b"), (3, "c")] {
        permit(&mut net, id, who, 0);
    }
    let held: Vec<FencingToken> = (1..=3).map(|id| applied_token(net.take_reply(RequestId(id)))).collect();
    for (id, who) in [(4, "d"), (5, "e"), (6, "f"), (7, "g")] {
        permit(&mut net, id, who, 60_000);
    }
    // Another key brings the table to four of its five places.
    net.node(1).acquire(RequestId(8), key("other"), lease_ms, owner("z"), Value::default(), 0);
    net.settle();
    applied_token(net.take_reply(RequestId(8)));
    // Two permits go in one request: "d" and "e" take them in its entry.
    let before = net.node(1).status().log.last_index;
    let releases = held[..2]
        .iter()
        .map(|token| Command::Release { key: key("pool"), token: Some(*token), user: None })
        .collect();
    net.node(1).propose(RequestId(9), releases);
    net.settle();
    assert_eq!(net.node(1).status().log.last_index - before, 1);
    let (d, e) = (applied_token(net.take_reply(RequestId(4))), applied_token(net.take_reply(RequestId(5))));
    assert!(d > held[2] && e > d);
    assert!(net.take_reply(RequestId(6)).is_none() && net.take_reply(RequestId(7)).is_none());
    // The key is full again (the table at four of five): "c" leaves, "f"
    // takes its permit, "g" waits for one.
    net.node(1).propose(
        RequestId(10),
        vec![Command::Release { key: key("pool"), token: Some(held[2]), user: None }],
    );
    net.settle();
    let f = applied_token(net.take_reply(RequestId(6)));
    assert!(f > e);
    assert!(net.take_reply(RequestId(7)).is_none());
    for id in 1..=3 {
        let holders: Vec<FencingToken> =
            net.node(id).table().shared(b"pool").unwrap().holders.keys().copied().collect();
        assert_eq!(holders, [d, e, f], "node {id}");
        assert_eq!(net.node(id).table().len(), 4);
    }
}

#[test]
fn an_owners_retry_is_not_handed_a_place_in_the_entry_of_the_grant_it_repeats() {
    // Found by the simulator: a permit handed in one entry to an acquire
    // and to its owner's retry (on a new connection) gave the retry the
    // same token at the same index; the first answer went to the closed
    // connection, and the ghost release of that grant, known by its
    // index, then took the permit the retry had been told it holds.
    use fencelock_types::Share;
    let mut net = Net::new(3);
    net.elect(1);
    let lease_ms = LeaseMs::new(30_000).unwrap();
    let permit = |net: &mut Net<MemStore>, id: u64, who: &str, wait_ms: u64| {
        net.node(1).acquire_shared(
            RequestId(id),
            key("pool"),
            lease_ms,
            owner(who),
            Share::Permit(2),
            wait_ms,
        );
        net.settle();
    };
    permit(&mut net, 1, "a", 0);
    permit(&mut net, 2, "b", 0);
    let (a, b) = (applied_token(net.take_reply(RequestId(1))), applied_token(net.take_reply(RequestId(2))));
    permit(&mut net, 3, "o", 60_000);
    permit(&mut net, 4, "o", 60_000);
    let before = net.node(1).status().log.last_index;
    net.node(1).propose(
        RequestId(5),
        vec![
            Command::Release { key: key("pool"), token: Some(a), user: None },
            Command::Release { key: key("pool"), token: Some(b), user: None },
        ],
    );
    net.settle();
    let granted = applied_token(net.take_reply(RequestId(3)));
    let retried = match net.take_reply(RequestId(4)) {
        Some(Ok(Response::Applied(results))) => match results.as_slice() {
            [ApplyResult::Granted { token, existing: true, .. }] => *token,
            other => panic!("the retry was answered {other:?}"),
        },
        other => panic!("the retry was answered {other:?}"),
    };
    assert_eq!(granted, retried);
    assert!(
        net.node(1).status().log.last_index > before + 1,
        "the retry's re-grant shares the grant's entry"
    );
    // The first answer was not delivered: its grant, at the releases'
    // entry, is a ghost; the retry's re-grant since keeps the permit.
    net.node(1).release_ghost(crate::GrantRef { key: key("pool"), token: granted, index: before + 1 });
    net.settle();
    for id in 1..=3 {
        assert!(net.node(id).table().holds(b"pool", granted), "node {id} lost the retry's permit");
    }
}

#[test]
fn readers_handed_a_freed_key_together_stop_at_the_table_quota() {
    use fencelock_types::Share;
    let mut net = Net::with_config(3, |config| config.limits.locks_max = 3);
    net.elect(1);
    let lease_ms = LeaseMs::new(30_000).unwrap();
    net.node(1).acquire_shared(RequestId(1), key("rw"), lease_ms, owner("w"), Share::Write, 0);
    net.settle();
    let w = applied_token(net.take_reply(RequestId(1)));
    for (id, who) in [(2, "r1"), (3, "r2"), (4, "r3"), (5, "r4")] {
        net.node(1).acquire_shared(RequestId(id), key("rw"), lease_ms, owner(who), Share::Read, 60_000);
        net.settle();
    }
    // The writer's place goes to a reader; two more fit the table of
    // three; the fourth is told the table is full.
    net.node(1).propose(RequestId(6), vec![Command::Release { key: key("rw"), token: Some(w), user: None }]);
    net.settle();
    let readers: Vec<FencingToken> = (2..=4).map(|id| applied_token(net.take_reply(RequestId(id)))).collect();
    assert!(matches!(
        net.take_reply(RequestId(5)),
        Some(Err(RequestError::QuotaExceeded(crate::Quota::Table { max: 3 })))
    ));
    for id in 1..=3 {
        assert_eq!(net.node(id).table().len(), 3, "node {id}");
        let holders: Vec<FencingToken> =
            net.node(id).table().shared(b"rw").unwrap().holders.keys().copied().collect();
        assert_eq!(holders, readers);
    }
}

#[test]
fn a_semaphore_with_many_waiters_hands_each_freed_permit_to_the_next_in_line() {
    // Found by a process test: a waiter handed a free permit met the
    // waiters still behind it, went back behind them, handed the permit to
    // the next, and so on: the leader's turn never ended.
    use fencelock_types::Share;
    let mut net = Net::new(3);
    net.elect(1);
    let lease_ms = LeaseMs::new(30_000).unwrap();
    for (id, who, wait_ms) in [(1, "a", 0), (2, "b", 0), (3, "c", 60_000), (4, "d", 60_000), (5, "e", 60_000)]
    {
        net.node(1).acquire_shared(
            RequestId(id),
            key("pool"),
            lease_ms,
            owner(who),
            Share::Permit(2),
            wait_ms,
        );
        net.settle();
    }
    let (a, b) = (applied_token(net.take_reply(RequestId(1))), applied_token(net.take_reply(RequestId(2))));
    let mut order = Vec::new();
    for (id, token) in [(10, a), (11, b)] {
        net.node(1).propose(
            RequestId(id),
            vec![Command::Release { key: key("pool"), token: Some(token), user: None }],
        );
        net.settle();
        let next = (3..=5).find(|waiter| {
            !order.contains(waiter) && net.replies.iter().any(|(_, r, _)| *r == RequestId(*waiter))
        });
        order.push(next.expect("a freed permit went to a waiter"));
    }
    assert_eq!(order, [3, 4], "permits went out of order");
    assert!(net.take_reply(RequestId(5)).is_none());
    let holders: Vec<_> = net.node(1).table().shared(b"pool").unwrap().holders.keys().copied().collect();
    assert_eq!(holders.len(), 2);
}

#[test]
fn a_lock_delay_keeps_an_expired_permits_place_taken_then_hands_it_to_the_first_waiter() {
    use fencelock_types::Share;
    let mut net = Net::with_config(3, |config| {
        config.leases.lock_delays = vec![(b"pool/".to_vec(), LeaseMs::new(3_000).unwrap())];
    });
    net.elect(1);
    for replica in &mut net.replicas {
        replica.set_now(0);
    }
    let lease_ms = LeaseMs::new(1_000).unwrap();
    let permit = |net: &mut Net<MemStore>, id: u64, who: &str, wait_ms: u64| {
        net.node(1).acquire_shared(
            RequestId(id),
            key("pool/a"),
            lease_ms,
            owner(who),
            Share::Permit(1),
            wait_ms,
        );
        net.settle();
    };
    permit(&mut net, 1, "a", 0);
    let a = applied_token(net.take_reply(RequestId(1)));
    permit(&mut net, 2, "b", 60_000);
    // "a" stops renewing: its lease runs out, and its place stays taken for
    // the delay, on every node; the waiter waits, a try is told "held".
    for replica in &mut net.replicas {
        replica.set_now(1_000);
    }
    net.settle();
    for id in 1..=3 {
        let holder =
            net.node(id).table().shared(b"pool/a").and_then(|shared| shared.holders.get(&a).cloned());
        assert!(holder.is_some_and(|holder| holder.delayed), "node {id}");
        assert!(!net.node(id).table().holds(b"pool/a", a));
    }
    assert_eq!(net.take_reply(RequestId(2)), None, "a waiter got the permit of a holder held back");
    permit(&mut net, 3, "c", 0);
    assert!(
        matches!(net.take_reply(RequestId(3)), Some(Err(RequestError::Held { holder_token, .. })) if holder_token == a)
    );
    // Its former holder cannot renew it back.
    net.node(1)
        .propose(RequestId(4), vec![Command::Renew { key: key("pool/a"), token: a, lease_ms, user: None }]);
    net.settle();
    assert!(matches!(
        net.take_reply(RequestId(4)),
        Some(Ok(Response::Applied(results))) if matches!(results[..], [ApplyResult::NotFound { .. }])
    ));
    // The delay over, the first waiter gets the place, under a new token.
    for now in [2_000, 4_000] {
        for replica in &mut net.replicas {
            replica.set_now(now);
        }
        net.settle();
    }
    let b = applied_token(net.take_reply(RequestId(2)));
    assert!(b > a);
    for id in 1..=3 {
        let holders: Vec<_> =
            net.node(id).table().shared(b"pool/a").unwrap().holders.keys().copied().collect();
        assert_eq!(holders, [b], "node {id}");
    }
}

#[test]
fn a_plain_acquire_waits_for_a_shared_keys_holders_and_a_reader_asking_to_write_is_answered_at_once() {
    use fencelock_types::Share;
    let mut net = Net::new(3);
    net.elect(1);
    let lease_ms = LeaseMs::new(30_000).unwrap();
    net.node(1).acquire_shared(RequestId(1), key("rw"), lease_ms, owner("r1"), Share::Read, 0);
    net.node(1).acquire_shared(RequestId(2), key("rw"), lease_ms, owner("r2"), Share::Read, 0);
    net.settle();
    let (r1, r2) = (applied_token(net.take_reply(RequestId(1))), applied_token(net.take_reply(RequestId(2))));
    // A watch from the start tells each holder with its share.
    let query = crate::watch::WatchQuery { prefix: b"rw".to_vec(), after: None, wait_ms: 0, limit: 100 };
    net.node(2).watch(RequestId(3), crate::registry::ConnId(1), query);
    net.settle();
    let Some(Ok(Response::Watch(answer))) = net.take_reply(RequestId(3)) else { panic!("no watch answer") };
    let told: Vec<_> =
        answer.current.unwrap().iter().map(|(_, held)| (held.lock.token, held.share)).collect();
    assert_eq!(told, [(r1, Some(Share::Read)), (r2, Some(Share::Read))]);
    // A reader asking to write, with a wait, would wait for itself.
    net.node(1).acquire_shared(RequestId(4), key("rw"), lease_ms, owner("r1"), Share::Write, 60_000);
    net.settle();
    assert!(
        matches!(net.take_reply(RequestId(4)), Some(Err(RequestError::Held { holder_token, .. })) if holder_token == r1)
    );
    // A plain acquire waits, with no log entry, until the last reader goes.
    let applied = net.node(1).status().log.applied_index;
    net.node(1).acquire(RequestId(5), key("rw"), lease_ms, owner("p"), Value::none(), 60_000);
    net.settle();
    assert_eq!(net.take_reply(RequestId(5)), None, "a plain acquire of a shared key did not wait");
    assert_eq!(net.node(1).status().log.applied_index, applied, "a waiting acquire was proposed");
    for (id, token) in [(6, r1), (7, r2)] {
        net.node(1).propose(
            RequestId(id),
            vec![Command::Release { key: key("rw"), token: Some(token), user: None }],
        );
        net.settle();
    }
    let plain = applied_token(net.take_reply(RequestId(5)));
    assert!(plain > r2);
    assert!(net.node(3).table().holder(b"rw").is_some_and(|lock| lock.token == plain));
}
