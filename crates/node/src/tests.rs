//! Tests of the driver core in one thread: replicas on in-memory stores,
//! messages passed by hand, so that a test can hold a node in exactly the
//! state it needs (elected but not ready, a command in flight).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fencelock_types::{ApplyResult, Command, FencingToken, Key, LeaseMs, Owner, Value};
use raft::prelude::{Entry, Message, MessageType, Snapshot};

use crate::log::{Durable, Recovered, WriteBatch};
use crate::{Config, FatalError, MemStore, NodeId, Replica, RequestError, RequestId, Response, StorageError};

fn logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

fn key(name: &str) -> Key {
    Key::new(name.as_bytes().to_vec()).unwrap()
}

fn grant(name: &str, owner: &str) -> Command {
    Command::Grant {
        session: None,
        key: key(name),
        lease_ms: LeaseMs::new(1000).unwrap(),
        owner: Owner::new(owner.as_bytes().to_vec()).unwrap(),
        value: fencelock_types::Value::none(),
    }
}

/// A store that fails every write once told to, as a full or broken disk.
#[derive(Clone, Default)]
struct FailingStore {
    inner: MemStore,
    failing: Arc<AtomicBool>,
}

impl Durable for FailingStore {
    fn recover(&mut self) -> Result<Recovered, StorageError> {
        self.inner.recover()
    }

    fn write(&mut self, batch: &WriteBatch) -> Result<(), StorageError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(StorageError::Corrupt { what: "disk", detail: "injected failure".into() });
        }
        self.inner.write(batch)
    }
}

/// A store a test's replica writes to on the test's thread: synchronous
/// ones report each write durable at once, a [`QueuedStore`] only when the
/// test flushes it.
trait TestStore: Durable {
    fn synchronous(&self) -> bool {
        true
    }
}

impl TestStore for MemStore {}
impl TestStore for FailingStore {}
impl TestStore for QueuedStore {
    fn synchronous(&self) -> bool {
        false
    }
}

/// Replicas joined by hand-passed messages.
struct Net<D: TestStore> {
    replicas: Vec<Replica>,
    stores: Vec<D>,
    /// Message types not delivered to a node: (to, type).
    blocked: BTreeSet<(u64, i32)>,
    /// Nodes that neither send nor receive, as if stopped.
    down: BTreeSet<u64>,
    /// Nodes stopped by a fatal error (removed from the cluster): they
    /// take no more turns.
    stopped: Vec<(u64, FatalError)>,
    replies: Vec<(u64, RequestId, crate::Reply)>,
    /// Each node's applied changes, with their index, in order.
    applied: Vec<(u64, u64, crate::AppliedEvent)>,
}

impl Net<MemStore> {
    fn new(size: u64) -> Net<MemStore> {
        Net::with_stores((1..=size).map(|_| MemStore::new()).collect())
    }

    fn with_config(size: u64, tune: fn(&mut Config)) -> Net<MemStore> {
        Net::build((1..=size).map(|_| MemStore::new()).collect(), tune)
    }
}

/// A test replica's config: followers never time out on their own, so
/// elections happen only when a test calls `campaign`.
fn test_config(id: u64, size: u64) -> Config {
    let voters: Vec<NodeId> = (1..=size).map(NodeId).collect();
    let mut config = short_leases(Config::new(NodeId(id), voters));
    config.raft.election_ticks = 1_000;
    config.raft.election_ticks_max = Some(1_001);
    config
}

/// `config` taking the 1 s leases these tests ask for (the default
/// shortest lease is 2 s, fencelockd's): no real election timeout runs here.
pub(crate) fn short_leases(mut config: Config) -> Config {
    config.leases.lease_min_ms = 1_000;
    config
}

impl<D: TestStore + Clone> Net<D> {
    fn with_stores(stores: Vec<D>) -> Net<D> {
        Net::build(stores, |_| {})
    }

