//! fencelockd: one node of a fencelock cluster.
//!
//! A thin binary. It reads the configuration, builds the logger, opens the
//! raft driver on its data directory, and joins it to the network layer:
//! the driver runs as the [`Core`] of the network layer's node loop, one
//! thread that reads and writes every client and peer socket and steps raft
//! between rounds of events; client requests reach it through
//! [`handler::ClientHandler`]. Writes and syncs happen on the store's I/O
//! thread. A node whose data directory is empty opens no replica until its
//! peers' hellos tell it whether it is new or lost its data
//! (`fencelock_raft::rejoin`); with `--metrics-addr`, a thread serves
//! Prometheus metrics ([`metrics`]). On SIGINT or SIGTERM it stops
//! accepting clients, lets what is in flight finish, and stops the driver,
//! whose every write was already synced.

mod config;
mod handler;
mod metrics;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use crossbeam_channel::{bounded, select, tick, unbounded, Receiver, Sender};
use fencelock_net::{
    ClientAddrs, ClientConfig, Core, Greetings, LoopWaker, NodeIo, NodeLoop, PeerConfig, Route, Turn,
};
use fencelock_raft::rejoin::{self, Membership, PeerReport, Start};
use fencelock_raft::shell::{Driver, MonotonicClock, PeerSink, Request};
use fencelock_raft::{
    AsyncEngineStore, Durable, EngineStore, FatalError, Persisted, Replica, Stats, WriteBatch,
};
use raft::prelude::Message;
use slog::{crit, info, o, warn, Drain, Logger};

use crate::config::{Flags, LogFormat, ServerConfig};
use crate::handler::{ClientHandler, Directory, Identity};

/// How long a stopping server lets requests in flight finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

fn main() -> ExitCode {
    let flags = Flags::parse();
    let config = match ServerConfig::load(&flags) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("fencelockd: bad configuration: {err:#}");
            return ExitCode::from(1);
        }
    };
    if flags.config_check {
        println!(
            "configuration ok: node {} of {:?}, clients on {}",
            config.id, config.peers, config.client_addr
        );
        return ExitCode::SUCCESS;
    }
    let (logger, _flush_on_exit) = build_logger(&config);
    match run(&config, &logger) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            crit!(logger, "fencelockd stopped"; "error" => format!("{err:#}"));
            eprintln!("fencelockd: {err:#}");
            ExitCode::from(1)
        }
    }
}

fn build_logger(config: &ServerConfig) -> (Logger, slog_async::AsyncGuard) {
    let drain: Box<dyn Drain<Ok = (), Err = slog::Never> + Send> = match config.log_format {
        LogFormat::Text => {
            let decorator = slog_term::PlainDecorator::new(std::io::stderr());
            Box::new(slog_term::FullFormat::new(decorator).build().fuse())
        }
        LogFormat::Json => Box::new(slog_json::Json::default(std::io::stderr()).fuse()),
    };
    let drain = drain.filter_level(config.log_level).fuse();
    let (drain, guard) = slog_async::Async::new(drain).chan_size(4096).build_with_guard();
    (Logger::root(drain.fuse(), o!()), guard)
}

/// The node's core, run by the node loop between rounds of socket events:
/// the raft driver, fed the peers' messages and the clients' requests, its
/// messages and replies written by the same thread.
struct NodeCore<D: Durable> {
    /// `None` while a node that found its store empty waits for its peers'
    /// hellos to tell how to start (`starting`).
    driver: Option<Driver<D>>,
    starting: Option<Starting<D>>,
    /// What this node's hellos say, and what its peers' said.
    greetings: Greetings,
    requests: Receiver<Request>,
    /// Progress of the asynchronous store, and the messages its I/O thread
    /// held until a sync (`never()` for a synchronous store).
    persisted: Receiver<Persisted>,
    held: Receiver<Message>,
    tick_interval: Duration,
    next_tick: Instant,
    /// The most requests taken into one turn.
    drain_max: usize,
    stop: Arc<AtomicBool>,
    outcome: Arc<Mutex<Option<Result<Stats, FatalError>>>>,
    logger: Logger,
}

/// Opens the replica once the node knows how to start, with the store's
/// progress reports.
type Opener<D> = Box<dyn FnOnce(Start) -> Result<(Driver<D>, Receiver<Persisted>), FatalError> + Send>;

