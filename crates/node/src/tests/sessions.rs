//! Sessions: one keep-alive for all a session holds, its lapse and close
//! freeing it all, its TTL across a leader change, the level it needs,
//! and acquires under another session.

use super::*;

fn set_all_now(net: &mut Net<MemStore>, now_ms: u64) {
    for replica in &mut net.replicas {
        replica.set_now(now_ms);
    }
}

/// Opens a session for `who` on node `at` and returns its id.
fn open_session(net: &mut Net<MemStore>, at: u64, request: u64, who: &str, ttl_ms: u64) -> FencingToken {
    let open = Command::OpenSession { owner: owner(who), ttl_ms: LeaseMs::new(ttl_ms).unwrap() };
    net.node(at).propose(RequestId(request), vec![open]);
    net.settle();
    applied_token(net.take_reply(RequestId(request)))
}

fn grant_in(name: &str, who: &str, session: FencingToken) -> Command {
    Command::Grant {
        key: key(name),
        lease_ms: LeaseMs::MIN,
        owner: owner(who),
        value: Value::none(),
        session: Some(session),
    }
}

fn shared_in(name: &str, who: &str, share: fencelock_types::Share, session: FencingToken) -> Command {
    Command::GrantShared {
        key: key(name),
        lease_ms: LeaseMs::MIN,
        owner: owner(who),
        share,
        session: Some(session),
    }
}

/// Whether `key` has a holder of any kind on node `id`.
fn held_on(net: &mut Net<MemStore>, id: u64, name: &str) -> bool {
    let table = net.node(id).table();
    table.holder(name.as_bytes()).is_some() || table.shared(name.as_bytes()).is_some()
}

#[test]
fn one_keepalive_keeps_everything_a_session_holds_and_its_lapse_frees_it_all_for_the_waiters() {
    use fencelock_types::Share;
    let mut net = Net::new(3);
    net.elect(1);
    set_all_now(&mut net, 0);
    let session = open_session(&mut net, 1, 1, "o1", 1_000);
    net.node(1).acquire_with(RequestId(2), grant_in("a", "o1", session), 0);
    net.node(1).acquire_with(RequestId(3), shared_in("rw", "o1", Share::Read, session), 0);
    net.node(1).acquire_with(RequestId(4), shared_in("sem", "o1", Share::Permit(1), session), 0);
    // A lock of its own beside the session's, with a longer lease.
    net.node(1).acquire(RequestId(5), key("b"), LeaseMs::new(5_000).unwrap(), owner("o1"), Value::none(), 0);
    net.settle();
    let tokens: Vec<FencingToken> = (2..=5).map(|id| applied_token(net.take_reply(RequestId(id)))).collect();
    assert!(tokens.iter().all(|token| *token > session), "a session's id is a token too: {tokens:?}");
    // Others wait for each key the session holds.
    net.node(1).acquire(
        RequestId(6),
        key("a"),
        LeaseMs::new(1_000).unwrap(),
        owner("o2"),
        Value::none(),
        60_000,
    );
    net.node(1).acquire_shared(
        RequestId(7),
        key("rw"),
        LeaseMs::new(1_000).unwrap(),
        owner("o2"),
        Share::Write,
        60_000,
    );
    net.node(1).acquire_shared(
        RequestId(8),
        key("sem"),
        LeaseMs::new(1_000).unwrap(),
        owner("o2"),
        Share::Permit(1),
        60_000,
    );
    net.settle();

    // One keep-alive before the TTL: everything lives past the first TTL.
    set_all_now(&mut net, 800);
    net.node(1).propose(RequestId(9), vec![Command::RenewSession { session, user: None }]);
    net.settle();
    assert!(matches!(
        net.take_reply(RequestId(9)),
        Some(Ok(Response::Applied(results))) if matches!(results.as_slice(), [ApplyResult::Renewed { .. }])
    ));
    set_all_now(&mut net, 1_700);
    net.settle();
    for id in 1..=3 {
        for name in ["a", "rw", "sem", "b"] {
            assert!(held_on(&mut net, id, name), "node {id} freed {name} while its session was alive");
        }
    }
    for id in 6..=8 {
        assert_eq!(net.take_reply(RequestId(id)), None, "request {id} was answered while the key was held");
    }

    // No keep-alive: at 1,800 the session lapses, and all it held goes;
    // the waiters get each key under a greater token. The lock of its own
    // stays.
    set_all_now(&mut net, 1_800);
    net.settle();
    let last = *tokens.iter().max().unwrap();
    for id in 6..=8 {
        let next = applied_token(net.take_reply(RequestId(id)));
        assert!(next > last, "request {id}: token {next} after {last}");
    }
    for id in 1..=3 {
        let table = net.node(id).table();
        assert!(table.session(session).is_none(), "node {id} keeps the lapsed session");
        assert_eq!(table.session_count(), 0);
        assert!(table.holder(b"b").is_some_and(|lock| lock.token == tokens[3]));
        assert!(table.holder(b"a").is_some_and(|lock| lock.owner == owner("o2") && lock.session.is_none()));
    }
    // What was under it is gone for good: a keep-alive and an acquire
    // under it are told so, and change nothing.
    net.node(1).propose(RequestId(10), vec![Command::RenewSession { session, user: None }]);
    net.node(1).acquire_with(RequestId(11), grant_in("c", "o1", session), 0);
    net.settle();
    for id in [10, 11] {
        assert_eq!(
            net.take_reply(RequestId(id)),
            Some(Ok(Response::Applied(vec![ApplyResult::NoSession { session }]))),
            "request {id}"
        );
    }
    assert!(net.node(1).table().holder(b"c").is_none());
}

