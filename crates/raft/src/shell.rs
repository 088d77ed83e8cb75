//! The driver around a [`Replica`]: [`Driver`] is the replica with the
//! requests waiting on it (inputs in, one `Ready` per [`Driver::turn`],
//! messages out through a [`PeerSink`], replies to their [`Responder`]s),
//! and no thread. fencelockd runs one inside its network event loop;
//! [`spawn`] runs one on its own thread, a `crossbeam_channel::select!`
//! loop over bounded channels and a tick timer that drains what is waiting
//! into each turn.
//!
//! With [`spawn`], the network layer (or a test's router) plugs into
//! `peers_in` and `peers_out`; the server sends [`Request`]s and waits on
//! each request's own reply channel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{never, select, tick, Receiver, Sender};
use fencelock_types::{ApplyResult, Command, FencingToken, Key, LeaseMs, Owner};
use raft::prelude::Message;
use slog::{crit, info, Logger};

use crate::replica::{Effects, NodeStatus, Replica, Stats};
use crate::storage::{Durable, Persisted, StorageError};
use crate::{FatalError, Query, Reply, RequestError, RequestId, Response};

/// Delivers one reply to whoever asked: a channel, a client connection.
/// Returns false when the asker is gone, which for a Grant makes a ghost
/// lock that the shell releases.
pub struct Responder(Box<dyn FnOnce(Reply) -> bool + Send>);

impl Responder {
    pub fn new(deliver: impl FnOnce(Reply) -> bool + Send + 'static) -> Responder {
        Responder(Box::new(deliver))
    }

    /// Delivers into a channel; a dropped receiver means the asker is gone.
    pub fn channel(sender: Sender<Reply>) -> Responder {
        Responder::new(move |reply| sender.send(reply).is_ok())
    }

    pub fn respond(self, reply: Reply) -> bool {
        (self.0)(reply)
    }
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Responder")
    }
}

/// Receives a [`NodeStatus`] on the driver thread (it must not block), or
/// `None` from a caller whose request never reached the driver.
pub struct StatusCallback(Box<dyn FnOnce(Option<NodeStatus>) + Send>);

impl StatusCallback {
    pub fn new(deliver: impl FnOnce(Option<NodeStatus>) + Send + 'static) -> StatusCallback {
        StatusCallback(Box::new(deliver))
    }

    pub fn deliver(self, status: Option<NodeStatus>) {
        (self.0)(status)
    }
}

impl std::fmt::Debug for StatusCallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StatusCallback")
    }
}

/// Where the shell reads this node's monotonic time for leases.
pub trait Clock: Send {
    fn now_ms(&self) -> u64;
}

/// The real monotonic clock: milliseconds since the clock was made.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    start: Instant,
}

impl MonotonicClock {
    pub fn new() -> MonotonicClock {
        MonotonicClock { start: Instant::now() }
    }
}

impl Default for MonotonicClock {
    fn default() -> MonotonicClock {
        MonotonicClock::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}

/// A clock that moves only when told to: tests give each node one, to
/// freeze it, skew it or run it fast.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new(now_ms: u64) -> ManualClock {
        ManualClock { now_ms: Arc::new(AtomicU64::new(now_ms)) }
    }

    pub fn set(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }

    pub fn advance(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

/// What callers ask of a running replica.
#[derive(Debug)]
pub enum Request {
    Propose {
        commands: Vec<Command>,
        reply: Responder,
    },
    /// Acquire `key`, waiting up to `wait_ms` for it when it is held (0: do
    /// not wait). If `reply` is gone when the grant is ready (the client
    /// disconnected), the lock is released at once.
    Acquire {
        key: Key,
        lease_ms: LeaseMs,
        owner: Owner,
        wait_ms: u64,
        reply: Responder,
    },
    Read {
        query: Query,
        reply: Responder,
    },
    /// A read from this node's applied table, at once and on any node: it
    /// may be stale.
    ReadLocal {
        query: Query,
        reply: Responder,
    },
    /// Answered at once from local state, not through raft.
    Status {
        reply: Sender<NodeStatus>,
    },
    /// Like `Status`, delivered to a callback on the driver thread: for
    /// callers that must not block waiting, such as an event loop.
    StatusTo {
        deliver: StatusCallback,
    },
    /// Asks this node, if it leads, to hand leadership to another.
    TransferLeader {
        to: crate::NodeId,
    },
    /// The applied index and the lock table's snapshot bytes, at once from
    /// local state: for checking that replicas converge.
    Table {
        reply: Sender<(u64, Vec<u8>)>,
    },
    /// The status and the counters since start, at once: for metrics.
    Metrics {
        reply: Sender<(NodeStatus, Stats)>,
    },
}

impl Request {
    /// Answers a request that no replica will see (the node is still
    /// starting): as a follower that knows no leader, so that a client
    /// tries another node. A status asked for gets no answer.
    pub fn refuse(self) {
        let not_leader = || Err(RequestError::NotLeader { leader_hint: None });
        match self {
            Request::Propose { reply, .. }
            | Request::Acquire { reply, .. }
            | Request::Read { reply, .. }
            | Request::ReadLocal { reply, .. } => {
                reply.respond(not_leader());
            }
            Request::StatusTo { deliver } => deliver.deliver(None),
            Request::Status { .. }
            | Request::Table { .. }
            | Request::Metrics { .. }
            | Request::TransferLeader { .. } => {}
        }
    }
}

/// Takes the driver's messages to peers. Called on the driver thread: it
/// must not block, and drops a message it cannot queue (raft sends again).
pub trait PeerSink {
    fn send(&self, message: Message);

    /// Called after each batch of sends: a sink that buffers writes them
    /// out now.
    fn flush(&self) {}
}

impl std::fmt::Debug for dyn PeerSink + Send {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerSink")
    }
}

