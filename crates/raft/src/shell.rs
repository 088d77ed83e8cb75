//! A [`Node`] in a real process: [`Driver`] is the node with a real clock,
//! answers delivered through [`Responder`]s, messages handed to a
//! [`PeerSink`] and writes made by a [`Disk`], and no thread and no logic
//! of its own: every decision is the node's. fencelockd runs one inside its network event loop; [`spawn`]
//! runs one on its own thread, a `crossbeam_channel::select!` loop over
//! bounded channels that drains what is waiting into each turn (the
//! in-process test cluster and the throughput benchmark).

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{never, select, tick, Receiver, Sender};
use fencelock_types::{Command, Key, LeaseMs, Owner};
use raft::prelude::Message;
use slog::{crit, info, Logger};

use crate::rejoin::PeerReport;
use crate::storage::{AsyncEngineStore, Persisted};
use crate::worker::{SnapshotWorker, Work};
use fencelock_node::ConnId;
use fencelock_node::{Action, ClientRequest, Event, Node};
use fencelock_node::{Durable, StorageError, Write};
use fencelock_node::{FatalError, NodeId, Query, Reply, RequestError};
use fencelock_node::{GrantRef, NodeStatus, Stats};

/// Delivers one reply to whoever asked: a channel, a client connection.
/// Returns false when the asker is gone, which for a Grant makes a ghost
/// lock that the node releases.
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

/// Where a [`Driver`] makes the node's writes ([`Action::Write`]), in the
/// order they come.
pub trait Disk: Send {
    /// Makes or queues write `write.n`, after every write before it.
    /// `Ok(true)`: it is durable already. `Ok(false)`: queued; the disk
    /// reports it later (an [`AsyncEngineStore`]'s channel of
    /// [`Persisted`]).
    fn write(&mut self, write: Write) -> Result<bool, StorageError>;

    /// The fsyncs done, for a disk that groups writes under one.
    fn syncs(&self) -> Option<u64> {
        None
    }
}

/// What fencelockd runs: urgent writes inline while the I/O thread is
/// idle, the rest queued to it.
impl Disk for AsyncEngineStore {
    fn write(&mut self, write: Write) -> Result<bool, StorageError> {
        self.submit(write)
    }

    fn syncs(&self) -> Option<u64> {
        Some(AsyncEngineStore::syncs(self))
    }
}

/// A [`Durable`] store written on the driver's thread: each write is
/// durable when made (tests, and a node that wants no I/O thread).
#[derive(Debug)]
pub struct SyncDisk<D> {
    store: D,
    written: u64,
}

impl<D: Durable> SyncDisk<D> {
    pub fn new(store: D) -> SyncDisk<D> {
        SyncDisk { store, written: 0 }
    }
}

impl<D: Durable + Send> Disk for SyncDisk<D> {
    fn write(&mut self, write: Write) -> Result<bool, StorageError> {
        let expected = self.written + 1;
        if write.n != expected {
            return Err(StorageError::OutOfOrder { expected, got: write.n });
        }
        self.store.write(&write.batch)?;
        self.written = write.n;
        Ok(true)
    }
}

