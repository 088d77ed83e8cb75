//! The node as a client sees it: requests on connections, connections that
//! close at the worst moment, retries on another connection.

#![allow(clippy::unwrap_used)]

use fencelock_types::{Command, FencingToken, Key, LeaseMs, Owner, Value};

use crate::log::{Durable, MemStore};
use crate::node::{Action, ClientRequest, Event, Node, NodeConfig};
use crate::registry::ConnId;
use crate::tests::QueuedStore;
use crate::{Config, NodeId, Query, Reply, Response};

/// One turn, its writes made to `store` (a [`QueuedStore`] keeps them
/// until flushed) and its snapshots encoded and decoded at once (handed
/// back after the turn, as a worker thread would). Returns the other
/// actions and the last write's number.
fn turn_with(node: &mut Node<u32>, now_ms: u64, store: &mut impl Durable) -> (Vec<Action<u32>>, Option<u64>) {
    let mut actions = Vec::new();
    let mut last = None;
    let mut worked = Vec::new();
    node.turn(now_ms, &mut |action| match action {
        Action::Write(write) => {
            store.write(&write.batch).unwrap();
            last = Some(write.n);
        }
        Action::EncodeSnapshot(job) => {
            worked.push(Event::SnapshotEncoded { index: job.index, data: job.encode() })
        }
        Action::DecodeSnapshot(message) => {
            let table = fencelock_fsm::LockTable::restore(message.get_snapshot().get_data());
            worked.push(Event::SnapshotDecoded { message, table });
        }
        action => actions.push(action),
    })
    .unwrap();
    for event in worked {
        node.handle(now_ms, event);
    }
    (actions, last)
}

/// Turns on a synchronous store: each write durable at once and reported,
/// until the node has nothing more to do now. Returns the other actions.
fn turns_synced(node: &mut Node<u32>, now_ms: u64, store: &mut MemStore) -> Vec<Action<u32>> {
    let mut actions = Vec::new();
    for _ in 0..20 {
        let (more, last) = turn_with(node, now_ms, store);
        actions.extend(more);
        if let Some(n) = last {
            node.handle(now_ms, Event::Persisted(n));
        } else if node.next_wake_ms(now_ms) > now_ms {
            break;
        }
    }
    actions
}

/// One node on an asynchronous store (its writes durable only when the
/// test says), its time, and the answers it gave, by asker.
struct One {
    node: Node<u32>,
    store: QueuedStore,
    now_ms: u64,
    answers: Vec<(u32, Reply)>,
}

impl One {
    fn new() -> One {
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let config = NodeConfig {
            driver: crate::tests::short_leases(Config::new(NodeId(1), vec![NodeId(1)])),
            tick_ms: Some(10),
            election_seed: Some(7),
        };
        let mut store = QueuedStore::default();
        let node = Node::open(config, store.recover().unwrap(), &logger).unwrap();
        let mut one = One { node, store, now_ms: 0, answers: Vec::new() };
        while !one.node.replica().is_some_and(|replica| replica.is_leader_ready()) {
            one.advance(10);
            assert!(one.now_ms < 10_000, "a one-node cluster never elected itself");
        }
        one
    }

    /// Runs turns, each write made durable after its turn, until the node
    /// has nothing left to do now.
    fn settle(&mut self) {
        for _ in 0..100 {
            self.turn();
            if self.node.writes_in_flight() > 0 {
                self.node.handle(self.now_ms, Event::Persisted(self.store.flush()));
                continue;
            }
            if self.node.next_wake_ms(self.now_ms) > self.now_ms {
                return;
            }
        }
        panic!("the node never settled");
    }

    /// One turn; its writes stay queued.
    fn turn(&mut self) {
        let (actions, _) = turn_with(&mut self.node, self.now_ms, &mut self.store);
        for action in actions {
            if let Action::Reply { to, reply, .. } = action {
                self.answers.push((to, reply));
            }
        }
    }

    fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
        self.settle();
    }

    fn send(&mut self, conn: u64, asker: u32, request: ClientRequest) {
        self.node.handle(self.now_ms, Event::Request { conn: ConnId(conn), reply_to: asker, request });
    }

    fn answer(&mut self, asker: u32) -> Option<Reply> {
        let at = self.answers.iter().position(|(to, _)| *to == asker)?;
        Some(self.answers.remove(at).1)
    }

    fn holder(&self, key: &str) -> Option<(Owner, FencingToken)> {
        let lock = self.node.replica().unwrap().table().holder(key.as_bytes())?;
        Some((lock.owner.clone(), lock.token))
    }
}