/// A bounded channel: a full or closed one drops the message.
impl PeerSink for Sender<Message> {
    fn send(&self, message: Message) {
        let _ = self.try_send(message);
    }
}

/// Settings of the thread loop.
#[derive(Clone, Debug)]
pub struct ShellConfig {
    /// The wall-clock length of one raft tick.
    pub tick_interval: Duration,
    /// The most inputs taken from the channels in one turn before the turn's
    /// `Ready` is handled.
    pub drain_max: usize,
}

/// The channels a shell runs on.
#[derive(Debug)]
pub struct Channels {
    pub requests: Receiver<Request>,
    pub peers_in: Receiver<Message>,
    /// Where messages to peers go; one that cannot be queued is dropped
    /// (raft retransmits).
    pub peers_out: Box<dyn PeerSink + Send>,
    /// A message, or dropping the sender, stops the loop.
    pub stop: Receiver<()>,
    /// Progress of an asynchronous store ([`crate::AsyncEngineStore`]);
    /// `crossbeam_channel::never()` for a synchronous one.
    pub persisted: Receiver<Persisted>,
}

/// Starts `replica` on a thread named `fencelock-raft-<id>`, reading lease
/// time from `clock`. The thread ends when told to stop or when every
/// request sender is gone (`Ok`, with the final counters), or on a fatal
/// error (`Err`), after answering every outstanding request with
/// [`RequestError::Stopped`].
pub fn spawn<D: Durable + Send + 'static>(
    replica: Replica<D>,
    clock: impl Clock + 'static,
    config: ShellConfig,
    channels: Channels,
    logger: &Logger,
) -> std::io::Result<JoinHandle<Result<Stats, FatalError>>> {
    let name = format!("fencelock-raft-{}", replica.status().id.0);
    let mut driver = Driver::new(replica, clock, logger);
    std::thread::Builder::new().name(name).spawn(move || {
        let result = run(&mut driver, &config, channels);
        driver.finish(&result);
        result
    })
}

/// The loop of [`spawn`]'s thread.
fn run<D: Durable>(
    driver: &mut Driver<D>,
    config: &ShellConfig,
    channels: Channels,
) -> Result<Stats, FatalError> {
    let ticker = tick(config.tick_interval);
    let requests = channels.requests;
    let mut peers_in = channels.peers_in;
    let persisted = channels.persisted;
    loop {
        select! {
            recv(channels.stop) -> _ => return Ok(driver.stats()),
            recv(requests) -> request => match request {
                Ok(request) => driver.on_request(request),
                Err(_) => return Ok(driver.stats()),
            },
            recv(peers_in) -> message => match message {
                Ok(message) => driver.step(message),
                Err(_) => peers_in = never(),
            },
            recv(persisted) -> progress => match progress {
                Ok(progress) => driver.on_persisted(progress?),
                // Only a store's I/O thread sends here, and it ends only
                // after reporting a failure: its going silently is one too.
                Err(_) => return Err(StorageError::Thread("ended without a word".into()).into()),
            },
            recv(ticker) -> _ => driver.tick(),
        }
        // Group commit: take everything already waiting into this turn.
        for _ in 0..config.drain_max {
            let mut drained = false;
            if let Ok(request) = requests.try_recv() {
                driver.on_request(request);
                drained = true;
            }
            if let Ok(message) = peers_in.try_recv() {
                driver.step(message);
                drained = true;
            }
            if let Ok(progress) = persisted.try_recv() {
                driver.on_persisted(progress?);
                drained = true;
            }
            if !drained {
                break;
            }
        }
        driver.turn(channels.peers_out.as_ref())?;
    }
}

/// A [`Replica`] with the requests waiting on it: the driver's logic
/// without a thread. [`spawn`] runs one on its own thread; an event loop
/// that also serves the sockets (fencelockd's) runs one on its own, feeding
/// it inputs and calling [`Driver::turn`] after each round of them.
pub struct Driver<D: Durable> {
    replica: Replica<D>,
    clock: Box<dyn Clock>,
    waiting: HashMap<RequestId, Waiting>,
    next_request_id: u64,
    logger: Logger,
}

impl<D: Durable> std::fmt::Debug for Driver<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("waiting", &self.waiting.len()).finish_non_exhaustive()
    }
}

impl<D: Durable> Driver<D> {
    pub fn new(replica: Replica<D>, clock: impl Clock + 'static, logger: &Logger) -> Driver<D> {
        let logger = logger.new(slog::o!("node_id" => replica.status().id.0));
        Driver { replica, clock: Box::new(clock), waiting: HashMap::new(), next_request_id: 0, logger }
    }

