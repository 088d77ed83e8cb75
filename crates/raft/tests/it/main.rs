//! Cluster tests of the raft driver: real drivers on raft-engine, joined by
//! channels, under leader loss, partitions, crashes and compaction.

// Test code: unwrapping is how a test fails.
#![allow(clippy::unwrap_used)]

mod harness;
mod leases;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fencelock_raft::{Query, RequestError, Response};
use fencelock_types::{ApplyResult, Command, FencingToken, LeaseMs};
use harness::{grant, key, release, Cluster, DEADLINE};

#[test]
fn a_one_node_cluster_grants() {
    let cluster = Cluster::start(1);
    let first = cluster.grant("a", "o1");
    let second = cluster.grant("b", "o1");
    assert!(second > first);
    let leader = cluster.leader();
    assert_eq!(cluster.read(leader, Query::Check { key: key("a"), token: first }), Ok(Response::Check(true)));
}

#[test]
fn grants_replicate_and_every_table_converges() {
    for size in [3, 5] {
        let cluster = Cluster::start(size);
        let mut last = None;
        for i in 0..40 {
            let token = cluster.grant(&format!("lock/{i}"), &format!("owner-{}", i % 3));
            assert!(Some(token) > last, "tokens increase");
            last = Some(token);
        }
        let table = cluster.converged();
        let restored = fencelock_fsm::LockTable::restore(&table).unwrap();
        assert_eq!(restored.len(), 40);
        assert_eq!(restored.last_token(), last);
    }
}

#[test]
fn killing_the_leader_elects_another_that_issues_higher_tokens() {
    let mut cluster = Cluster::start(3);
    let mut last = FencingToken::FIRST;
    for i in 0..10 {
        last = cluster.grant(&format!("k{i}"), "o1");
    }
    let old_leader = cluster.leader();
    let _ = cluster.crash(old_leader);
    let new_leader = cluster.leader();
    assert_ne!(new_leader, old_leader);
    let next = cluster.grant("after", "o2");
    assert!(next > last, "{next} after {last}");
    // Every acknowledged grant survived the leader.
    for i in 0..10 {
        assert!(matches!(
            cluster.read(new_leader, Query::Holder(key(&format!("k{i}")))),
            Ok(Response::Holder(Some(_)))
        ));
    }
    cluster.restart(old_leader);
    cluster.converged();
}

#[test]
fn an_isolated_leader_fails_its_pending_proposals_with_a_retryable_error() {
    let cluster = Cluster::start(3);
    cluster.grant("warm", "o1");
    let old_leader = cluster.leader();
    cluster.isolate(old_leader);
    let pending = cluster.propose_async(old_leader, vec![grant("stranded", "o1")]);
    let reply = pending.recv_timeout(DEADLINE).expect("the stranded proposal is answered");
    assert!(
        matches!(reply, Err(RequestError::LeadershipLost { .. } | RequestError::NotLeader { .. })),
        "{reply:?}"
    );
    let others: Vec<u64> = (1..=3).filter(|id| *id != old_leader).collect();
    let new_leader = cluster.leader_among(&others);
    assert_ne!(new_leader, old_leader);
    cluster.heal();
    // The retry is safe whatever became of the stranded proposal: same owner,
    // so at most one grant, and it holds one token.
    let results = cluster.propose_on_leader(vec![grant("stranded", "o1")]);
    assert!(matches!(results.as_slice(), [ApplyResult::Granted { .. }]), "{results:?}");
    cluster.converged();
}