fn acquire(key: &str, owner: &str) -> ClientRequest {
    ClientRequest::Acquire {
        key: Key::new(key.as_bytes().to_vec()).unwrap(),
        lease_ms: LeaseMs::new(30_000).unwrap(),
        owner: Owner::new(owner.as_bytes().to_vec()).unwrap(),
        value: Value::none(),
        wait_ms: 0,
    }
}

fn granted(reply: Option<Reply>) -> FencingToken {
    match reply {
        Some(Ok(Response::Acquired(crate::answer::Acquired::Granted { token, .. }))) => token,
        other => panic!("not granted: {other:?}"),
    }
}

#[test]
fn a_retry_on_a_second_connection_keeps_the_lock_when_the_first_closes_before_its_answer() {
    // The scenario of a plain user: acquire on connection 1, the same
    // acquire again on connection 2, connection 1 closes before its answer.
    let mut one = One::new();
    one.send(1, 1, acquire("k", "X"));
    one.send(2, 2, acquire("k", "X"));
    // The first is proposed (and waits for its write), the retry queues
    // behind it on the key.
    one.turn();
    assert!(one.node.writes_in_flight() > 0);
    one.node.handle(one.now_ms, Event::ConnectionClosed(ConnId(1)));
    one.settle();
    let token = granted(one.answer(2));
    assert!(one.answer(1).is_none(), "an answer went to a closed connection");
    one.advance(50);
    one.advance(50);
    let owner = Owner::new(b"X".to_vec()).unwrap();
    assert_eq!(one.holder("k"), Some((owner, token)), "the retry was told it holds the lock, then lost it");
    // Another owner is turned away.
    one.send(3, 3, acquire("k", "Y"));
    one.settle();
    assert!(matches!(one.answer(3), Some(Err(crate::RequestError::Held { .. }))));
}

#[test]
fn a_retry_keeps_the_lock_when_the_first_answer_could_not_be_delivered() {
    // Connection 1's answer is out before the shell learns it closed: the
    // shell hands the grant back as undelivered, after the retry is queued.
    let mut one = One::new();
    one.send(1, 1, acquire("k", "X"));
    one.settle();
    let first = one.answers.iter().position(|(to, _)| *to == 1).unwrap();
    let (_, reply) = one.answers.remove(first);
    let token = granted(Some(reply));
    one.send(2, 2, acquire("k", "X"));
    let grant = crate::GrantRef { key: Key::new(b"k".to_vec()).unwrap(), token, index: grant_index(&one) };
    one.node.handle(one.now_ms, Event::Undelivered(vec![grant]));
    one.settle();
    assert_eq!(granted(one.answer(2)), token);
    one.advance(50);
    assert_eq!(one.holder("k").map(|(_, token)| token), Some(token), "the re-granted lock was released");
}

/// The index of the entry that granted the only lock (the last applied).
fn grant_index(one: &One) -> u64 {
    one.node.replica().unwrap().status().log.applied_index
}

#[test]
fn a_grant_no_one_was_told_of_is_released_at_once() {
    let mut one = One::new();
    one.send(1, 1, acquire("k", "X"));
    one.node.handle(one.now_ms, Event::ConnectionClosed(ConnId(1)));
    one.settle();
    one.advance(10);
    // Either it was never proposed (cancelled) or it was released: free.
    assert_eq!(one.holder("k"), None);
    assert!(one.answer(1).is_none());
}