#[test]
fn a_renew_of_a_lock_under_a_session_renews_the_session_and_the_lock_never_lapses_on_its_own() {
    let mut net = Net::new(3);
    net.elect(1);
    set_all_now(&mut net, 0);
    let session = open_session(&mut net, 1, 1, "o1", 1_000);
    net.node(1).acquire_with(RequestId(2), grant_in("a", "o1", session), 0);
    net.settle();
    let token = applied_token(net.take_reply(RequestId(2)));
    for (at, request) in [(700, 3), (1_400, 4), (2_100, 5)] {
        set_all_now(&mut net, at);
        net.settle();
        let renew =
            Command::Renew { key: key("a"), token, lease_ms: LeaseMs::new(5_000).unwrap(), user: None };
        net.node(1).propose(RequestId(request), vec![renew]);
        net.settle();
        assert_eq!(
            net.take_reply(RequestId(request)),
            Some(Ok(Response::Applied(vec![ApplyResult::Renewed {
                token,
                lease_ms: LeaseMs::new(1_000).unwrap()
            }]))),
        );
    }
    set_all_now(&mut net, 3_000);
    net.settle();
    assert!(net.node(2).table().holds(b"a", token), "the lock went before its session's TTL");
    set_all_now(&mut net, 3_100);
    net.settle();
    assert!(net.node(2).table().holder(b"a").is_none(), "the session outlived its TTL");
}