#[test]
fn the_minority_side_grants_nothing_while_the_majority_goes_on() {
    let cluster = Cluster::start(5);
    cluster.grant("before", "o1");
    let leader = cluster.leader();
    // Put the current leader in the minority.
    let minority: Vec<u64> =
        std::iter::once(leader).chain((1..=5).filter(|id| *id != leader).take(1)).collect();
    let majority: Vec<u64> = (1..=5).filter(|id| !minority.contains(id)).collect();
    cluster.partition(&[minority.clone(), majority.clone()]);

    let deadline = Instant::now() + Duration::from_secs(2);
    let mut attempts = 0;
    while Instant::now() < deadline {
        for id in &minority {
            let reply = cluster.propose(*id, vec![grant(&format!("minority-{attempts}"), "o2")]);
            assert!(reply.is_err(), "the minority granted: {reply:?}");
            attempts += 1;
        }
    }
    let majority_leader = cluster.leader_among(&majority);
    let mut tokens = Vec::new();
    for i in 0..10 {
        match cluster.propose(majority_leader, vec![grant(&format!("majority-{i}"), "o3")]) {
            Ok(Response::Applied(results)) => tokens.push(results),
            other => panic!("the majority must serve: {other:?}"),
        }
    }
    cluster.heal();
    let table = fencelock_fsm::LockTable::restore(&cluster.converged()).unwrap();
    assert!(table.list(b"minority-", usize::MAX).next().is_none(), "a minority grant survived");
    assert_eq!(table.list(b"majority-", usize::MAX).count(), 10);
}

#[test]
fn a_crash_of_every_node_loses_no_acknowledged_grant_and_reuses_no_token() {
    let mut cluster = Cluster::start(3);
    let mut acknowledged = BTreeMap::new();
    for i in 0..30 {
        let name = format!("k{i}");
        acknowledged.insert(name.clone(), cluster.grant(&name, "o1"));
    }
    let highest = *acknowledged.values().max().unwrap();
    for id in 1..=3 {
        let _ = cluster.crash(id);
    }
    for id in 1..=3 {
        cluster.restart(id);
    }
    let leader = cluster.leader();
    for (name, token) in &acknowledged {
        assert_eq!(
            cluster.read(leader, Query::Check { key: key(name), token: *token }),
            Ok(Response::Check(true)),
            "{name} lost its grant"
        );
    }
    let next = cluster.grant("after-restart", "o2");
    assert!(next > highest, "token {next} reused or went back (highest was {highest})");
    cluster.converged();
}

#[test]
fn a_follower_far_behind_a_compacted_log_catches_up_by_snapshot() {
    let mut cluster = Cluster::start_with(3, |config| config.raft.snapshot_interval_entries = 16);
    cluster.grant("first", "o1");
    let leader = cluster.leader();
    let lagging = (1..=3).find(|id| *id != leader).unwrap();
    let lagging_last = cluster.status(lagging).unwrap().log.last_index;
    let _ = cluster.crash(lagging);
    for i in 0..100 {
        cluster.grant(&format!("while-down-{i}"), "o1");
    }
    let leader_status = cluster.status(cluster.leader()).unwrap();
    assert!(
        leader_status.log.snapshot_index > lagging_last,
        "the log was compacted past what the lagging node has ({} <= {lagging_last})",
        leader_status.log.snapshot_index
    );
    cluster.restart(lagging);
    let table = cluster.converged();
    assert_eq!(fencelock_fsm::LockTable::restore(&table).unwrap().len(), 101);
    assert!(cluster.status(lagging).unwrap().log.snapshot_index >= leader_status.log.snapshot_index);
}

#[test]
fn commands_for_one_key_apply_in_the_order_they_were_accepted() {
    let cluster = Cluster::start(3);
    let leader = cluster.leader();
    // Sent back to back, without waiting: any reordering would show as a
    // Held reply or a NotFound.
    let owners = ["o1", "o2", "o3", "o4", "o5", "o6", "o7", "o8"];
    let mut replies = Vec::new();
    for owner in owners {
        replies.push(cluster.propose_async(leader, vec![grant("hot", owner)]));
        replies.push(cluster.propose_async(leader, vec![release("hot", None)]));
    }
    let mut last = None;
    for (i, reply) in replies.into_iter().enumerate() {
        let reply = reply.recv_timeout(DEADLINE).unwrap();
        match (i % 2, reply) {
            (0, Ok(Response::Applied(results))) => match results.as_slice() {
                [ApplyResult::Granted { token, existing: false, .. }] => {
                    assert!(Some(*token) > last);
                    last = Some(*token);
                }
                other => panic!("grant {i}: {other:?}"),
            },
            (1, Ok(Response::Applied(results))) => {
                assert_eq!(results, [ApplyResult::Released { token: last.unwrap() }], "release {i}");
            }
            (_, other) => panic!("request {i}: {other:?}"),
        }
    }
}