#[test]
fn a_grant_in_flight_when_its_connection_closes_is_released_when_it_applies() {
    // An asynchronous store: the grant is proposed and written, not yet
    // durable, so not applied, when the connection closes.
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let config = NodeConfig {
        driver: crate::tests::short_leases(Config::new(NodeId(1), vec![NodeId(1)])),
        tick_ms: Some(10),
        election_seed: Some(3),
    };
    let mut store = QueuedStore::default();
    let mut node: Node<u32> = Node::open(config, store.recover().unwrap(), &logger).unwrap();
    let mut now_ms = 0;
    let mut answers: Vec<u32> = Vec::new();
    let run = |node: &mut Node<u32>, now_ms: u64, answers: &mut Vec<u32>, store: &mut QueuedStore| {
        for action in turn_with(node, now_ms, store).0 {
            if let Action::Reply { to, .. } = action {
                answers.push(to);
            }
        }
    };
    while !node.replica().is_some_and(|replica| replica.is_leader_ready()) {
        now_ms += 10;
        run(&mut node, now_ms, &mut answers, &mut store);
        node.handle(now_ms, Event::Persisted(store.flush()));
        run(&mut node, now_ms, &mut answers, &mut store);
        assert!(now_ms < 10_000, "never elected");
    }
    node.handle(now_ms, Event::Request { conn: ConnId(5), reply_to: 5, request: acquire("k", "X") });
    run(&mut node, now_ms, &mut answers, &mut store);
    assert!(node.writes_in_flight() > 0, "the grant is not waiting for its write");
    node.handle(now_ms, Event::ConnectionClosed(ConnId(5)));
    for _ in 0..10 {
        node.handle(now_ms, Event::Persisted(store.flush()));
        run(&mut node, now_ms, &mut answers, &mut store);
    }
    assert!(answers.is_empty(), "an answer went to a closed connection");
    let replica = node.replica().unwrap();
    assert_eq!(replica.stats().grants_applied, 1, "the grant never applied");
    assert!(replica.table().holder(b"k").is_none(), "a ghost lock stayed");
}

#[test]
fn an_undelivered_grant_renewed_since_is_kept() {
    let mut one = One::new();
    one.send(1, 1, acquire("k", "X"));
    one.settle();
    let token = granted(one.answer(1));
    let index = grant_index(&one);
    let key = Key::new(b"k".to_vec()).unwrap();
    let renew =
        Command::Renew { key: key.clone(), token, lease_ms: LeaseMs::new(30_000).unwrap(), user: None };
    one.send(2, 2, ClientRequest::Propose(vec![renew]));
    one.settle();
    assert!(matches!(one.answer(2), Some(Ok(Response::Applied(_)))));
    one.node.handle(one.now_ms, Event::Undelivered(vec![crate::GrantRef { key, token, index }]));
    one.advance(10);
    assert_eq!(one.holder("k").map(|(_, token)| token), Some(token));
}

#[test]
fn a_waiting_acquire_whose_connection_closes_is_forgotten_and_never_granted() {
    let mut one = One::new();
    one.send(1, 1, acquire("k", "X"));
    one.settle();
    let token = granted(one.answer(1));
    let waiting = ClientRequest::Acquire {
        key: Key::new(b"k".to_vec()).unwrap(),
        lease_ms: LeaseMs::new(30_000).unwrap(),
        owner: Owner::new(b"Y".to_vec()).unwrap(),
        value: Value::none(),
        wait_ms: 60_000,
    };
    one.send(2, 2, waiting);
    one.settle();
    assert_eq!(one.node.open_requests(), 1);
    one.node.handle(one.now_ms, Event::ConnectionClosed(ConnId(2)));
    assert_eq!(one.node.open_requests(), 0, "the closed connection's waiter is still registered");
    let release = Command::Release { key: Key::new(b"k".to_vec()).unwrap(), token: Some(token), user: None };
    one.send(3, 3, ClientRequest::Propose(vec![release]));
    one.settle();
    one.advance(10);
    assert_eq!(one.holder("k"), None, "a waiter of a closed connection was granted the lock");
    assert_eq!(one.node.replica().unwrap().status().pending_requests, 0);
}