#[test]
fn closing_a_session_releases_all_it_holds_and_answers_acquires_still_waiting_under_it() {
    let mut net = Net::new(3);
    net.elect(1);
    set_all_now(&mut net, 0);
    let session = open_session(&mut net, 1, 1, "o1", 10_000);
    let other = open_session(&mut net, 1, 2, "o2", 10_000);
    net.node(1).acquire_with(RequestId(3), grant_in("a", "o1", session), 0);
    net.node(1).acquire(
        RequestId(4),
        key("busy"),
        LeaseMs::new(10_000).unwrap(),
        owner("o3"),
        Value::none(),
        0,
    );
    net.settle();
    applied_token(net.take_reply(RequestId(3)));
    applied_token(net.take_reply(RequestId(4)));
    // Waiting under the session for a key another holds, and waiting for
    // the session's key.
    net.node(1).acquire_with(RequestId(5), grant_in("busy", "o1", session), 60_000);
    net.node(1).acquire_with(RequestId(6), grant_in("a", "o2", other), 60_000);
    // Under another owner's session: refused.
    net.node(1).acquire_with(RequestId(7), grant_in("d", "o2", session), 0);
    net.settle();
    assert_eq!(
        net.take_reply(RequestId(7)),
        Some(Ok(Response::Applied(vec![ApplyResult::Denied { token: session }])))
    );
    // Over TLS a user closes only a session of its own.
    let close = |user: Option<&str>| Command::CloseSession { session, user: user.map(owner) };
    net.node(1).propose(RequestId(8), vec![close(Some("o2"))]);
    net.settle();
    assert_eq!(
        net.take_reply(RequestId(8)),
        Some(Ok(Response::Applied(vec![ApplyResult::Denied { token: session }])))
    );
    net.node(1).propose(RequestId(9), vec![close(Some("o1"))]);
    net.settle();
    assert_eq!(
        net.take_reply(RequestId(9)),
        Some(Ok(Response::Applied(vec![ApplyResult::Released { token: session }])))
    );
    assert_eq!(
        net.take_reply(RequestId(5)),
        Some(Ok(Response::Applied(vec![ApplyResult::NoSession { session }]))),
        "an acquire waiting under a closed session must be told"
    );
    applied_token(net.take_reply(RequestId(6)));
    for id in 1..=3 {
        let table = net.node(id).table();
        assert!(table.holder(b"a").is_some_and(|lock| lock.session == Some(other)), "node {id}");
        assert!(table.session(session).is_none());
        assert!(table.session(other).is_some_and(|open| open.holds.len() == 1));
    }
}

#[test]
fn a_session_outlives_a_leader_change_and_the_new_leader_counts_its_ttl_from_its_own_apply() {
    let mut net = Net::new(3);
    net.elect(1);
    set_all_now(&mut net, 0);
    let session = open_session(&mut net, 1, 1, "o1", 1_000);
    net.node(1).acquire_with(RequestId(2), grant_in("a", "o1", session), 0);
    net.settle();
    let token = applied_token(net.take_reply(RequestId(2)));
    // Renewed at 900 on the old leader: followers apply it then too.
    set_all_now(&mut net, 900);
    net.node(1).propose(RequestId(3), vec![Command::RenewSession { session, user: None }]);
    net.settle();
    net.elect(2);
    set_all_now(&mut net, 1_850);
    net.settle();
    assert!(net.node(2).table().holds(b"a", token), "the new leader expired a session renewed at 900");
    net.node(2).propose(RequestId(4), vec![Command::RenewSession { session, user: None }]);
    net.settle();
    set_all_now(&mut net, 2_800);
    net.settle();
    assert!(net.node(3).table().holds(b"a", token));
    set_all_now(&mut net, 2_900);
    net.settle();
    assert!(net.node(3).table().holder(b"a").is_none());
}