    fn build(stores: Vec<D>, tune: fn(&mut Config)) -> Net<D> {
        let size = stores.len() as u64;
        let replicas = stores
            .iter()
            .enumerate()
            .map(|(i, store)| {
                let mut config = test_config(i as u64 + 1, size);
                tune(&mut config);
                Replica::open(config, store.clone().recover().unwrap(), &logger()).unwrap()
            })
            .collect();
        Net {
            replicas,
            stores,
            blocked: BTreeSet::new(),
            down: BTreeSet::new(),
            stopped: Vec::new(),
            replies: Vec::new(),
            applied: Vec::new(),
        }
    }
}

impl<D: TestStore> Net<D> {
    fn node(&mut self, id: u64) -> &mut Replica {
        &mut self.replicas[(id - 1) as usize]
    }

    /// Runs one turn on every node, makes their writes (a synchronous
    /// store's are reported durable at once, and the node takes another
    /// turn to let go of what waited for them), and delivers the messages;
    /// false when nothing happened.
    fn turn(&mut self) -> Result<bool, FatalError> {
        let mut messages = Vec::new();
        let mut busy = false;
        for (at, (replica, store)) in self.replicas.iter_mut().zip(&mut self.stores).enumerate() {
            let id = at as u64 + 1;
            if self.stopped.iter().any(|(stopped, _)| *stopped == id) {
                continue;
            }
            loop {
                match replica.run_ready() {
                    Err(removed @ FatalError::Removed { .. }) => {
                        self.stopped.push((id, removed));
                        self.down.insert(id);
                        break;
                    }
                    other => other?,
                }
                let mut effects = replica.take_effects();
                // Encoded at once, as a worker thread would, a moment later.
                if let Some(job) = effects.encode.take() {
                    replica.on_snapshot_encoded(job.index, job.encode());
                }
                let id = replica.status().id.0;
                busy |= !effects.messages.is_empty() || !effects.replies.is_empty();
                messages.extend(effects.messages);
                self.replies.extend(effects.replies.into_iter().map(|(request, reply)| (id, request, reply)));
                self.applied.extend(effects.applied.into_iter().map(|(index, event)| (id, index, event)));
                let Some(last) = effects.writes.last().map(|write| write.n) else { break };
                for write in &effects.writes {
                    store.write(&write.batch)?;
                }
                if !store.synchronous() {
                    break;
                }
                replica.on_persisted(last);
            }
        }
        for message in messages {
            if self.down.contains(&message.to) || self.down.contains(&message.from) {
                continue;
            }
            if !self.blocked.contains(&(message.to, message.get_msg_type() as i32)) {
                let to = message.to;
                self.node(to).step(message);
            }
        }
        Ok(busy)
    }

    /// Runs turns until quiet, then a few heartbeats (so that raft resends
    /// what was lost), each again until quiet.
    fn settle(&mut self) {
        for _ in 0..5 {
            self.until_quiet();
            for replica in &mut self.replicas {
                for _ in 0..2 {
                    replica.tick();
                }
            }
        }
        self.until_quiet();
    }

    fn until_quiet(&mut self) {
        for _ in 0..1_000 {
            if !self.turn().unwrap() {
                return;
            }
        }
        panic!("the network did not settle");
    }

    /// Makes `id` the ready leader: by election, or by transfer from the
    /// current leader (whose followers would ignore a plain campaign).
    fn elect(&mut self, id: u64) {
        let leader =
            self.replicas.iter().find(|r| r.status().role == crate::Role::Leader).map(|r| r.status().id);
        match leader {
            Some(leader) if leader.0 == id => {}
            Some(leader) => self.node(leader.0).transfer_leader(NodeId(id)),
            None => self.node(id).campaign().unwrap(),
        }
        self.settle();
        assert!(self.node(id).is_leader_ready(), "{:?}", self.node(id).status());
    }