#[test]
fn a_starting_node_refuses_clients_and_waits_for_its_peers() {
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let mut driver =
        crate::tests::short_leases(Config::new(NodeId(1), vec![NodeId(1), NodeId(2), NodeId(3)]));
    driver.founding.initial_cluster_state = crate::rejoin::ClusterState::Existing;
    let config = NodeConfig { driver, tick_ms: Some(10), election_seed: None };
    let mut node: Node<u32> = Node::open(config, Default::default(), &logger).unwrap();
    assert!(node.is_starting());
    let report = node.report(0);
    assert!(report.starting);
    assert_eq!(report.conf.waiting_for, vec![2, 3]);
    node.handle(
        0,
        Event::Request {
            conn: ConnId(1),
            reply_to: 1,
            request: ClientRequest::Read(Query::List { prefix: Vec::new(), limit: 1 }),
        },
    );
    let mut actions = Vec::new();
    node.turn(0, &mut |action| actions.push(action)).unwrap();
    assert!(matches!(
        actions.as_slice(),
        [Action::Reply { to: 1, reply: Err(crate::RequestError::NotLeader { leader_hint: None }), .. }]
    ));
    // One peer says it is new too: not enough in an existing cluster.
    node.handle(1, Event::PeerHello { from: NodeId(2), report: Default::default() });
    node.turn(1, &mut |_| {}).unwrap();
    assert!(node.is_starting());
    assert_eq!(node.report(1).conf.waiting_for, vec![3]);
    // A hello from a node that is not a voter counts for nothing.
    node.handle(2, Event::PeerHello { from: NodeId(9), report: Default::default() });
    node.turn(2, &mut |_| {}).unwrap();
    assert!(node.is_starting());
    // Every peer answered and none knows it, nor names a cluster: founding
    // a new one, which `existing` never does.
    node.handle(3, Event::PeerHello { from: NodeId(3), report: Default::default() });
    node.turn(3, &mut |_| {}).unwrap();
    assert!(node.is_starting(), "founded with `existing`");
    // Node 3 runs the cluster (it names it) and does not know node 1: a
    // voter of the configuration that starts late.
    let named = crate::rejoin::PeerReport { term: 2, last_index: 5, named: true, ..Default::default() };
    node.handle(3, Event::PeerHello { from: NodeId(3), report: named });
    let mut started = None;
    node.turn(3, &mut |action| {
        if let Action::Started(start) = action {
            started = Some(start);
        }
    })
    .unwrap();
    assert_eq!(started, Some(crate::rejoin::Start::Fresh));
    assert!(!node.is_starting());
    assert!(!node.report(3).starting);
}

#[test]
fn a_node_of_a_new_cluster_starts_once_a_majority_is_up_and_reports_whom_it_reaches() {
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let config = NodeConfig {
        driver: crate::tests::short_leases(Config::new(NodeId(1), vec![NodeId(1), NodeId(2), NodeId(3)])),
        tick_ms: Some(10),
        election_seed: None,
    };
    let mut node: Node<u32> = Node::open(config, Default::default(), &logger).unwrap();
    node.turn(0, &mut |_| {}).unwrap();
    assert!(node.is_starting(), "alone is no majority");
    node.handle(1, Event::PeerHello { from: NodeId(3), report: Default::default() });
    node.turn(1, &mut |_| {}).unwrap();
    assert!(!node.is_starting(), "two blank nodes of three found the cluster");
    let report = node.report(1);
    assert_eq!(report.conf.voters, vec![1, 2, 3]);
    assert_eq!(report.conf.reachable, vec![1]);
    assert!(!report.has_quorum());
    // A message from a peer: it is reachable for an election timeout.
    let mut heartbeat = raft::prelude::Message::default();
    heartbeat.set_msg_type(raft::prelude::MessageType::MsgHeartbeat);
    heartbeat.from = 3;
    heartbeat.to = 1;
    heartbeat.term = 1;
    node.handle(2, Event::PeerMessage(heartbeat));
    let report = node.report(2);
    assert_eq!(report.conf.reachable, vec![1, 3]);
    assert!(report.has_quorum());
    let election_ms = 10 * Config::new(NodeId(1), vec![]).raft.election_ticks as u64;
    assert_eq!(node.report(2 + election_ms + 1).conf.reachable, vec![1], "heard too long ago");
}

#[test]
fn a_blank_node_known_to_a_majority_rejoins_without_a_vote() {
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let config = NodeConfig {
        driver: crate::tests::short_leases(Config::new(NodeId(1), vec![NodeId(1), NodeId(2), NodeId(3)])),
        tick_ms: Some(10),
        election_seed: None,
    };
    let mut store = MemStore::new();
    let mut node: Node<u32> = Node::open(config, store.recover().unwrap(), &logger).unwrap();
    let knows = crate::rejoin::PeerReport {
        knows_you: true,
        term: 4,
        last_index: 17,
        level: fencelock_types::LEVEL,
        named: true,
        ..Default::default()
    };
    node.handle(0, Event::PeerHello { from: NodeId(2), report: knows });
    turns_synced(&mut node, 0, &mut store);
    assert!(node.is_starting(), "one peer of two is no majority of the others");
    node.handle(1, Event::PeerHello { from: NodeId(3), report: Default::default() });
    let (_, first_write) = turn_with(&mut node, 1, &mut store);
    let status = node.status().unwrap();
    assert!(status.rejoining);
    // The floor is the first write: a restart does not start blank again.
    assert_eq!(first_write.map(|_| ()), Some(()), "the floor was not written");
    assert!(!store.recover().unwrap().is_blank());
    assert_eq!(store.recover().unwrap().membership.rejoin.map(|floor| floor.term), Some(4));
}

