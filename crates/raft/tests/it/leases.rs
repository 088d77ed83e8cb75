//! Leases in a running cluster, each node with its own manual clock: expiry
//! only through a committed Expire, skew, renewal races, fail-over, ghost
//! locks and waiting acquires.

use std::time::Duration;

use fencelock_raft::{Query, RequestError, Response};
use fencelock_types::{ApplyResult, Command, FencingToken, LeaseMs};

use crate::harness::{key, release, Cluster, DEADLINE};

fn granted(reply: fencelock_raft::Reply) -> FencingToken {
    match reply {
        Ok(Response::Acquired(fencelock_raft::answer::Acquired::Granted { token, .. })) => token,
        other => panic!("expected a grant: {other:?}"),
    }
}

/// Acquires through the leader, retrying what is retryable (a leader change
/// under load): the owner stays the same, so a retry never grants twice.
fn acquire(cluster: &Cluster, key_name: &str, owner: &str, lease_ms: u64) -> FencingToken {
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        let leader = cluster.leader();
        match cluster.acquire_async(leader, key_name, owner, lease_ms, 0).recv_timeout(DEADLINE).unwrap() {
            Err(
                err @ (RequestError::NotLeader { .. }
                | RequestError::LeadershipLost { .. }
                | RequestError::Dropped),
            ) if std::time::Instant::now() < deadline => {
                let _ = err;
            }
            reply => return granted(reply),
        }
    }
}

fn held_everywhere(cluster: &Cluster, key_name: &str) -> bool {
    cluster.running().iter().all(|id| cluster.local_table(*id).holder(key_name.as_bytes()).is_some())
}

fn gone_everywhere(cluster: &Cluster, key_name: &str) -> bool {
    cluster.running().iter().all(|id| cluster.local_table(*id).holder(key_name.as_bytes()).is_none())
}