    fn take_reply(&mut self, request: RequestId) -> Option<crate::Reply> {
        let at = self.replies.iter().position(|(_, id, _)| *id == request)?;
        Some(self.replies.remove(at).2)
    }
}

#[test]
fn a_new_leader_proposes_nothing_before_it_applies_an_entry_of_its_own_term() {
    let mut net = Net::new(3);
    // Votes arrive, append acknowledgements to node 2 do not: elected, but
    // its own-term entry cannot commit.
    net.blocked.insert((2, MessageType::MsgAppendResponse as i32));
    net.node(2).campaign().unwrap();
    net.settle();
    let status = net.node(2).status();
    assert_eq!(status.role, crate::Role::Leader);
    assert!(!status.leader_ready);
    let last_index = status.last_index;

    net.node(2).propose(RequestId(1), vec![grant("a", "o1")]);
    for _ in 0..5 {
        net.turn().unwrap();
    }
    assert_eq!(net.node(2).status().last_index, last_index, "proposed before the own-term barrier");
    assert_eq!(net.node(2).stats().commands_proposed, 0);
    assert!(net.take_reply(RequestId(1)).is_none());

    net.blocked.clear();
    net.settle();
    assert!(net.node(2).is_leader_ready());
    assert!(matches!(
        net.take_reply(RequestId(1)),
        Some(Ok(Response::Applied(results))) if matches!(results[0], ApplyResult::Granted { .. })
    ));
}

#[test]
fn an_expire_and_a_renew_of_one_lock_are_never_in_flight_together() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    net.settle();
    let Some(Ok(Response::Applied(results))) = net.take_reply(RequestId(1)) else { panic!("no grant") };
    let ApplyResult::Granted { token, .. } = results[0] else { panic!("{results:?}") };

    let before = net.node(1).stats().commands_proposed;
    let lease_ms = LeaseMs::new(5000).unwrap();
    net.node(1).propose(RequestId(2), vec![Command::Renew { key: key("a"), token, lease_ms, user: None }]);
    net.node(1).propose(RequestId(3), vec![Command::Expire { key: key("a"), token, delay: None }]);
    // Another key is not held back.
    net.node(1).propose(RequestId(4), vec![grant("b", "o1")]);
    net.node(1).run_ready().unwrap();
    assert_eq!(net.node(1).stats().commands_proposed - before, 2, "renew and grant of b only");

    net.settle();
    assert_eq!(
        net.take_reply(RequestId(2)),
        Some(Ok(Response::Applied(vec![ApplyResult::Renewed { token, lease_ms }])))
    );
    assert_eq!(
        net.take_reply(RequestId(3)),
        Some(Ok(Response::Applied(vec![ApplyResult::Expired { existed: true }])))
    );
    assert_eq!(net.node(1).stats().commands_proposed - before, 3);
}

#[test]
fn a_grant_on_a_key_held_by_another_owner_is_answered_without_a_log_entry() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    net.settle();
    let Some(Ok(Response::Applied(results))) = net.take_reply(RequestId(1)) else { panic!() };
    let ApplyResult::Granted { token, .. } = results[0] else { panic!() };
    let last_index = net.node(1).status().last_index;
    net.node(1).propose(RequestId(2), vec![grant("a", "o2")]);
    net.settle();
    assert_eq!(
        net.take_reply(RequestId(2)),
        Some(Err(RequestError::Held { key: key("a"), holder_token: token }))
    );
    assert_eq!(net.node(1).status().last_index, last_index);
}