#[test]
fn a_read_right_after_an_election_is_answered_once_the_leader_commits() {
    // An asynchronous store holds the new leader's first entry unwritten:
    // elected, not yet ready. raft-rs drops a ReadIndex then; the node
    // must ask again once the leader has committed, not leave it hanging.
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let config = NodeConfig {
        driver: crate::tests::short_leases(Config::new(NodeId(1), vec![NodeId(1)])),
        tick_ms: Some(10),
        election_seed: Some(5),
    };
    let mut store = QueuedStore::default();
    let mut node: Node<u32> = Node::open(config, store.recover().unwrap(), &logger).unwrap();
    let mut now_ms = 0;
    while node.status().unwrap().role != crate::Role::Leader {
        now_ms += 10;
        turn_with(&mut node, now_ms, &mut store);
        if node.status().unwrap().role != crate::Role::Leader {
            node.handle(now_ms, Event::Persisted(store.flush()));
        }
        assert!(now_ms < 10_000, "never elected");
    }
    assert!(!node.replica().unwrap().is_leader_ready(), "ready before its first entry was durable");
    let read = ClientRequest::Read(Query::Holder(Key::new(b"k".to_vec()).unwrap()));
    node.handle(now_ms, Event::Request { conn: ConnId(1), reply_to: 1, request: read });
    let mut answers = Vec::new();
    for _ in 0..10 {
        for action in turn_with(&mut node, now_ms, &mut store).0 {
            if let Action::Reply { to, reply, .. } = action {
                answers.push((to, reply));
            }
        }
        node.handle(now_ms, Event::Persisted(store.flush()));
    }
    assert!(
        matches!(answers.as_slice(), [(1, Ok(Response::Holder(None)))]),
        "the read was not answered: {answers:?}"
    );
}

#[test]
fn leases_restored_from_a_snapshot_at_restart_run_out_and_their_locks_expire() {
    // A lock whose grant is inside the snapshot is not applied again at a
    // restart: only the restored table says it is held. Its lease must be
    // armed anew, or it would be held for ever.
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let mut driver = crate::tests::short_leases(Config::new(NodeId(1), vec![NodeId(1)]));
    driver.raft.snapshot_interval_entries = 3;
    let config = NodeConfig { driver, tick_ms: Some(10), election_seed: Some(11) };
    let mut store = MemStore::new();
    let run = |node: &mut Node<u32>, now_ms: u64, store: &mut MemStore| {
        turns_synced(node, now_ms, store);
    };
    let mut node: Node<u32> = Node::open(config.clone(), store.recover().unwrap(), &logger).unwrap();
    let mut now_ms = 0;
    while !node.replica().unwrap().is_leader_ready() {
        now_ms += 10;
        run(&mut node, now_ms, &mut store);
    }
    for (n, name) in ["k", "a", "b", "c"].iter().enumerate() {
        node.handle(
            now_ms,
            Event::Request { conn: ConnId(1), reply_to: n as u32, request: acquire(name, "X") },
        );
        run(&mut node, now_ms, &mut store);
    }
    assert!(node.replica().unwrap().status().log.snapshot_index > 0, "no snapshot was taken");
    drop(node);

    let mut node: Node<u32> = Node::open(config, store.recover().unwrap(), &logger).unwrap();
    assert!(node.replica().unwrap().table().holder(b"k").is_some(), "the snapshot lost the lock");
    // Far past the 30 s lease on the restarted node's clock.
    for _ in 0..200 {
        now_ms += 500;
        run(&mut node, now_ms, &mut store);
    }
    assert!(
        node.replica().unwrap().table().holder(b"k").is_none(),
        "a lock restored from the snapshot outlived its lease: its lease was never armed again"
    );
}