/// A node whose store was empty: a new cluster's, or one whose data was
/// lost. It asks its peers in their hellos before it takes any part (see
/// `fencelock_raft::rejoin`).
struct Starting<D: Durable> {
    peers: BTreeSet<u64>,
    open: Opener<D>,
    next_report: Instant,
}

/// How often a starting node says whom it still waits for.
const STARTING_REPORT_EVERY: Duration = Duration::from_secs(5);

impl<D: Durable + Send> Core<Message> for NodeCore<D> {
    fn turn(&mut self, inbound: &mut Vec<Message>, io: &mut NodeIo<'_, Message>) -> Turn {
        let result = if self.stop.load(Ordering::SeqCst) {
            Err(Ok(self.driver.as_ref().map(Driver::stats).unwrap_or_default()))
        } else if self.driver.is_none() {
            self.start_turn(inbound).map_err(Err)
        } else {
            self.run_turn(inbound, io).map_err(Err)
        };
        match result {
            Ok(wait) => Turn::Wait(wait),
            Err(outcome) => {
                if let Some(driver) = self.driver.as_mut() {
                    driver.finish(&outcome);
                }
                if let Ok(mut slot) = self.outcome.lock() {
                    *slot = Some(outcome);
                }
                Turn::Stop
            }
        }
    }
}

impl<D: Durable> NodeCore<D> {
    /// A turn of a node that is still deciding how to start: peers'
    /// messages are dropped (raft sends again) and clients are told to try
    /// another node, until every peer's hello says this node is new, or a
    /// majority's says it lost its data.
    fn start_turn(&mut self, inbound: &mut Vec<Message>) -> Result<Duration, FatalError> {
        inbound.clear();
        for request in self.requests.try_iter().take(self.drain_max) {
            request.refuse();
        }
        let Some(mut starting) = self.starting.take() else {
            return Ok(STARTING_REPORT_EVERY);
        };
        let heard = self.greetings.heard();
        let reports = heard
            .iter()
            .map(|(id, heard)| {
                let report =
                    PeerReport { knows_you: heard.knows_you, term: heard.term, last_index: heard.last_index };
                (*id, report)
            })
            .collect();
        let start = rejoin::decide(&starting.peers, &reports);
        match start {
            Start::Wait => {
                let now = Instant::now();
                if now >= starting.next_report {
                    starting.next_report = now + STARTING_REPORT_EVERY;
                    let waiting: Vec<u64> =
                        starting.peers.iter().filter(|id| !heard.contains_key(id)).copied().collect();
                    info!(self.logger, "empty store: waiting for peers to say whether this node was a member before";
                        "answered" => ?heard.keys().collect::<Vec<_>>(), "waiting_for" => ?waiting);
                }
                self.starting = Some(starting);
                return Ok(Duration::from_millis(20));
            }
            Start::Fresh => {
                info!(self.logger, "empty store, and no peer knows this node: a new member, starting")
            }
            Start::Rejoin(floor) => warn!(self.logger,
                "empty store, but peers know this node: its data was lost. Rejoining without a vote until it has \
                 caught up";
                "floor_term" => floor.term, "floor_last_index" => floor.last_index,
                "known_by" => ?heard.iter().filter(|(_, heard)| heard.knows_you).map(|(id, _)| *id).collect::<Vec<_>>()),
        }
        let (driver, persisted) = (starting.open)(start)?;
        self.driver = Some(driver);
        self.persisted = persisted;
        Ok(Duration::ZERO)
    }

    /// Takes everything waiting, runs one `Ready`; returns how long the
    /// loop may sleep.
    fn run_turn(
        &mut self,
        inbound: &mut Vec<Message>,
        io: &mut NodeIo<'_, Message>,
    ) -> Result<Duration, FatalError> {
        let Some(driver) = self.driver.as_mut() else {
            return Ok(self.tick_interval);
        };
        for message in inbound.drain(..) {
            driver.step(message);
        }
        for message in self.held.try_iter() {
            // A dropped message is sent again by raft.
            io.send(message);
        }
        while let Ok(progress) = self.persisted.try_recv() {
            driver.on_persisted(progress?);
        }
        for request in self.requests.try_iter().take(self.drain_max) {
            driver.on_request(request);
        }
        let now = Instant::now();
        if now >= self.next_tick {
            driver.tick();
            self.next_tick += self.tick_interval;
            if self.next_tick <= now {
                // A loop held up for several ticks does not catch up in a
                // burst: the next tick is a whole interval away.
                self.next_tick = now + self.tick_interval;
            }
        }
        driver.turn(&LoopSink(RefCell::new(io)))?;
        let replica = driver.replica();
        let (term, last_index) = replica.log_position();
        self.greetings.set_own(term, last_index, replica.known_peers());
        if self.requests.is_empty() {
            Ok(self.next_tick.saturating_duration_since(Instant::now()))
        } else {
            Ok(Duration::ZERO)
        }
    }
}

