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

/// A message "from" node `from` to node `to` in the current term of `to`.
fn forged(net: &mut Net<MemStore>, kind: MessageType, from: u64, to: u64) -> Message {
    let mut message = Message::default();
    message.set_msg_type(kind);
    message.from = from;
    message.to = to;
    message.term = net.node(to).status().term;
    message
}

mod durability;
mod founding;
mod leases;
mod limits;
mod proposals;
mod reads;
mod rejoin;
mod security;
mod sessions;
mod shared;

#[path = "membership_tests.rs"]
mod membership;