#[test]
fn a_snapshot_is_encoded_by_the_shell_while_the_node_serves_on_and_one_at_a_time() {
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let mut driver = crate::tests::short_leases(Config::new(NodeId(1), vec![NodeId(1)]));
    driver.raft.snapshot_interval_entries = 5;
    let config = NodeConfig { driver, tick_ms: Some(10), election_seed: Some(3) };
    let mut store = MemStore::new();
    let mut node: Node<u32> = Node::open(config, store.recover().unwrap(), &logger).unwrap();
    // Turns on a synchronous store that keep every snapshot job.
    type Jobs = Vec<crate::replica::SnapshotJob>;
    fn turns(
        node: &mut Node<u32>,
        now_ms: u64,
        store: &mut MemStore,
        jobs: &mut Jobs,
        answers: &mut Vec<(u32, Reply)>,
    ) {
        for _ in 0..20 {
            let mut last = None;
            node.turn(now_ms, &mut |action| match action {
                Action::Write(write) => {
                    store.write(&write.batch).unwrap();
                    last = Some(write.n);
                }
                Action::EncodeSnapshot(job) => jobs.push(job),
                Action::Reply { to, reply, .. } => answers.push((to, reply)),
                _ => {}
            })
            .unwrap();
            match last {
                Some(n) => node.handle(now_ms, Event::Persisted(n)),
                None if node.next_wake_ms(now_ms) > now_ms => break,
                None => {}
            }
        }
    }
    let mut jobs = Vec::new();
    let mut answers = Vec::new();
    let mut now_ms = 0;
    while !node.replica().unwrap().is_leader_ready() {
        now_ms += 10;
        turns(&mut node, now_ms, &mut store, &mut jobs, &mut answers);
    }
    for n in 0..30u32 {
        node.handle(
            now_ms,
            Event::Request { conn: ConnId(1), reply_to: n, request: acquire(&format!("k{n}"), "X") },
        );
        turns(&mut node, now_ms, &mut store, &mut jobs, &mut answers);
    }
    // Every grant was answered while the first snapshot was out, and no
    // second one was asked for meanwhile; the log is not compacted yet.
    assert_eq!(answers.len(), 30);
    assert!(answers.iter().all(|(_, reply)| reply.is_ok()));
    assert_eq!(jobs.len(), 1, "a second snapshot was asked for while the first was out");
    let status = node.replica().unwrap().status();
    assert_eq!(status.log.snapshot_index, 0);
    let job = jobs.pop().unwrap();
    assert!(job.index < status.log.applied_index);
    // The job's table is the table as of its index, not as it is now.
    assert!(job.table.len() < node.replica().unwrap().table().len());
    // A result nobody asked for changes nothing.
    node.handle(now_ms, Event::SnapshotEncoded { index: job.index + 1, data: job.encode() });
    turns(&mut node, now_ms, &mut store, &mut jobs, &mut answers);
    assert_eq!(node.replica().unwrap().status().log.snapshot_index, 0);
    // The real one is stored, and the next snapshot may be asked for.
    let (index, locks) = (job.index, job.table.len());
    node.handle(now_ms, Event::SnapshotEncoded { index, data: job.encode() });
    turns(&mut node, now_ms, &mut store, &mut jobs, &mut answers);
    let status = node.replica().unwrap().status();
    assert_eq!(status.log.snapshot_index, index);
    assert!(status.log.snapshot_bytes > 0);
    assert_eq!(
        fencelock_fsm::LockTable::restore(store.recover().unwrap().snapshot.get_data()).unwrap().len(),
        locks
    );
    node.handle(now_ms, Event::Request { conn: ConnId(1), reply_to: 99, request: acquire("after", "X") });
    turns(&mut node, now_ms, &mut store, &mut jobs, &mut answers);
    assert_eq!(jobs.len(), 1, "no new snapshot after the first was stored");
}

/// One turn; the snapshot messages it hands out for decoding (not decoded).
fn decodings_asked(node: &mut Node<u32>, now_ms: u64) -> Vec<raft::prelude::Message> {
    let mut decodes = Vec::new();
    node.turn(now_ms, &mut |action| {
        if let Action::DecodeSnapshot(message) = action {
            decodes.push(message);
        }
    })
    .unwrap();
    decodes
}