/// The driver's messages, written to the peers' sockets by the loop.
struct LoopSink<'a, 'b>(RefCell<&'a mut NodeIo<'b, Message>>);

impl PeerSink for LoopSink<'_, '_> {
    fn send(&self, message: Message) {
        // A dropped message is sent again by raft.
        self.0.borrow_mut().send(message);
    }

    fn flush(&self) {
        self.0.borrow_mut().flush();
    }
}

/// Where the asynchronous store's I/O thread sends the messages it held
/// until their sync: to the loop, which is woken once per group.
struct HeldSink {
    messages: Sender<Message>,
    waker: Arc<OnceLock<LoopWaker>>,
}

impl PeerSink for HeldSink {
    fn send(&self, message: Message) {
        let _ = self.messages.send(message);
    }

    fn flush(&self) {
        if let Some(waker) = self.waker.get() {
            waker.wake();
        }
    }
}

struct PeerDirectory(ClientAddrs);

impl Directory for PeerDirectory {
    fn client_addr(&self, id: u64) -> Option<String> {
        self.0.get(id)
    }
}

fn run(config: &ServerConfig, logger: &Logger) -> Result<()> {
    // Bound first: a taken port is a configuration error, found at once.
    let metrics_listener = match config.metrics_addr {
        Some(addr) => Some(
            std::net::TcpListener::bind(addr).with_context(|| format!("cannot serve metrics on {addr}"))?,
        ),
        None => None,
    };
    let raft_dir = config.data_dir.join("raft");
    std::fs::create_dir_all(&raft_dir).with_context(|| format!("cannot create {}", raft_dir.display()))?;
    let store = EngineStore::open(&raft_dir)
        .with_context(|| format!("cannot open the raft log in {}", raft_dir.display()))?;
    let blank =
        store.is_blank().with_context(|| format!("cannot read the raft log in {}", raft_dir.display()))?;
    // Unbounded: the loop that drains it is the one that fills it, so a
    // full channel would stop it for good. Connections and requests in
    // flight per connection bound it.
    let (requests_tx, requests_rx) = unbounded();
    let (held_tx, held_rx) = unbounded();
    let waker_slot = Arc::new(OnceLock::new());

    // Writes and syncs happen on their own thread, so that the loop goes
    // on serving sockets and stepping raft while the disk syncs; the
    // messages that must wait for a sync come back to the loop.
    let held_sink = HeldSink { messages: held_tx, waker: Arc::clone(&waker_slot) };
    let driver_config = config.driver.clone();
    let open_logger = logger.clone();
    let open = move |start: Start| -> Result<(Driver<AsyncEngineStore>, Receiver<Persisted>), FatalError> {
        let mut store = store;
        if let Start::Rejoin(floor) = start {
            // Durable before the replica takes any part.
            let membership = Membership { rejoin: Some(floor), ..Default::default() };
            store.write(WriteBatch { membership: Some(&membership), ..Default::default() })?;
        }
        let (store, persisted) =
            AsyncEngineStore::spawn(store, "fencelock-raft-io".into(), Box::new(held_sink))?;
        let replica = Replica::open(driver_config, store, &open_logger)?;
        Ok((Driver::new(replica, MonotonicClock::new(), &open_logger), persisted))
    };
    let greetings = Greetings::new();
    let (driver, persisted, starting) = if blank && config.peers.len() > 1 {
        info!(logger, "empty store: asking the peers whether this node was a member before");
        let peers = config.peers.keys().copied().filter(|id| *id != config.id).collect();
        let starting =
            Starting { peers, open: Box::new(open), next_report: Instant::now() + STARTING_REPORT_EVERY };
        (None, crossbeam_channel::never(), Some(starting))
    } else {
        let (driver, persisted) = open(Start::Fresh)
            .with_context(|| format!("cannot open the replica in {}", raft_dir.display()))?;
        (Some(driver), persisted, None)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let outcome = Arc::new(Mutex::new(None));
    let core = NodeCore {
        driver,
        starting,
        greetings: greetings.clone(),
        requests: requests_rx,
        persisted,
        held: held_rx,
        tick_interval: config.tick,
        next_tick: Instant::now() + config.tick,
        drain_max: 4_096,
        stop: Arc::clone(&stop),
        outcome: Arc::clone(&outcome),
        logger: logger.clone(),
    };

    let own_peer_addr = config.peers[&config.id];
    let peer_config = PeerConfig {
        node_id: config.id,
        listen_addr: own_peer_addr,
        peers: config
            .peers
            .iter()
            .filter(|(id, _)| **id != config.id)
            .map(|(id, addr)| (*id, *addr))
            .collect(),
        client_addr: config.client_addr.to_string(),
        frame_bytes_max: 256 << 20,
        output_bytes_max: 64 << 20,
        reconnect_backoff_min: Duration::from_millis(20),
        reconnect_backoff_max: Duration::from_secs(1),
        greetings,
    };
    let client_addrs = ClientAddrs::new();
    let identity = Identity {
        node_id: config.id,
        client_addr: config.client_addr,
        peers: config.peers.clone(),
        directory: Arc::new(PeerDirectory(client_addrs.clone())),
    };
    let handler = Arc::new(ClientHandler { driver: requests_tx.clone(), identity: Arc::new(identity) });
    let client_config = ClientConfig {
        listen_addr: config.client_addr,
        connections_max: config.max_connections,
        in_flight_max: config.max_in_flight,
        frame_bytes_max: config.max_frame_bytes,
    };
    let make_core = |waker: LoopWaker| -> Box<dyn Core<Message>> {
        let _ = waker_slot.set(waker);
        Box::new(core)
    };
    let node = NodeLoop::start(
        client_config,
        peer_config,
        |message: &Message| Route { from: message.from, to: message.to },
        handler,
        make_core,
        client_addrs,
        logger,
    )
    .with_context(|| {
        format!("cannot listen on {} (clients) and {own_peer_addr} (peers)", config.client_addr)
    })?;
    let waker = node.waker();
    if let Some(listener) = metrics_listener {
        metrics::spawn(listener, config.id, requests_tx.clone(), waker.clone(), logger.clone())?;
    }
    info!(logger, "fencelockd serving"; "node_id" => config.id, "clients" => %config.client_addr, "peers" => %own_peer_addr);

    let (signal_tx, signal_rx) = bounded(4);
    let mut signals =
        signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
            .context("cannot install signal handlers")?;
    std::thread::Builder::new().name("fencelock-signals".into()).spawn(move || {
        for signal in signals.forever() {
            if signal_tx.send(signal).is_err() {
                return;
            }
        }
    })?;

    // Wait for a signal, or for the loop to stop on its own (a fatal error).
    let poll = tick(Duration::from_millis(100));
    loop {
        select! {
            recv(signal_rx) -> signal => {
                info!(logger, "shutting down"; "signal" => signal.unwrap_or_default());
                break;
            }
            recv(poll) -> _ => {
                if node.is_finished() {
                    break;
                }
            }
        }
    }

    node.stop_accepting();
    let deadline = Instant::now() + SHUTDOWN_GRACE;
    while Instant::now() < deadline && !node.is_finished() && pending_requests(&requests_tx, &waker) > 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    waker.wake();
    node.join().map_err(|_| anyhow::anyhow!("the node loop panicked"))?;
    let outcome = outcome.lock().map_err(|_| anyhow::anyhow!("the node loop panicked"))?.take();
    let stats = outcome
        .ok_or_else(|| anyhow::anyhow!("the node loop ended without a word"))?
        .context("the driver stopped on a fatal error")?;
    info!(logger, "fencelockd stopped"; "entries_applied" => stats.entries_applied, "syncs" => stats.syncs);
    Ok(())
}

/// Requests the driver has accepted and not answered, 0 if it is gone.
fn pending_requests(requests: &Sender<Request>, waker: &LoopWaker) -> usize {
    let (tx, rx) = bounded(1);
    if requests.send(Request::Status { reply: tx }).is_err() {
        return 0;
    }
    waker.wake();
    rx.recv_timeout(Duration::from_secs(1)).map_or(0, |status| status.pending_requests)
}