    /// A peer's message.
    pub fn step(&mut self, message: Message) {
        self.replica.step(message);
    }

    /// Progress of an asynchronous store.
    pub fn on_persisted(&mut self, writes: u64) {
        self.replica.on_persisted(writes);
    }

    /// One raft tick.
    pub fn tick(&mut self) {
        self.replica.tick();
    }

    pub fn stats(&self) -> Stats {
        self.replica.stats()
    }

    /// The replica, to read its state.
    pub fn replica(&self) -> &Replica<D> {
        &self.replica
    }

    /// Runs one `Ready` and dispatches its effects: messages to
    /// `peers_out`, replies to their requests. What may leave before the
    /// turn's fsync leaves then (followed by a [`PeerSink::flush`]), so that
    /// followers sync while this node does.
    pub fn turn(&mut self, peers_out: &dyn PeerSink) -> Result<(), FatalError> {
        self.replica.set_now(self.clock.now_ms());
        let mut ghosts = Vec::new();
        let waiting = &mut self.waiting;
        self.replica.run_ready_with(&mut |effects| dispatch(waiting, peers_out, effects, &mut ghosts))?;
        let effects = self.replica.take_effects();
        dispatch(&mut self.waiting, peers_out, effects, &mut ghosts);
        for (key, token) in ghosts {
            self.replica.release_ghost(key, token);
        }
        Ok(())
    }

    /// Answers every outstanding request with [`RequestError::Stopped`]
    /// and logs how the driver ended.
    pub fn finish(&mut self, result: &Result<Stats, FatalError>) {
        self.fail_waiting();
        match result {
            Ok(_) => info!(self.logger, "driver stopped"),
            Err(err) => crit!(self.logger, "driver stopped on a fatal error"; "error" => %err),
        }
    }

    pub fn on_request(&mut self, request: Request) {
        match request {
            Request::Propose { commands, reply } => {
                let grants = commands
                    .iter()
                    .map(|command| match command {
                        Command::Grant { key, .. } => Some(key.clone()),
                        _ => None,
                    })
                    .collect();
                let id = self.register(reply, grants);
                self.replica.propose(id, commands);
            }
            Request::Acquire { key, lease_ms, owner, wait_ms, reply } => {
                let id = self.register(reply, vec![Some(key.clone())]);
                self.replica.set_now(self.clock.now_ms());
                self.replica.acquire(id, key, lease_ms, owner, wait_ms);
            }
            Request::Read { query, reply } => {
                let id = self.register(reply, Vec::new());
                self.replica.read(id, query);
            }
            Request::ReadLocal { query, reply } => {
                reply.respond(Ok(self.replica.read_local(query)));
            }
            Request::TransferLeader { to } => self.replica.transfer_leader(to),
            Request::Status { reply } => {
                let _ = reply.send(self.replica.status());
            }
            Request::StatusTo { deliver } => deliver.deliver(Some(self.replica.status())),
            Request::Table { reply } => {
                let applied = self.replica.status().applied_index;
                let _ = reply.send((applied, self.replica.table().snapshot()));
            }
            Request::Metrics { reply } => {
                let _ = reply.send((self.replica.status(), self.replica.stats()));
            }
        }
    }

    fn register(&mut self, reply: Responder, grants: Vec<Option<Key>>) -> RequestId {
        self.next_request_id += 1;
        let id = RequestId(self.next_request_id);
        self.waiting.insert(id, Waiting { reply, grants });
        id
    }

    fn fail_waiting(&mut self) {
        for (_, waiting) in self.waiting.drain() {
            waiting.reply.respond(Err(RequestError::Stopped));
        }
    }
}

/// Sends a turn's messages and replies. Grants whose caller is gone are
/// pushed to `ghosts`, for the replica to release.
fn dispatch(
    waiting: &mut HashMap<RequestId, Waiting>,
    peers_out: &dyn PeerSink,
    effects: Effects,
    ghosts: &mut Vec<(Key, FencingToken)>,
) {
    if !effects.messages.is_empty() {
        for message in effects.messages {
            peers_out.send(message);
        }
        peers_out.flush();
    }
    for (id, reply) in effects.replies {
        let Some(waiting) = waiting.remove(&id) else { continue };
        let granted: Vec<(Key, FencingToken)> = match &reply {
            Ok(Response::Applied(results)) => waiting
                .grants
                .into_iter()
                .zip(results)
                .filter_map(|(key, result)| match (key, result) {
                    (Some(key), ApplyResult::Granted { token, .. }) => Some((key, *token)),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        if !waiting.reply.respond(reply) {
            // The caller is gone. Its request still took effect: a lock it
            // was granted would be held by nobody (a ghost) until its lease
            // ran out, so it is released now.
            ghosts.extend(granted);
        }
    }
}

/// A request waiting for its reply.
struct Waiting {
    reply: Responder,
    /// Per command, the key of each Grant, to release a ghost lock.
    grants: Vec<Option<Key>>,
}