#[test]
fn followers_refuse_proposals_with_a_leader_hint() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node(2).propose(RequestId(9), vec![grant("a", "o1")]);
    net.turn().unwrap();
    assert_eq!(
        net.take_reply(RequestId(9)),
        Some(Err(RequestError::NotLeader { leader_hint: Some(NodeId(1)) }))
    );
}

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
fn a_storage_failure_is_fatal_and_acknowledges_nothing_unpersisted() {
    let store = FailingStore::default();
    let failing = Arc::clone(&store.failing);
    let mut net = Net::with_stores(vec![store]);
    net.elect(1);
    failing.store(true, Ordering::SeqCst);
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    // The shell's write fails (the node asked for it and holds the answer).
    let result = net.turn();
    assert!(matches!(result, Err(FatalError::Storage(_))), "{result:?}");
    assert!(net.take_reply(RequestId(1)).is_none(), "answered a grant whose write failed");
    assert!(net.node(1).writes_in_flight() > 0);
}

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
fn a_replica_reopened_on_its_store_rebuilds_the_same_table() {
    let stores: Vec<MemStore> = (0..3).map(|_| MemStore::new()).collect();
    let mut net = Net::with_stores(stores.clone());
    net.elect(1);
    for i in 0..20u64 {
        net.node(1).propose(RequestId(i), vec![grant(&format!("k{i}"), "o1")]);
    }
    net.settle();
    let before = net.node(1).table().snapshot();
    let last_token = net.node(1).table().last_token();
    drop(net);
    let net = Net::with_stores(stores);
    for replica in &net.replicas {
        // Entries after the last snapshot are applied again once the node
        // learns the commit index; the snapshot alone gives what was compacted.
        assert!(replica.table().last_token() <= last_token);
    }
    let mut net = net;
    net.elect(2);
    for replica in &net.replicas {
        assert_eq!(replica.table().snapshot(), before);
    }
}

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
fn tokens_never_repeat_across_leader_changes() {
    let mut net = Net::new(3);
    let mut seen = BTreeSet::new();
    let mut request = 0;
    for round in 0..6u64 {
        let leader = round % 3 + 1;
        net.elect(leader);
        for _ in 0..5 {
            request += 1;
            net.node(leader).propose(RequestId(request), vec![grant(&format!("k{request}"), "o1")]);
        }
        net.settle();
        for id in (request - 4)..=request {
            match net.take_reply(RequestId(id)) {
                Some(Ok(Response::Applied(results))) => match results[0] {
                    ApplyResult::Granted { token, .. } => {
                        assert!(seen.insert(token), "token {token} issued twice")
                    }
                    other => panic!("{other:?}"),
                },
                other => panic!("request {id}: {other:?}"),
            }
        }
    }
    assert_eq!(seen.len(), 30);
    assert_eq!(seen.iter().next_back(), FencingToken::new(30).as_ref());
}

fn applied_token(reply: Option<crate::Reply>) -> FencingToken {
    match reply {
        Some(Ok(Response::Applied(results))) => match results.as_slice() {
            [ApplyResult::Granted { token, .. }] => *token,
            other => panic!("expected a grant: {other:?}"),
        },
        other => panic!("expected a grant: {other:?}"),
    }
}

fn owner(name: &str) -> Owner {
    Owner::new(name.as_bytes().to_vec()).unwrap()
}

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