#[test]
fn a_snapshot_from_the_leader_is_decoded_by_the_shell_and_installed_from_that_table() {
    use raft::prelude::{ConfState, Message, MessageType, Snapshot};

    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let voters = vec![NodeId(1), NodeId(2), NodeId(3)];
    let config = NodeConfig {
        driver: crate::tests::short_leases(Config::new(NodeId(1), voters)),
        tick_ms: Some(10),
        election_seed: Some(5),
    };
    let mut store = MemStore::new();
    let mut node: Node<u32> = Node::open(config, store.recover().unwrap(), &logger).unwrap();
    // A new cluster: both peers answer, neither knows this node.
    for peer in [2, 3] {
        let report = crate::rejoin::PeerReport {
            knows_you: false,
            term: 0,
            last_index: 0,
            level: fencelock_types::LEVEL,
            named: false,
            ..Default::default()
        };
        node.handle(0, Event::PeerHello { from: NodeId(peer), report });
    }
    turns_synced(&mut node, 0, &mut store);
    assert!(node.replica().is_some(), "the node did not start");

    // The leader's table: three locks.
    let mut table = fencelock_fsm::LockTable::new();
    for name in ["a", "b", "c"] {
        table.apply(fencelock_types::Command::Grant {
            session: None,
            key: Key::new(name.as_bytes().to_vec()).unwrap(),
            lease_ms: LeaseMs::new(30_000).unwrap(),
            owner: Owner::new(b"o".to_vec()).unwrap(),
            value: fencelock_types::Value::none(),
        });
    }
    let snapshot_message = |index: u64, term: u64| {
        let mut snapshot = Snapshot::default();
        snapshot.set_data(table.snapshot().into());
        snapshot.mut_metadata().index = index;
        snapshot.mut_metadata().term = term;
        snapshot.mut_metadata().set_conf_state(ConfState::from((vec![1, 2, 3], vec![])));
        let mut message = Message::default();
        message.set_msg_type(MessageType::MsgSnapshot);
        message.from = 2;
        message.to = 1;
        message.term = term;
        message.set_snapshot(snapshot);
        message
    };
    node.handle(10, Event::PeerMessage(snapshot_message(10, 1)));
    // A second snapshot while the first is decoded is dropped: one decoding
    // at a time.
    node.handle(10, Event::PeerMessage(snapshot_message(12, 1)));
    let mut decodes = decodings_asked(&mut node, 10);
    assert_eq!(decodes.len(), 1, "one decoding at a time");
    assert_eq!(node.replica().unwrap().table().len(), 0, "installed before it was decoded");
    // The shell decodes it (elsewhere) and hands it back: installed from
    // that table.
    let message = decodes.pop().unwrap();
    let decoded = fencelock_fsm::LockTable::restore(message.get_snapshot().get_data());
    node.handle(20, Event::SnapshotDecoded { message, table: decoded });
    turns_synced(&mut node, 20, &mut store);
    let replica = node.replica().unwrap();
    assert_eq!(replica.table(), &table);
    assert_eq!(replica.status().log.applied_index, 10);
    assert_eq!(replica.stats().snapshots_installed, 1);
    // A snapshot of an older term is ignored by raft: its decoded table is
    // not kept (it could be large).
    let mut heartbeat = Message::default();
    heartbeat.set_msg_type(MessageType::MsgHeartbeat);
    heartbeat.from = 3;
    heartbeat.to = 1;
    heartbeat.term = 2;
    heartbeat.commit = 10;
    node.handle(25, Event::PeerMessage(heartbeat));
    turns_synced(&mut node, 25, &mut store);
    assert_eq!(node.replica().unwrap().status().term, 2);
    node.handle(25, Event::PeerMessage(snapshot_message(15, 1)));
    let message = decodings_asked(&mut node, 25).pop().expect("a decoding was asked for");
    let decoded = fencelock_fsm::LockTable::restore(message.get_snapshot().get_data());
    node.handle(25, Event::SnapshotDecoded { message, table: decoded });
    turns_synced(&mut node, 25, &mut store);
    assert_eq!(node.replica().unwrap().status().log.applied_index, 10);
    assert!(!node.replica().unwrap().holds_decoded_snapshot(), "a snapshot raft ignored is still held");
    // A table that does not decode is refused, and the node takes the next.
    node.handle(30, Event::PeerMessage(snapshot_message(20, 2)));
    let message = decodings_asked(&mut node, 30).pop().expect("a decoding was asked for");
    node.handle(30, Event::SnapshotDecoded { message, table: Err(fencelock_fsm::SnapshotError::Checksum) });
    turns_synced(&mut node, 30, &mut store);
    assert_eq!(node.replica().unwrap().status().log.applied_index, 10);
    assert!(node.replica().unwrap().stats().refused.get(crate::gate::Refusal::BadSnapshot) > 0);
    // And the next snapshot is taken (the decoding is over).
    node.handle(40, Event::PeerMessage(snapshot_message(30, 2)));
    turns_synced(&mut node, 40, &mut store);
    assert_eq!(node.replica().unwrap().status().log.applied_index, 30);
}