/// What callers ask of a running node.
#[derive(Debug)]
pub enum Request {
    /// A client's request on connection `conn` ([`ConnId::NONE`]: on no
    /// connection that will ever be reported closed).
    Client {
        conn: ConnId,
        request: ClientRequest,
        reply: Responder,
    },
    /// Connection `conn` closed: see [`Event::ConnectionClosed`].
    ConnectionClosed(ConnId),
    Propose {
        commands: Vec<Command>,
        reply: Responder,
    },
    /// Acquire `key`, waiting up to `wait_ms` for it when it is held (0: do
    /// not wait). If `reply` is gone when the grant is ready, the lock is
    /// released at once.
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
    /// The node's report ([`Node::report`]: with the members it reaches, or,
    /// while it starts, whom it waits for), delivered to a callback on the
    /// driver thread: for callers that must not block waiting, such as an
    /// event loop. `None` when the driver is gone.
    StatusTo {
        deliver: StatusCallback,
    },
    /// Asks this node, if it leads, to hand leadership to another.
    TransferLeader {
        to: NodeId,
    },
    /// A graceful stop begins: if this node leads, it hands leadership to
    /// the most caught-up voter it reaches ([`Node::hand_off`]); the answer
    /// names that voter, `None` when there is nothing to hand.
    HandOff {
        reply: Sender<Option<NodeId>>,
    },
    /// The applied index and the lock table's snapshot bytes, at once from
    /// local state: for checking that replicas converge.
    Table {
        reply: Sender<(u64, Vec<u8>)>,
    },
    /// The node's report and the counters since start, at once: for
    /// metrics and health checks.
    Metrics {
        reply: Sender<(NodeStatus, Stats)>,
    },
}