#[test]
fn sessions_wait_for_level_3_and_count_in_the_quota() {
    let mut net = Net::with_config(3, |config| {
        config.founding.founding_level = 2;
        config.limits.locks_per_identity_max = 2;
    });
    net.elect(1);
    let open = || Command::OpenSession { owner: owner("o1"), ttl_ms: LeaseMs::new(1_000).unwrap() };
    net.node(1).propose(RequestId(1), vec![open()]);
    net.settle();
    assert!(matches!(
        net.take_reply(RequestId(1)),
        Some(Err(RequestError::LevelNotReached { needed: 3, level: 2, .. }))
    ));
    // Every member applies level 3: the leader raises it.
    for id in 2..=3 {
        net.node(1).peer_level(NodeId(id), fencelock_types::LEVEL);
    }
    net.settle();
    net.node(1).tick();
    net.settle();
    assert_eq!(net.node(3).table().level(), fencelock_types::LEVEL);
    applied_token({
        net.node(1).propose(RequestId(2), vec![open()]);
        net.settle();
        net.take_reply(RequestId(2))
    });
    net.node(1).acquire(RequestId(3), key("a"), LeaseMs::new(1_000).unwrap(), owner("o1"), Value::none(), 0);
    net.node(1).propose(RequestId(4), vec![open()]);
    net.settle();
    applied_token(net.take_reply(RequestId(3)));
    assert!(matches!(net.take_reply(RequestId(4)), Some(Err(RequestError::QuotaExceeded(_)))));
}

#[test]
fn a_keep_alive_in_flight_when_the_session_falls_due_keeps_it_and_is_never_followed_by_its_expiry() {
    // Found by the simulator (seed 1, 5 nodes): the keep-alive arrived at
    // a leader whose clock said the session was due; the leader's Expire
    // went into the same entry, right after it: the client was told its
    // session lived on, and the next command ended it.
    let mut net = Net::new(3);
    net.elect(1);
    set_all_now(&mut net, 0);
    let session = open_session(&mut net, 1, 1, "o1", 1_000);
    net.node(1).acquire_with(RequestId(2), grant_in("a", "o1", session), 0);
    net.settle();
    let token = applied_token(net.take_reply(RequestId(2)));
    for (at, request) in [(1_000, 3u64), (2_000, 4)] {
        set_all_now(&mut net, at);
        // Due now, and the keep-alive is taken in the same turn.
        if request == 3 {
            net.node(1).propose(RequestId(request), vec![Command::RenewSession { session, user: None }]);
        } else {
            let renew =
                Command::Renew { key: key("a"), token, lease_ms: LeaseMs::new(1_000).unwrap(), user: None };
            net.node(1).propose(RequestId(request), vec![renew]);
        }
        net.settle();
        assert!(
            matches!(
                net.take_reply(RequestId(request)),
                Some(Ok(Response::Applied(results))) if matches!(results.as_slice(), [ApplyResult::Renewed { .. }])
            ),
            "request {request}"
        );
        for id in 1..=3 {
            assert!(
                net.node(id).table().session(session).is_some(),
                "node {id} ended a session it renewed at {at}"
            );
            assert!(net.node(id).table().holds(b"a", token));
        }
    }
    // Not kept alive again: it lapses a TTL after the last renewal.
    set_all_now(&mut net, 3_000);
    net.settle();
    assert!(net.node(2).table().session(session).is_none());
}

#[test]
fn an_acquire_under_another_session_than_its_owner_holds_the_key_under_is_answered_at_once() {
    let mut net = Net::new(3);
    net.elect(1);
    set_all_now(&mut net, 0);
    let session = open_session(&mut net, 1, 1, "o1", 10_000);
    let other = open_session(&mut net, 1, 2, "o1", 10_000);
    net.node(1).acquire_with(RequestId(3), grant_in("a", "o1", session), 0);
    net.settle();
    let token = applied_token(net.take_reply(RequestId(3)));
    // Waiting would wait for itself: turned away at once, by its own token.
    net.node(1).acquire_with(RequestId(4), grant_in("a", "o1", other), 60_000);
    net.node(1).acquire(
        RequestId(5),
        key("a"),
        LeaseMs::new(1_000).unwrap(),
        owner("o1"),
        Value::none(),
        60_000,
    );
    net.settle();
    for id in [4, 5] {
        assert_eq!(
            net.take_reply(RequestId(id)),
            Some(Err(RequestError::Held { key: key("a"), holder_token: token })),
            "request {id}"
        );
    }
    assert_eq!(net.node(1).table().holder(b"a").and_then(|lock| lock.session), Some(session));
}