/// A blank node alone in its configuration, as `fencelockd --id 4 --peers
/// 4=P4` starts after `fencelock member add 4`: with a founding grace or
/// `existing` it listens first.
fn alone(state: crate::rejoin::ClusterState, grace_ms: u64) -> (Node<u32>, MemStore) {
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let mut driver = crate::tests::short_leases(Config::new(NodeId(4), vec![NodeId(4)]));
    driver.founding.initial_cluster_state = state;
    driver.founding.founding_grace_ms = grace_ms;
    let config = NodeConfig { driver, tick_ms: Some(10), election_seed: Some(4) };
    let mut store = MemStore::new();
    let node = Node::open(config, store.recover().unwrap(), &logger).unwrap();
    (node, store)
}

/// Whether the node founded (started, and leads its cluster of one) by
/// `until_ms`, turning every 10 ms.
fn founds_by(node: &mut Node<u32>, store: &mut MemStore, from_ms: u64, until_ms: u64) -> bool {
    (from_ms..=until_ms).step_by(10).any(|now_ms| {
        turns_synced(node, now_ms, store);
        node.status().is_some_and(|status| status.leader_ready)
    })
}

#[test]
fn a_blank_node_alone_in_its_configuration_founds_only_after_the_grace_and_only_if_new() {
    use crate::rejoin::ClusterState;
    // `new`, no one calls: it founds, after the grace and not before.
    let (mut node, mut store) = alone(ClusterState::New, 2_000);
    assert!(!founds_by(&mut node, &mut store, 0, 1_990), "founded within the grace");
    assert!(node.is_starting());
    assert!(founds_by(&mut node, &mut store, 2_000, 6_000), "never founded");
    // `existing`: never, however long it waits.
    for grace_ms in [0, 2_000] {
        let (mut node, mut store) = alone(ClusterState::Existing, grace_ms);
        assert!(!founds_by(&mut node, &mut store, 0, 60_000), "founded with `existing`");
        assert!(node.is_starting());
        // A hello from an unnamed stranger changes nothing.
        let blank = crate::rejoin::PeerReport { level: fencelock_types::LEVEL, ..Default::default() };
        node.handle(60_000, Event::PeerHello { from: NodeId(1), report: blank });
        assert!(!founds_by(&mut node, &mut store, 60_000, 61_000));
    }
    // Without a grace, `new` founds at once (a library user's single node).
    let (mut node, mut store) = alone(ClusterState::New, 0);
    assert!(!node.is_starting());
    assert!(founds_by(&mut node, &mut store, 0, 5_000));
}

#[test]
fn a_blank_node_that_a_running_cluster_contacts_never_founds_and_stops_saying_so() {
    use crate::rejoin::ClusterState;
    for state in [ClusterState::New, ClusterState::Existing] {
        let (mut node, mut store) = alone(state, 2_000);
        assert!(!founds_by(&mut node, &mut store, 0, 500));
        // The leader of the cluster that added node 4 connects: its hello
        // names the cluster.
        let named = crate::rejoin::PeerReport {
            knows_you: false,
            term: 3,
            last_index: 40,
            level: fencelock_types::LEVEL,
            named: true,
            ..Default::default()
        };
        node.handle(510, Event::PeerHello { from: NodeId(1), report: named });
        let stopped = node.turn(520, &mut |_| {});
        assert!(
            matches!(stopped, Err(crate::FatalError::MemberElsewhere { by: 1 })),
            "{state:?}: {stopped:?}"
        );
        assert!(node.is_starting(), "{state:?}: it started");
        let message = crate::FatalError::MemberElsewhere { by: 1 }.to_string();
        assert!(message.contains("--join"), "{message}");
    }
    // A node that runs already (it founded, or has data) pays strangers no
    // heed: the transport refuses them as peers.
    let (mut node, mut store) = alone(ClusterState::New, 0);
    assert!(founds_by(&mut node, &mut store, 0, 5_000));
    let named = crate::rejoin::PeerReport { named: true, ..Default::default() };
    node.handle(5_000, Event::PeerHello { from: NodeId(1), report: named });
    assert!(node.turn(5_010, &mut |_| {}).is_ok());
}