impl Request {
    /// Answers a request that no node will see (it stopped).
    pub fn refuse(self) {
        match self {
            Request::Client { reply, .. }
            | Request::Propose { reply, .. }
            | Request::Acquire { reply, .. }
            | Request::Read { reply, .. }
            | Request::ReadLocal { reply, .. } => {
                reply.respond(Err(RequestError::Stopped));
            }
            Request::StatusTo { deliver } => deliver.deliver(None),
            Request::ConnectionClosed(_)
            | Request::Status { .. }
            | Request::Table { .. }
            | Request::Metrics { .. }
            | Request::HandOff { .. }
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

/// How many turns one [`Driver::turn`] takes at most when writes are made
/// at once: the second lets go of what waited for the first's write; more
/// are rare, and the loop comes back anyway while the node has work.
const MAX_TURNS_PER_CALL: usize = 4;

/// Settings of the thread loop.
#[derive(Clone, Debug)]
pub struct ShellConfig {
    /// The wall-clock length of one raft tick, for a node whose config has
    /// no `tick_ms` of its own (its ticks then come from this timer).
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

/// Starts `node` on a thread named `fencelock-raft-<id>`, writing to
/// `disk` and reading its time from `clock`. The thread ends when told to
/// stop or when every request sender is gone (`Ok`, with the final
/// counters), or on a fatal error (`Err`), after answering every
/// outstanding request with [`RequestError::Stopped`].
pub fn spawn(
    node: Node<Responder>,
    disk: impl Disk + 'static,
    clock: impl Clock + 'static,
    config: ShellConfig,
    channels: Channels,
    logger: &Logger,
) -> std::io::Result<JoinHandle<Result<Stats, FatalError>>> {
    let name = format!("fencelock-raft-{}", node.id().0);
    let mut driver = Driver::new(node, disk, clock, logger)?;
    std::thread::Builder::new().name(name).spawn(move || {
        let result = run(&mut driver, &config, channels);
        driver.finish(&result);
        result
    })
}

/// The loop of [`spawn`]'s thread.
fn run(driver: &mut Driver, config: &ShellConfig, channels: Channels) -> Result<Stats, FatalError> {
    let ticker = if driver.ticks_itself() { never() } else { tick(config.tick_interval) };
    let requests = channels.requests;
    let mut peers_in = channels.peers_in;
    let persisted = channels.persisted;
    // Woken through the channel, not a waker: a clone to wait on.
    let snapshots = driver.worker.results().clone();
    loop {
        let wait = driver.next_wake();
        select! {
            recv(snapshots) -> done => match done {
                Ok(done) => driver.handle(done.into_event()),
                Err(_) => return Err(StorageError::Thread("the snapshot worker stopped".into()).into()),
            },
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
            default(wait) => {}
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

/// A [`Node`] with a real clock, [`Responder`]s, a [`PeerSink`] and a
/// [`Disk`]: the shell's side of the node, without a thread. [`spawn`] runs one on its
/// own thread; fencelockd's event loop, which also serves the sockets, runs
/// one on its own, feeding it inputs and calling [`Driver::turn`] after each
/// round of them.
pub struct Driver {
    node: Node<Responder>,
    disk: Box<dyn Disk>,
    clock: Box<dyn Clock>,
    /// Encodes and decodes snapshots off the loop ([`crate::worker`]).
    worker: SnapshotWorker,
    logger: Logger,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("node", &self.node).finish_non_exhaustive()
    }
}

impl Driver {
    /// The driver, with its snapshot worker's thread started.
    pub fn new(
        node: Node<Responder>,
        disk: impl Disk + 'static,
        clock: impl Clock + 'static,
        logger: &Logger,
    ) -> std::io::Result<Driver> {
        let logger = logger.new(slog::o!("node_id" => node.id().0));
        let worker = SnapshotWorker::spawn(format!("fencelock-snapshot-{}", node.id().0))?;
        Ok(Driver { node, disk: Box::new(disk), clock: Box::new(clock), worker, logger })
    }

    /// How the snapshot worker wakes the loop that runs this driver when
    /// it has a result: that loop's next turn hands it to the node.
    pub fn set_wake(&self, wake: impl Fn() + Send + Sync + 'static) {
        self.worker.set_wake(Box::new(wake));
    }

    /// Hands the snapshot worker's results to the node; an error if the
    /// worker is gone (it panicked).
    fn take_worker_results(&mut self) -> Result<(), FatalError> {
        loop {
            match self.worker.results().try_recv() {
                Ok(done) => self.handle(done.into_event()),
                Err(crossbeam_channel::TryRecvError::Empty) => return Ok(()),
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    return Err(StorageError::Thread("the snapshot worker stopped".into()).into())
                }
            }
        }
    }

    fn handle(&mut self, event: Event<Responder>) {
        let now_ms = self.clock.now_ms();
        self.node.handle(now_ms, event);
    }

    /// A peer's message.
    pub fn step(&mut self, message: Message) {
        self.handle(Event::PeerMessage(message));
    }

    /// A peer's hello.
    pub fn hello(&mut self, from: NodeId, report: PeerReport) {
        self.handle(Event::PeerHello { from, report });
    }

    /// Progress of the disk's I/O thread.
    pub fn on_persisted(&mut self, writes: u64) {
        self.handle(Event::Persisted(writes));
    }

    /// One raft tick, for a node that does not tick itself.
    pub fn tick(&mut self) {
        self.handle(Event::Tick);
    }

    /// Whether the node ticks raft from its own time (its config has a
    /// `tick_ms`).
    pub fn ticks_itself(&self) -> bool {
        self.node.ticks_itself()
    }

    /// The node's counters, with the disk's count of fsyncs if it keeps one.
    pub fn stats(&self) -> Stats {
        let stats = self.node.stats();
        Stats { syncs: self.disk.syncs().unwrap_or(stats.syncs), ..stats }
    }

    /// The node, to read its state.
    pub fn node(&self) -> &Node<Responder> {
        &self.node
    }

    /// How long until the node wants its next turn.
    pub fn next_wake(&self) -> Duration {
        let now_ms = self.clock.now_ms();
        Duration::from_millis(self.node.next_wake_ms(now_ms).saturating_sub(now_ms))
    }

    /// Runs one turn of the node and carries out what it asks: messages to
    /// `peers_out` (flushed after each batch, and before any write), answers
    /// to their responders, writes to the disk. Grants whose asker is gone
    /// go back to the node, to be released. A write the disk made at once
    /// is reported to the node, which then takes another turn (to let go
    /// of the acknowledgements that waited for it).
    pub fn turn(&mut self, peers_out: &dyn PeerSink) -> Result<(), FatalError> {
        for _ in 0..MAX_TURNS_PER_CALL {
            let Some(durable) = self.turn_once(peers_out)? else { break };
            self.handle(Event::Persisted(durable));
        }
        Ok(())
    }

    /// One turn; returns the last write made durable at once, if any.
    fn turn_once(&mut self, peers_out: &dyn PeerSink) -> Result<Option<u64>, FatalError> {
        self.take_worker_results()?;
        let now_ms = self.clock.now_ms();
        // Grants whose answer found its asker gone, for the node after the
        // turn (never from inside it).
        let mut undelivered: Vec<GrantRef> = Vec::new();
        let mut sent = false;
        let mut durable = None;
        let mut failed = None;
        let disk = &mut self.disk;
        let worker = &self.worker;
        self.node.turn(now_ms, &mut |action| match action {
            Action::EncodeSnapshot(job) => {
                worker.submit(Work::Encode(job));
            }
            Action::DecodeSnapshot(message) => {
                worker.submit(Work::Decode(message));
            }
            Action::Send(message) => {
                peers_out.send(message);
                sent = true;
            }
            Action::Reply { to, reply, grants } => {
                if std::mem::take(&mut sent) {
                    peers_out.flush();
                }
                if !to.respond(reply) {
                    undelivered.extend(grants);
                }
            }
            Action::Write(write) => {
                if std::mem::take(&mut sent) {
                    // Followers persist in parallel with this write.
                    peers_out.flush();
                }
                if failed.is_some() {
                    return;
                }
                let n = write.n;
                match disk.write(write) {
                    Ok(true) => durable = Some(n),
                    Ok(false) => {}
                    Err(err) => failed = Some(err),
                }
            }
            Action::Applied { .. } | Action::Role(_) | Action::Started(_) => {}
        })?;
        if sent {
            peers_out.flush();
        }
        if let Some(err) = failed {
            return Err(err.into());
        }
        if !undelivered.is_empty() {
            self.handle(Event::Undelivered(undelivered));
        }
        Ok(durable)
    }

    /// Answers every outstanding request with [`RequestError::Stopped`]
    /// and logs how the driver ended.
    pub fn finish(&mut self, result: &Result<Stats, FatalError>) {
        for reply in self.node.stop() {
            reply.respond(Err(RequestError::Stopped));
        }
        match result {
            Ok(_) => info!(self.logger, "driver stopped"),
            Err(err) => crit!(self.logger, "driver stopped on a fatal error"; "error" => %err),
        }
    }

    pub fn on_request(&mut self, request: Request) {
        let client = |request, reply| Event::Request { conn: ConnId::NONE, reply_to: reply, request };
        let event = match request {
            Request::Client { conn, request, reply } => Event::Request { conn, reply_to: reply, request },
            Request::ConnectionClosed(conn) => Event::ConnectionClosed(conn),
            Request::Propose { commands, reply } => client(ClientRequest::Propose(commands), reply),
            Request::Acquire { key, lease_ms, owner, wait_ms, reply } => client(
                ClientRequest::Acquire {
                    key,
                    lease_ms,
                    owner,
                    value: fencelock_types::Value::none(),
                    wait_ms,
                },
                reply,
            ),
            Request::Read { query, reply } => client(ClientRequest::Read(query), reply),
            Request::ReadLocal { query, reply } => client(ClientRequest::ReadLocal(query), reply),
            Request::TransferLeader { to } => Event::TransferLeader(to),
            Request::HandOff { reply } => {
                let _ = reply.send(self.node.hand_off());
                return;
            }
            Request::Status { reply } => {
                if let Some(status) = self.node.status() {
                    let _ = reply.send(status);
                }
                return;
            }
            Request::StatusTo { deliver } => {
                return deliver.deliver(Some(self.node.report(self.clock.now_ms())))
            }
            Request::Table { reply } => {
                if let Some(replica) = self.node.replica() {
                    let _ = reply.send((replica.status().log.applied_index, replica.table().snapshot()));
                }
                return;
            }
            Request::Metrics { reply } => {
                // The metrics (and /ready) see a starting node too.
                let _ = reply.send((self.node.report(self.clock.now_ms()), self.node.stats()));
                return;
            }
        };
        self.handle(event);
    }
}