#[test]
fn renewals_of_many_locks_travel_in_one_entry() {
    let mut net = Net::new(3);
    net.elect(1);
    let lease_ms = LeaseMs::new(1000).unwrap();
    let mut tokens = Vec::new();
    for i in 0..5u64 {
        net.node(1).acquire(RequestId(i), key(&format!("k{i}")), lease_ms, owner("o1"), Value::none(), 0);
        net.settle();
        tokens.push(applied_token(net.take_reply(RequestId(i))));
    }
    let before = net.node(1).stats();
    let renewals = tokens
        .iter()
        .enumerate()
        .map(|(i, token)| Command::Renew { key: key(&format!("k{i}")), token: *token, lease_ms, user: None })
        .collect();
    net.node(1).propose(RequestId(100), renewals);
    net.settle();
    let after = net.node(1).stats();
    assert_eq!(after.entries_proposed - before.entries_proposed, 1);
    let expected = tokens.iter().map(|token| ApplyResult::Renewed { token: *token, lease_ms }).collect();
    assert_eq!(net.take_reply(RequestId(100)), Some(Ok(Response::Applied(expected))));
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

/// An asynchronous store: writes wait in a queue until the test flushes
/// them, as `AsyncEngineStore`'s I/O thread would.
#[derive(Clone, Default)]
pub(crate) struct QueuedStore {
    inner: MemStore,
    queue: Arc<std::sync::Mutex<Vec<WriteBatch>>>,
    written: Arc<std::sync::atomic::AtomicU64>,
}

impl QueuedStore {
    /// Makes every queued write durable; returns the count of durable
    /// writes.
    pub(crate) fn flush(&self) -> u64 {
        for batch in std::mem::take(&mut *self.queue.lock().unwrap()) {
            self.inner.clone().write(&batch).unwrap();
        }
        self.written.load(Ordering::SeqCst)
    }
}

impl Durable for QueuedStore {
    fn recover(&mut self) -> Result<Recovered, StorageError> {
        self.inner.recover()
    }

    fn write(&mut self, batch: &WriteBatch) -> Result<(), StorageError> {
        self.queue.lock().unwrap().push(batch.clone());
        self.written.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Turns on every node, persisting the writes of the nodes in `persist`.
fn turns_persisting(net: &mut Net<QueuedStore>, stores: &[QueuedStore], persist: &[u64], turns: usize) {
    for _ in 0..turns {
        net.turn().unwrap();
        for id in persist {
            // The messages that waited for these writes leave with the
            // node's next turn.
            let durable = stores[(*id - 1) as usize].flush();
            net.node(*id).on_persisted(durable);
        }
    }
}

#[test]
fn with_an_asynchronous_store_nothing_counts_before_its_write_is_durable() {
    let stores: Vec<QueuedStore> = (0..3).map(|_| QueuedStore::default()).collect();
    let mut net = Net::with_stores(stores.clone());
    // Votes are held until their node's hard state is durable.
    net.node(1).campaign().unwrap();
    turns_persisting(&mut net, &stores, &[1], 20);
    assert_ne!(net.node(1).status().role, crate::Role::Leader, "elected on votes not yet durable");
    turns_persisting(&mut net, &stores, &[1, 2, 3], 20);
    assert!(net.node(1).is_leader_ready());

    // Only the leader's disk syncs: its entry is not committed by a quorum.
    let commit = net.node(1).status().commit_index;
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    turns_persisting(&mut net, &stores, &[1], 20);
    assert_eq!(net.node(1).status().commit_index, commit, "committed on acknowledgements not yet durable");
    assert!(net.take_reply(RequestId(1)).is_none());

    // The followers' disks sync: a quorum has it, but the leader answers
    // only once its own copy is durable too.
    net.node(1).propose(RequestId(2), vec![grant("b", "o1")]);
    turns_persisting(&mut net, &stores, &[2, 3], 20);
    assert!(net.node(1).status().commit_index > commit);
    assert!(net.take_reply(RequestId(2)).is_none(), "answered before the leader's own write was durable");
    assert!(net.node(1).writes_in_flight() > 0);

    turns_persisting(&mut net, &stores, &[1, 2, 3], 20);
    assert_eq!(net.node(1).writes_in_flight(), 0);
    for id in [1, 2] {
        assert!(matches!(
            net.take_reply(RequestId(id)),
            Some(Ok(Response::Applied(results))) if matches!(results[0], ApplyResult::Granted { .. })
        ));
    }
}

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
    let floor = crate::rejoin::Floor { term, last_index: net.node(1).status().last_index };
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
    heartbeat.commit = net.node(1).status().commit_index;
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
    let last = net.node(2).status().last_index;
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    turns_persisting(&mut net, &stores, &[2, 3], 10);
    assert_eq!(net.node(2).status().last_index, last, "an append left before node 3 was recorded");
    turns_persisting(&mut net, &stores, &[1, 2, 3], 20);
    assert!(net.node(2).status().last_index > last);
    assert!(matches!(net.take_reply(RequestId(1)), Some(Ok(Response::Applied(_)))));
}

#[test]
fn a_deposed_leader_cut_off_from_the_others_never_answers_a_read_from_its_stale_table() {
    // Node 1 leads and grants "a"; then it is cut off, the others elect a
    // leader of their own and release "a". Node 1 still believes it leads.
    // A linearizable read it takes must not answer from its table (which
    // still says "a" is held): through ReadIndex it waits for a quorum that
    // never answers.
    let mut net = Net::with_config(3, |config| {
        config.raft.election_ticks = 10;
        config.raft.election_ticks_max = Some(1_000);
    });
    net.elect(1);
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    net.settle();
    let token = applied_token(net.take_reply(RequestId(1)));
    net.down.insert(1);
    // Nodes 2 and 3 stop hearing from node 1. Node 2 times out first and
    // node 3, past the leader's lease but not yet timed out, votes for it.
    net.node(2).pin_election_timeout(50);
    net.node(3).pin_election_timeout(999);
    for _ in 0..60 {
        net.node(2).tick();
        net.node(3).tick();
    }
    net.until_quiet();
    let leader = 2;
    assert!(net.node(leader).is_leader_ready(), "{:?}", net.node(leader).status());
    net.node(leader)
        .propose(RequestId(2), vec![Command::Release { key: key("a"), token: Some(token), user: None }]);
    net.settle();
    assert!(net.node(leader).table().holder(b"a").is_none());
    assert_eq!(net.node(1).status().role, crate::Role::Leader, "node 1 no longer believes it leads");
    net.node(1).read(RequestId(3), crate::Query::Holder(key("a")));
    net.settle();
    match net.take_reply(RequestId(3)) {
        None | Some(Err(_)) => {}
        Some(Ok(answer)) => {
            panic!("a deposed leader answered a linearizable read from its own table: {answer:?}")
        }
    }
}

/// A message "from" node `from` to node `to` in the current term of `to`.
fn forged(net: &mut Net<MemStore>, kind: MessageType, from: u64, to: u64) -> Message {
    let mut message = Message::default();
    message.set_msg_type(kind);
    message.from = from;
    message.to = to;
    message.term = net.node(to).status().term;
    message
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
        ack.index = net.node(to).status().last_index + 100;
        net.node(to).step(ack);
        // A snapshot far ahead that would erase the locks and restart tokens.
        let mut snapshot = Snapshot::default();
        snapshot.set_data(fencelock_fsm::LockTable::new().snapshot().into());
        snapshot.mut_metadata().index = net.node(to).status().commit_index + 100;
        snapshot.mut_metadata().term = term;
        snapshot.mut_metadata().set_conf_state(raft::prelude::ConfState::from((vec![1, 2, 3], vec![])));
        let mut install = forged(&mut net, MessageType::MsgSnapshot, from, to);
        install.set_snapshot(snapshot);
        net.node(to).step(install);
        // A membership change slipped into an append.
        let mut change = forged(&mut net, MessageType::MsgAppend, from, to);
        let last = net.node(to).status().last_index;
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

#[path = "membership_tests.rs"]
mod membership;

/// A watch's answer, or a failure naming what came instead.
fn watch_answer(reply: Option<crate::Reply>) -> crate::watch::WatchAnswer {
    match reply {
        Some(Ok(Response::Watch(answer))) => answer,
        other => panic!("a watch answered {other:?}"),
    }
}

#[test]
fn watches_on_followers_follow_the_log_across_a_leader_change_and_a_snapshot_install() {
    use crate::registry::ConnId;
    use crate::watch::{WatchKind, WatchQuery};
    let watch =
        |after: Option<u64>, wait_ms: u64| WatchQuery { prefix: b"e/".to_vec(), after, wait_ms, limit: 100 };
    let mut net = Net::with_config(3, |config| config.raft.snapshot_interval_entries = 5);
    net.elect(1);
    // A start, on a follower: no holders yet, and the index to go on from.
    net.node(2).watch(RequestId(10), ConnId(1), watch(None, 0));
    net.settle();
    let start = watch_answer(net.take_reply(RequestId(10)));
    assert_eq!(start.current, Some(Vec::new()));
    // Parked on both followers until a change under the prefix applies.
    net.node(2).watch(RequestId(11), ConnId(1), watch(Some(start.index), 60_000));
    net.node(3).watch(RequestId(12), ConnId(1), watch(Some(start.index), 60_000));
    net.node(1).propose(RequestId(1), vec![grant("other", "o1")]);
    net.settle();
    assert!(net.take_reply(RequestId(11)).is_none(), "a change outside the prefix answered a watch");
    net.node(1).propose(RequestId(2), vec![grant("e/1", "o1")]);
    net.settle();
    let token = applied_token(net.take_reply(RequestId(2)));
    for id in [11, 12] {
        let answer = watch_answer(net.take_reply(RequestId(id)));
        assert_eq!(answer.events.len(), 1, "{answer:?}");
        let event = &answer.events[0];
        assert_eq!((event.kind, event.token, event.key.as_bytes()), (WatchKind::Granted, token, &b"e/1"[..]));
        assert_eq!(answer.index, event.index);
    }
    let seen = net.node(2).status().applied_index;
    // Leadership moves; a watch parked on the old leader (now a follower)
    // is answered by what the new leader commits.
    net.node(1).watch(RequestId(13), ConnId(2), watch(Some(seen), 60_000));
    net.elect(2);
    net.node(2).propose(
        RequestId(3),
        vec![Command::Proclaim {
            key: key("e/1"),
            token,
            value: fencelock_types::Value::new(b"v2".to_vec()).unwrap(),
            user: None,
        }],
    );
    net.settle();
    let answer = watch_answer(net.take_reply(RequestId(13)));
    assert_eq!(answer.events.iter().map(|event| event.kind).collect::<Vec<_>>(), [WatchKind::Proclaimed]);
    assert_eq!(answer.events[0].value.as_bytes(), b"v2");
    // Node 3 misses many entries and catches up from a snapshot: it cannot
    // tell what happened before it, so an old position is answered
    // compacted, with the holders now; a new one gets the changes.
    net.down.insert(3);
    for n in 0..12u64 {
        net.node(2).propose(RequestId(100 + n), vec![grant(&format!("e/x{n}"), "o2")]);
        net.settle();
    }
    net.down.remove(&3);
    net.settle();
    assert!(net.node(3).status().snapshot_index > seen, "{:?}", net.node(3).status());
    // It told its shell to rebuild from the table (what the lease timer
    // and the server's metrics follow), at the snapshot's index.
    let restored = net.node(3).status().snapshot_index;
    assert!(
        net.applied
            .iter()
            .any(|(node, index, event)| (*node, *index, event)
                == (3, restored, &crate::AppliedEvent::Restored)),
        "node 3 installed a snapshot without saying so"
    );
    net.node(3).watch(RequestId(14), ConnId(3), watch(Some(seen), 0));
    net.settle();
    let answer = watch_answer(net.take_reply(RequestId(14)));
    assert!(answer.compacted && answer.events.is_empty(), "{answer:?}");
    assert_eq!(answer.current.as_ref().map(Vec::len), Some(13));
    let caught_up = answer.index;
    net.node(3).watch(RequestId(15), ConnId(3), watch(Some(caught_up), 60_000));
    net.node(2)
        .propose(RequestId(4), vec![Command::Release { key: key("e/1"), token: Some(token), user: None }]);
    net.settle();
    let answer = watch_answer(net.take_reply(RequestId(15)));
    assert_eq!(answer.events.iter().map(|event| event.kind).collect::<Vec<_>>(), [WatchKind::Released]);
    assert!(answer.index > caught_up);
    // A closed connection's parked watch is forgotten.
    net.node(3).watch(RequestId(16), ConnId(3), watch(Some(answer.index), 60_000));
    assert!(net.node(3).cancel(RequestId(16)));
    net.node(2).propose(RequestId(5), vec![grant("e/2", "o1")]);
    net.settle();
    assert!(net.take_reply(RequestId(16)).is_none());
}

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
    let before = net.node(1).status().last_index;
    net.settle();
    assert!(matches!(net.take_reply(RequestId(1_000)), Some(Ok(Response::Applied(_)))));
    // The clock has not moved: one scan, so every lapsed holder went in one
    // request, and the renewed one stayed.
    for id in [1, 2, 3] {
        let left: Vec<FencingToken> =
            net.node(id).table().shared(b"pool").unwrap().holders.keys().copied().collect();
        assert_eq!(left, [renewed], "node {id}");
    }
    let entries = net.node(1).status().last_index - before;
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
    let before = net.node(1).status().last_index;
    net.node(1).propose(RequestId(9), vec![Command::Release { key: key("rw"), token: Some(w1), user: None }]);
    net.settle();
    assert_eq!(net.node(1).status().last_index - before, 1, "the release and the five grants take one entry");
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
    let before = net.node(1).status().last_index;
    let releases = held[..2]
        .iter()
        .map(|token| Command::Release { key: key("pool"), token: Some(*token), user: None })
        .collect();
    net.node(1).propose(RequestId(9), releases);
    net.settle();
    assert_eq!(net.node(1).status().last_index - before, 1);
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
    let before = net.node(1).status().last_index;
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
    assert!(net.node(1).status().last_index > before + 1, "the retry's re-grant shares the grant's entry");
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

#[test]
fn a_replica_stops_when_the_cluster_level_passes_its_build() {
    let mut net = Net::new(3);
    net.elect(1);
    let above = fencelock_types::LEVEL + 1;
    net.node(1).propose(RequestId(1), vec![Command::RaiseLevel { level: above }]);
    let mut stopped = None;
    for _ in 0..100 {
        match net.turn() {
            Ok(_) => {}
            Err(err) => {
                stopped = Some(err);
                break;
            }
        }
    }
    assert!(matches!(stopped, Some(FatalError::TooOld { level }) if level == above), "{stopped:?}");
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
    let applied = net.node(1).status().applied_index;
    net.node(1).acquire(RequestId(5), key("rw"), lease_ms, owner("p"), Value::none(), 60_000);
    net.settle();
    assert_eq!(net.take_reply(RequestId(5)), None, "a plain acquire of a shared key did not wait");
    assert_eq!(net.node(1).status().applied_index, applied, "a waiting acquire was proposed");
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

// ---------------------------------------------------------------------------
// Sessions

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
    let bootstrap_index = net.node(1).status().last_index;
    net.node(1).tick();
    net.settle();
    assert!(net.node(1).table().cluster_id().is_some());
    for id in 1..=3 {
        let status = net.node(id).status();
        assert_eq!(net.node(id).table().level(), fencelock_types::LEVEL);
        assert_eq!(status.applied_index, bootstrap_index, "node {id}: an entry after the Bootstrap");
    }
}

#[test]
#[should_panic(expected = "writes durable of")]
fn a_store_that_reports_more_writes_durable_than_it_was_given_stops_the_node() {
    let mut net = Net::new(3);
    net.elect(1);
    let submitted = net.node(1).writes_in_flight() + 1_000;
    net.node(1).on_persisted(submitted);
}

#[test]
fn a_late_report_of_fewer_durable_writes_takes_nothing_back() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node(1).propose(RequestId(1), vec![grant("late", "o1")]);
    net.settle();
    assert_eq!(net.node(1).writes_in_flight(), 0);
    // A group's report sent before an inline write was counted, read after.
    net.node(1).on_persisted(1);
    assert_eq!(net.node(1).writes_in_flight(), 0, "a late report took durability back");
}