/// Lets the drivers run for a while, for checks that something does *not*
/// happen. The expiry scan runs every 10 ms, so this is many scans.
fn let_run() {
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn a_lease_expires_only_through_the_leaders_committed_expire() {
    let cluster = Cluster::start(3);
    let leader = cluster.leader();
    acquire(&cluster, "a", "o1", 1_000);
    cluster.wait_for("the grant everywhere", |c| held_everywhere(c, "a"));

    // Followers' clocks race ahead; the leader's stands still.
    for id in (1..=3).filter(|id| *id != leader) {
        cluster.clock(id).set(1_000_000);
    }
    let_run();
    assert!(held_everywhere(&cluster, "a"), "a follower's clock removed a lock");

    cluster.clock(leader).set(999);
    let_run();
    assert!(held_everywhere(&cluster, "a"), "expired before the leader's deadline");

    cluster.clock(leader).set(1_000);
    cluster.wait_for("the expiry everywhere", |c| gone_everywhere(c, "a"));
}

#[test]
fn a_fast_clock_matters_only_once_its_node_leads_and_then_only_by_its_own_deadlines() {
    let cluster = Cluster::start(3);
    let leader = cluster.leader();
    let fast = (1..=3).find(|id| *id != leader).unwrap();
    acquire(&cluster, "short", "o1", 5_000);
    acquire(&cluster, "long", "o1", 60_000);
    cluster.wait_for("the grants everywhere", |c| held_everywhere(c, "short") && held_everywhere(c, "long"));

    // One second passes; the fast node's clock says ten.
    for id in 1..=3 {
        cluster.clock(id).set(if id == fast { 10_000 } else { 1_000 });
    }
    let_run();
    assert!(held_everywhere(&cluster, "short"), "a fast follower expired a lock");

    cluster.transfer_leader(fast);
    cluster.wait_for("the fast leader to expire the short lease", |c| gone_everywhere(c, "short"));
    let_run();
    assert!(held_everywhere(&cluster, "long"), "the fast leader expired a lease its clock does not call due");
}

#[test]
fn a_late_expire_after_a_regrant_leaves_the_new_lock_and_a_duplicate_is_harmless() {
    let cluster = Cluster::start(3);
    let old = acquire(&cluster, "a", "o1", 30_000);
    let expire = |token| Command::Expire { key: key("a"), token, delay: None };
    assert_eq!(cluster.propose_on_leader(vec![expire(old)]), [ApplyResult::Expired { existed: true }]);
    assert_eq!(cluster.propose_on_leader(vec![expire(old)]), [ApplyResult::Expired { existed: false }]);
    let new = acquire(&cluster, "a", "o2", 30_000);
    assert!(new > old);
    assert_eq!(cluster.propose_on_leader(vec![expire(old)]), [ApplyResult::Expired { existed: false }]);
    let leader = cluster.leader();
    assert_eq!(cluster.read(leader, Query::Check { key: key("a"), token: new }), Ok(Response::Check(true)));
}

#[test]
fn a_lock_renewed_at_its_deadline_is_kept_for_the_new_lease() {
    let cluster = Cluster::start(3);
    let mut renewed = 0;
    let mut lost = 0;
    let mut now_ms = 0;
    for round in 0..20u64 {
        let name = format!("race-{round}");
        cluster.set_all_clocks(now_ms);
        let token = acquire(&cluster, &name, "o1", 1_000);
        let leader = cluster.leader();
        // The deadline arrives as the renewal is sent: either may win, but
        // only one outcome is allowed for each.
        let lease_ms = LeaseMs::new(5_000).unwrap();
        let renewal = cluster
            .propose_async(leader, vec![Command::Renew { key: key(&name), token, lease_ms, user: None }]);
        if round % 2 == 0 {
            std::thread::sleep(Duration::from_millis(round % 7));
        }
        cluster.clock(leader).set(now_ms + 1_000);
        match renewal.recv_timeout(DEADLINE).unwrap() {
            Ok(Response::Applied(results)) if results == [ApplyResult::Renewed { token, lease_ms }] => {
                renewed += 1;
                let_run();
                assert_eq!(
                    cluster.read(leader, Query::Check { key: key(&name), token }),
                    Ok(Response::Check(true)),
                    "round {round}: told Renewed, then the lock was gone"
                );
            }
            Ok(Response::Applied(results))
                if matches!(results.as_slice(), [ApplyResult::NotFound { .. }]) =>
            {
                lost += 1
            }
            // Leadership moved under load: this round proves nothing either way.
            Err(RequestError::NotLeader { .. } | RequestError::LeadershipLost { .. }) => {}
            other => panic!("round {round}: {other:?}"),
        }
        now_ms += 10_000;
    }
    assert!(renewed > 0, "no round renewed in time ({lost} lost)");
}

#[test]
fn after_a_fail_over_a_lock_is_neither_lost_early_nor_kept_past_the_new_leaders_deadline() {
    let mut cluster = Cluster::start(3);
    acquire(&cluster, "a", "o1", 10_000);
    cluster.wait_for("the grant everywhere", |c| held_everywhere(c, "a"));
    // Every node applied the grant at 0 on its clock.
    cluster.set_all_clocks(6_000);
    let old_leader = cluster.leader();
    let _ = cluster.crash(old_leader);
    let new_leader = cluster.leader();
    cluster.clock(new_leader).set(9_999);
    let_run();
    assert!(held_everywhere(&cluster, "a"), "the new leader expired the lock early");
    // Not reset to a full lease by the fail-over: due at 0 + 10,000.
    cluster.clock(new_leader).set(10_000);
    cluster.wait_for("the expiry by the new leader", |c| gone_everywhere(c, "a"));
}

#[test]
fn a_grant_whose_client_is_gone_is_released_at_once() {
    let cluster = Cluster::start(3);
    let leader = cluster.leader();
    let before = acquire(&cluster, "warm", "o1", 30_000);
    // The reply channel is dropped before the grant commits: a ghost.
    drop(cluster.acquire_async(leader, "ghost", "o2", 30_000, 0));
    cluster.wait_for("the ghost lock released", |c| {
        let table = c.local_table(leader);
        table.holder(b"ghost").is_none() && table.last_token() > Some(before)
    });
    let after = acquire(&cluster, "ghost", "o3", 30_000);
    assert!(after.get() >= before.get() + 2, "the ghost's token was reused");
}

#[test]
fn waiters_are_granted_in_arrival_order_and_a_timed_out_waiter_is_skipped() {
    let cluster = Cluster::start(3);
    let leader = cluster.leader();
    let mut holder = acquire(&cluster, "hot", "holder", 30_000);
    let patient: Vec<_> = (0..20)
        .map(|i| {
            let wait_ms = if i == 5 { 100 } else { 60_000 };
            (i, cluster.acquire_async(leader, "hot", &format!("waiter-{i}"), 30_000, wait_ms))
        })
        .collect();
    let_run();
    cluster.clock(leader).set(200);
    assert!(matches!(
        patient[5].1.recv_timeout(DEADLINE).unwrap(),
        Err(RequestError::WaitTimedOut { holder_token: Some(token), .. }) if token == holder
    ));
    // A try-acquire does not jump the queue.
    assert!(matches!(
        cluster.acquire_async(leader, "hot", "impatient", 30_000, 0).recv_timeout(DEADLINE).unwrap(),
        Err(RequestError::Held { .. })
    ));

    let mut order = Vec::new();
    for (i, reply) in patient.iter().filter(|(i, _)| *i != 5) {
        cluster.propose(leader, vec![release("hot", Some(holder))]).unwrap();
        let token = granted(reply.recv_timeout(DEADLINE).unwrap());
        assert!(token > holder, "tokens increase along the queue");
        holder = token;
        order.push(*i);
    }
    let expected: Vec<i32> = (0..20).filter(|i| *i != 5).collect();
    assert_eq!(order, expected);
}

#[test]
fn leases_outside_the_configured_bounds_are_refused() {
    let cluster = Cluster::start_with(1, |config| {
        config.leases.lease_min_ms = 2_000;
        config.leases.lease_max_ms = 60_000;
    });
    let leader = cluster.leader();
    for lease_ms in [1_999, 60_001] {
        assert!(matches!(
            cluster.acquire_async(leader, "a", "o1", lease_ms, 0).recv_timeout(DEADLINE).unwrap(),
            Err(RequestError::LeaseOutOfBounds { min_ms: 2_000, max_ms: 60_000, .. })
        ));
    }
    granted(cluster.acquire_async(leader, "a", "o1", 2_000, 0).recv_timeout(DEADLINE).unwrap());
}