#[test]
fn many_callers_on_few_keys_never_meet_grant_rejected() {
    let cluster = Cluster::start(3);
    let leader = cluster.leader();
    std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for caller in 0..16 {
            let cluster = &cluster;
            handles.push(scope.spawn(move || {
                let owner = format!("caller-{caller}");
                let mut granted = 0;
                let mut held = 0;
                for round in 0..20 {
                    let name = format!("key-{}", (caller + round) % 3);
                    match cluster.propose(leader, vec![grant(&name, &owner)]) {
                        Ok(Response::Applied(results)) => match results.as_slice() {
                            [ApplyResult::Granted { token, .. }] => {
                                granted += 1;
                                let released = cluster.propose(leader, vec![release(&name, Some(*token))]);
                                assert_eq!(
                                    released,
                                    Ok(Response::Applied(vec![ApplyResult::Released { token: *token }]))
                                );
                            }
                            other => panic!("{owner} on {name}: {other:?}"),
                        },
                        Err(RequestError::Held { .. }) => held += 1,
                        other => panic!("{owner} on {name}: {other:?}"),
                    }
                }
                (granted, held)
            }));
        }
        let (granted, _held): (u32, u32) = handles
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .fold((0, 0), |(g, h), (g1, h1)| (g + g1, h + h1));
        assert!(granted > 0);
    });
    cluster.converged();
}

#[test]
fn renewals_of_many_locks_travel_in_one_request() {
    let cluster = Cluster::start(3);
    let tokens: Vec<FencingToken> = (0..5).map(|i| cluster.grant(&format!("r{i}"), "o1")).collect();
    let lease_ms = LeaseMs::new(60_000).unwrap();
    let renewals: Vec<Command> = tokens
        .iter()
        .enumerate()
        .map(|(i, token)| Command::Renew { key: key(&format!("r{i}")), token: *token, lease_ms, user: None })
        .collect();
    let results = cluster.propose_on_leader(renewals);
    let expected: Vec<ApplyResult> =
        tokens.iter().map(|token| ApplyResult::Renewed { token: *token, lease_ms }).collect();
    assert_eq!(results, expected);
}

#[test]
fn linearizable_reads_answer_from_the_leader_and_followers_refuse() {
    let cluster = Cluster::start(3);
    let a = cluster.grant("jobs/a", "o1");
    let b = cluster.grant("jobs/b", "o2");
    cluster.grant("other", "o3");
    let leader = cluster.leader();
    match cluster.read(leader, Query::List { prefix: b"jobs/".to_vec(), limit: 10 }) {
        Ok(Response::List(locks)) => {
            let found: Vec<(Vec<u8>, FencingToken)> =
                locks.iter().map(|(key, held)| (key.as_bytes().to_vec(), held.lock.token)).collect();
            assert_eq!(found, [(b"jobs/a".to_vec(), a), (b"jobs/b".to_vec(), b)]);
        }
        other => panic!("{other:?}"),
    }
    match cluster.read(leader, Query::Holder(key("jobs/b"))) {
        Ok(Response::Holder(Some(held))) => {
            assert_eq!(held.lock.token, b);
            // The leader tracks its lease: some of it is left.
            let remaining = held.remaining_ms.unwrap();
            assert!(remaining > 0 && remaining <= held.lock.lease_ms.get(), "{held:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        cluster.read(leader, Query::Check { key: key("jobs/a"), token: b }),
        Ok(Response::Check(false))
    );
    assert_eq!(cluster.read(leader, Query::Holder(key("free"))), Ok(Response::Holder(None)));
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    assert!(matches!(
        cluster.read(follower, Query::Holder(key("jobs/a"))),
        Err(RequestError::NotLeader { leader_hint: Some(hint) }) if hint.0 == leader
    ));
}
