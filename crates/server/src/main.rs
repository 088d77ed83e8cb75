//! fencelockd: one node of a fencelock cluster.
//!
//! A thin binary: wiring, no decisions. It reads the configuration, builds
//! the logger, opens raft-engine on its data directory behind its I/O
//! thread, and runs the node (`fencelock_raft::Node`, the same sans-IO code
//! the simulator runs) as the [`Core`] of the network layer's node loop: one
//! thread that reads and writes every client and peer socket and turns the
//! node between rounds of events. Client requests reach it through
//! [`handler::ClientHandler`], with the connection they came on, and so do
//! connection closes. With `--metrics-addr`, a thread serves Prometheus
//! metrics ([`metrics`]). With `--certs-dir`, client requests are checked
//! against the users' rights ([`access`]) and SIGHUP reloads the
//! certificates. On SIGINT or SIGTERM it stops accepting clients,
//! lets what is in flight finish, and stops the node, whose every write
//! was already synced.

mod access;
mod backup;
mod config;
mod errors;
mod handler;
mod join;
mod metrics;
mod parse;
mod restore;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use crossbeam_channel::{bounded, select, tick, unbounded, Receiver, Sender};
use fencelock_net::{
    ClientAddrs, ClientConfig, Core, Greetings, LoopWaker, NodeIo, NodeLoop, PeerBook, PeerConfig, PeerTls,
    Reloadable, Route, Turn,
};
use fencelock_raft::shell::{Driver, MonotonicClock, PeerSink, Request};
use fencelock_raft::{AsyncEngineStore, EngineStore, FatalError, Node, NodeConfig, NodeId, Persisted, Stats};
use raft::prelude::Message;
use slog::{crit, error, info, o, warn, Drain, Logger};

use crate::config::{Flags, LogFormat, ServerConfig};
use crate::handler::{ClientHandler, Directory, Identity};

/// mimalloc, not the system allocator: a request costs a few dozen small
/// allocations (frames, commands, answers), and glibc's malloc spent about a
/// quarter of the leader's instructions on them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Client requests the node takes into one turn.
const DRAIN_MAX: usize = 4_096;

/// Client requests queued for the node loop past which the listener stops
/// reading requests until a turn takes some: two turns' worth.
const QUEUED_MAX: usize = 2 * DRAIN_MAX;

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
        // The certificates are part of the configuration.
        if let Some(dir) = &config.certs_dir {
            if let Err(err) = fencelock_tls::node_tls(&fencelock_tls::Layout::new(dir), config.id) {
                eprintln!("fencelockd: cannot serve TLS: {err}");
                return ExitCode::from(1);
            }
        }
        // One comment line for people, then the whole configuration with
        // every default, as a file --config takes.
        println!(
            "# configuration ok: node {} of {}, clients on {} (advertised as {}), peers on {} (advertised as \
             {}){}",
            config.id,
            config.peers.len(),
            config.client_addr,
            config.advertise_client_addr,
            config.peer_listen_addr,
            config.advertise_peer_addr,
            if config.certs_dir.is_some() { ", TLS on both ports" } else { "" }
        );
        print!("{}", config.to_toml());
        return ExitCode::SUCCESS;
    }
    let (logger, _flush_on_exit) = build_logger(&config);
    match run(&config, &logger) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            fn fatal<'a>(cause: &'a (dyn std::error::Error + 'static)) -> Option<&'a FatalError> {
                cause.downcast_ref::<FatalError>()
            }
            if err.chain().any(|cause| matches!(fatal(cause), Some(FatalError::MemberElsewhere { .. }))) {
                // Not a failure a restart mends: the same command would
                // stop again. Exit code 4, which the systemd unit does not
                // restart either.
                crit!(logger, "fencelockd stopped: a running cluster added this node, which must join it";
                    "error" => format!("{err:#}"));
                eprintln!("fencelockd: {err:#}");
                return ExitCode::from(EXIT_MEMBER_ELSEWHERE);
            }
            let join_refused = err.chain().any(|cause| {
                matches!(
                    cause.downcast_ref::<fencelock_client::ClientError>(),
                    Some(fencelock_client::ClientError::PermissionDenied(_))
                )
            });
            if join_refused {
                // --join, refused: no admin added this node (its own
                // certificate may only confirm an admin's member add), or
                // the user it called as is no admin. The same command
                // would be refused again: exit code 4, as above.
                crit!(logger, "fencelockd stopped: the cluster refused to add this node"; "error" => format!("{err:#}"));
                eprintln!("fencelockd: {err:#}");
                return ExitCode::from(EXIT_MEMBER_ELSEWHERE);
            }
            let removed = err.chain().any(|cause| matches!(fatal(cause), Some(FatalError::Removed { .. })));
            if removed {
                // Not a failure to restart from: exit code 3, which the
                // systemd unit does not restart (RestartPreventExitStatus).
                crit!(logger, "fencelockd stopped: this node was removed from the cluster"; "error" => format!("{err:#}"));
                eprintln!("fencelockd: this node was removed from the cluster; it serves no more ({err:#})");
                return ExitCode::from(EXIT_REMOVED);
            }
            crit!(logger, "fencelockd stopped"; "error" => format!("{err:#}"));
            eprintln!("fencelockd: {err:#}");
            ExitCode::from(1)
        }
    }
}

/// The exit code of a node that stops because it was removed from the
/// cluster (or finds itself removed at start).
const EXIT_REMOVED: u8 = 3;

/// The exit code of a node with an empty data directory that a running
/// cluster contacted as its member, started without `--join`: it stops
/// rather than found a second cluster. Also of a `--join` the cluster
/// refused (no admin added the node): run `fencelock member add` first.
const EXIT_MEMBER_ELSEWHERE: u8 = 4;

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
/// the node (`fencelock_raft::Node`, behind the shell's `Driver`), fed the
/// peers' messages and hellos, the clients' requests and the store's
/// progress, its messages and answers written by the same thread. Wiring
/// only: every decision is the node's.
struct NodeCore {
    driver: Driver,
    /// What this node's hellos say, and what its peers' said.
    greetings: Greetings,
    /// [`Greetings::hellos`] when the node was last fed them.
    hellos_fed: u64,
    /// The cluster id the hellos name, once known.
    cluster_id: Option<fencelock_types::ClusterId>,
    requests: Receiver<Request>,
    /// Progress of the asynchronous store.
    persisted: Receiver<Persisted>,
    /// The most requests taken into one turn.
    drain_max: usize,
    stop: Arc<AtomicBool>,
    outcome: Arc<Mutex<Option<Result<Stats, FatalError>>>>,
    /// The peers the transport connects to and takes hellos from: the
    /// members of the configuration the node applied.
    book: PeerBook,
    /// Peer addresses of members the replicated directory does not name
    /// (the initial cluster's, from --peers or the join answer).
    initial_peers: BTreeMap<u64, String>,
    /// The configuration the book was last set from.
    conf_version: Option<u64>,
    /// Whether `initial_peers` were compared with the members (once, at
    /// the first configuration known).
    peers_checked: bool,
    id: u64,
    logger: Logger,
}

impl Core<Message> for NodeCore {
    fn turn(&mut self, inbound: &mut Vec<Message>, io: &mut NodeIo<'_, Message>) -> Turn {
        let result = if self.stop.load(Ordering::SeqCst) {
            Err(Ok(self.driver.stats()))
        } else {
            self.run_turn(inbound, io).map_err(Err)
        };
        match result {
            Ok(wait) => Turn::Wait(wait),
            Err(outcome) => {
                self.driver.finish(&outcome);
                if let Ok(mut slot) = self.outcome.lock() {
                    *slot = Some(outcome);
                }
                Turn::Stop
            }
        }
    }
}

impl NodeCore {
    /// Feeds the node everything waiting and runs one turn; returns how
    /// long the loop may sleep.
    fn run_turn(
        &mut self,
        inbound: &mut Vec<Message>,
        io: &mut NodeIo<'_, Message>,
    ) -> Result<Duration, FatalError> {
        for message in inbound.drain(..) {
            self.driver.step(message);
        }
        // Every hello while the node starts (it waits for its peers'), and
        // afterwards the news: a peer's command level, which the leader
        // raises the cluster's by.
        let hellos = self.greetings.hellos();
        if self.driver.node().is_starting() || hellos != self.hellos_fed {
            self.hellos_fed = hellos;
            for (id, report) in self.greetings.heard() {
                self.driver.hello(NodeId(id), report);
            }
            // Members of a running cluster this node's configuration does
            // not name: a blank node then never founds one of its own.
            for (id, (report, _)) in self.greetings.strangers() {
                self.driver.hello(NodeId(id), report);
            }
        }
        // Before the turn's messages open connections: their hellos name
        // the cluster from the first one on.
        self.name_cluster();
        loop {
            match self.persisted.try_recv() {
                Ok(progress) => self.driver.on_persisted(progress?),
                Err(crossbeam_channel::TryRecvError::Empty) => break,
                // The I/O thread reports its failures before it ends; this
                // is the backstop.
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    let stopped = fencelock_raft::StorageError::Thread("the I/O thread stopped".into());
                    return Err(stopped.into());
                }
            }
        }
        for request in self.requests.try_iter().take(self.drain_max) {
            self.driver.on_request(request);
        }
        self.driver.turn(&LoopSink(RefCell::new(io)))?;
        self.follow_members();
        self.greetings.set_own(self.driver.node().hello_state());
        self.name_cluster();
        if self.requests.is_empty() {
            Ok(self.driver.next_wake())
        } else {
            Ok(Duration::ZERO)
        }
    }
}

impl NodeCore {
    /// Sets the peer book from the configuration whenever it changes: a
    /// member added is connected to, one removed is dropped.
    fn follow_members(&mut self) {
        let version = self.driver.node().conf_version();
        if version.is_none() || version == self.conf_version {
            return;
        }
        self.conf_version = version;
        let Some((_, members)) = self.driver.node().members() else { return };
        // A joining node learns its configuration with its first snapshot:
        // until then it keeps the members the cluster named.
        if members.is_empty() {
            return;
        }
        if !self.peers_checked {
            // Once, at start: --peers (or the TOML's peers) go stale as
            // members change, which is harmless (they are only where a blank
            // node first looks), but an operator reading them is misled.
            self.peers_checked = true;
            let listed: Vec<u64> = self.initial_peers.keys().copied().collect();
            let mut ids: Vec<u64> = members.iter().map(|member| member.id.0).collect();
            ids.sort_unstable();
            if listed != ids {
                warn!(self.logger, "--peers differs from the cluster's members: the members are in the log, and \
                                    --peers is only where a node with an empty data directory first looks (update \
                                    it when convenient)";
                    "peers" => ?listed, "members" => ?ids);
            }
        }
        let mut peers = BTreeMap::new();
        for member in members.into_iter().filter(|member| member.id.0 != self.id) {
            let addr = member
                .addrs
                .map(|addrs| addrs.peer_addr)
                .or_else(|| self.initial_peers.get(&member.id.0).cloned());
            match addr {
                Some(addr) => {
                    peers.insert(member.id.0, addr);
                }
                None => warn!(self.logger, "no peer address known for a member: not connecting to it";
                    "member" => member.id.0),
            }
        }
        self.book.set(peers);
    }

    /// Tells the hellos the cluster's id once the node knows it.
    fn name_cluster(&mut self) {
        let cluster_id = self.driver.node().cluster_id();
        if cluster_id != self.cluster_id {
            if let Some(id) = cluster_id {
                self.greetings.set_cluster_id(id.as_bytes());
            }
            self.cluster_id = cluster_id;
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

struct PeerDirectory(ClientAddrs);

impl Directory for PeerDirectory {
    fn client_addr(&self, id: u64) -> Option<String> {
        self.0.get(id)
    }
}

/// Open files a node needs besides its client connections: two per peer
/// (a connection each way), the raft log's files, the listeners, the
/// metrics endpoint's connections, the logger, and a margin.
const FILES_BESIDES_CLIENTS: u64 = 256;

/// Raises the soft open-file limit to what the configured caps need, so
/// that connections never run out of descriptors below the caps (which
/// would refuse peers and clients alike); or refuses to start, saying why,
/// when the hard limit is too low.
fn raise_open_file_limit(config: &ServerConfig, logger: &Logger) -> Result<()> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let needed = config.max_connections as u64 + 2 * config.peers.len() as u64 + FILES_BESIDES_CLIENTS;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).context("cannot read the open-file limit")?;
    if soft >= needed {
        return Ok(());
    }
    if hard < needed {
        anyhow::bail!(
            "--max-connections {} needs about {needed} open files, but the hard open-file limit is {hard} \
             (ulimit -Hn): raise it, or lower --max-connections",
            config.max_connections
        );
    }
    setrlimit(Resource::RLIMIT_NOFILE, needed, hard).context("cannot raise the open-file limit")?;
    info!(logger, "raised the open-file limit for the connection caps"; "from" => soft, "to" => needed);
    Ok(())
}

fn run(config: &ServerConfig, logger: &Logger) -> Result<()> {
    raise_open_file_limit(config, logger)?;
    // Bound first: a taken port is a configuration error, found at once.
    let metrics_listener = match config.metrics_addr {
        Some(addr) => Some(
            std::net::TcpListener::bind(addr).with_context(|| format!("cannot serve metrics on {addr}"))?,
        ),
        None => None,
    };
    // Both ports next, before anything is written or anyone is asked to
    // add this node: a port in use leaves nothing half done, and the error
    // names the address.
    let listeners = fencelock_net::Listeners::bind(config.client_addr, config.peer_listen_addr)?;
    // Certificates first: a bad file is a configuration error, named.
    let tls = match &config.certs_dir {
        Some(dir) => Some(TlsConfigs::load(dir, config.id).context("cannot serve TLS")?),
        None => None,
    };
    let raft_dir = config.data_dir.join("raft");
    std::fs::create_dir_all(&raft_dir).with_context(|| format!("cannot create {}", raft_dir.display()))?;
    let mut store = EngineStore::open(&raft_dir)
        .with_context(|| format!("cannot open the raft log in {}", raft_dir.display()))?;
    let mut peers = config.peers.clone();
    let mut joining = false;
    // A voter whose data was lost, found by --join: it waits for its
    // peers' hellos and rejoins.
    let mut rejoining = false;
    if let Some(endpoints) = &config.join {
        if store.is_blank().context("cannot read the raft log")? {
            let joined = join::ask_to_join(config, endpoints, logger)?;
            peers = joined.peers;
            joining = !joined.voter_already;
            rejoining = joined.voter_already;
        } else {
            info!(logger, "--join: this node holds data already, and starts from it");
        }
    }
    if let Some(file) = &config.restore {
        let voters = config.peers.keys().copied().collect();
        let seed = restore::Seed { file, voters, data_dir: &config.data_dir, node_id: config.id };
        restore::restore(&mut store, &seed, logger)?;
    }
    // Unbounded: the loop that drains it is the one that fills it, so a
    // full channel would stop it for good. The listener stops reading
    // requests once it holds QUEUED_MAX (`Handler::ready`); what passes that
    // is one connection's round (REQUESTS_PER_ROUND) and the notices of
    // closed connections.
    let (requests_tx, requests_rx) = unbounded();
    let waker_slot: Arc<OnceLock<LoopWaker>> = Arc::new(OnceLock::new());

    // Writes and syncs happen on their own thread, so that the loop goes
    // on serving sockets and stepping raft while the disk syncs; each
    // synced group wakes the loop once, and the node lets go of the
    // messages that waited for it.
    let progress_waker = Arc::clone(&waker_slot);
    let progress = move || {
        if let Some(waker) = progress_waker.get() {
            waker.wake();
        }
    };
    let (store, recovered, persisted) =
        AsyncEngineStore::spawn(store, "fencelock-raft-io".into(), Box::new(progress))
            .with_context(|| format!("cannot read the raft log in {}", raft_dir.display()))?;
    // The name this node gives the cluster should it be the first leader
    // of a cluster without one.
    let mut driver_config = config.driver.clone();
    if joining || rejoining {
        driver_config.founding.joining = joining;
        driver_config.voters = peers.keys().map(|id| NodeId(*id)).collect();
    }
    if rejoining {
        driver_config.founding.initial_cluster_state = fencelock_raft::rejoin::ClusterState::Existing;
    }
    let mut cluster_id = [0; fencelock_types::CLUSTER_ID_LEN];
    getrandom::getrandom(&mut cluster_id)
        .context("cannot draw a cluster id from the system's random source")?;
    driver_config.founding.cluster_id = fencelock_types::ClusterId::new(cluster_id);
    // And the token floor it would found it with: its wall clock, so that
    // a cluster re-created from nothing issues tokens above its old ones
    // (docs/leases.md).
    driver_config.founding.token_floor = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_micros()).unwrap_or(u64::MAX));
    let node_config = NodeConfig {
        driver: driver_config,
        tick_ms: Some(config.tick.as_millis() as u64),
        election_seed: None,
    };
    let node = Node::open(node_config, recovered, logger)
        .with_context(|| format!("cannot open the replica in {}", raft_dir.display()))?;
    let greetings = Greetings::new();
    greetings.set_peer_addr(&config.advertise_peer_addr);
    let hello_book = greetings.clone();
    // Known from the store already, unless the node is new: named before
    // any hello is sent.
    let cluster_id = node.cluster_id();
    if let Some(id) = cluster_id {
        greetings.set_cluster_id(id.as_bytes());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let outcome = Arc::new(Mutex::new(None));
    let driver = Driver::new(node, store, MonotonicClock::new(), logger)
        .context("cannot start the snapshot worker thread")?;
    // Snapshots are encoded and decoded on a thread of their own, which
    // wakes the loop with each result.
    let snapshot_waker = Arc::clone(&waker_slot);
    driver.set_wake(move || {
        if let Some(waker) = snapshot_waker.get() {
            waker.wake();
        }
    });
    let book = PeerBook::new(
        peers.iter().filter(|(id, _)| **id != config.id).map(|(id, addr)| (*id, addr.clone())).collect(),
    );
    let core = NodeCore {
        book: book.clone(),
        initial_peers: peers.clone(),
        conf_version: None,
        // A node that joined was given the cluster's members: nothing to
        // compare.
        peers_checked: config.join.is_some(),
        id: config.id,
        logger: logger.clone(),
        driver,
        greetings: greetings.clone(),
        hellos_fed: 0,
        cluster_id,
        requests: requests_rx,
        persisted,
        drain_max: DRAIN_MAX,
        stop: Arc::clone(&stop),
        outcome: Arc::clone(&outcome),
    };

    let own_peer_addr = config.peer_listen_addr;
    let peer_config = PeerConfig {
        node_id: config.id,
        listen_addr: own_peer_addr,
        peers: book,
        client_addr: config.advertise_client_addr.clone(),
        // Twice a part: messages over PART_BYTES (snapshots) come in parts.
        frame_bytes_max: 2 * fencelock_net::PART_BYTES,
        message_bytes_max: config.max_snapshot_bytes,
        output_bytes_max: 64 << 20,
        reconnect_backoff_min: Duration::from_millis(20),
        reconnect_backoff_max: Duration::from_secs(1),
        greetings,
        tls: tls.as_ref().map(|tls| PeerTls { accept: tls.peer_accept.clone(), dial: tls.peer_dial.clone() }),
        // Counted before decoding: a message of millions of empty entries
        // is dropped before it costs a gigabyte.
        precheck: |bytes| fencelock_raft::scan::peer_message(bytes).map(drop).map_err(|err| err.to_string()),
    };
    let client_addrs = ClientAddrs::new();
    let identity = Identity {
        node_id: config.id,
        client_addr: config.advertise_client_addr.clone(),
        // This node's own entry is what it advertises.
        peers: peers
            .iter()
            .map(|(id, addr)| {
                let addr = if *id == config.id { &config.advertise_peer_addr } else { addr };
                (*id, addr.clone())
            })
            .collect(),
        directory: Arc::new(PeerDirectory(client_addrs.clone())),
    };
    let handler = Arc::new(ClientHandler {
        driver: requests_tx.clone(),
        identity: Arc::new(identity),
        access: config.access.clone(),
        wait_max_ms: config.wait_max_ms,
        queued_max: QUEUED_MAX,
        backups: Arc::new(backup::Backups::new(logger.clone())),
        logger: logger.clone(),
    });
    let client_config = ClientConfig {
        listen_addr: config.client_addr,
        connections_max: config.max_connections,
        per_address_max: config.max_connections_per_address,
        idle_timeout: config.idle_timeout,
        in_flight_max: config.max_in_flight,
        frame_bytes_max: config.max_frame_bytes,
        input_total_max: config.max_input_bytes,
        output_total_max: config.max_output_bytes,
        tls: tls.as_ref().map(|tls| tls.clients.clone()),
    };
    let make_core = |waker: LoopWaker| -> Box<dyn Core<Message>> {
        let _ = waker_slot.set(waker);
        Box::new(core)
    };
    let node = NodeLoop::start_on(
        listeners,
        client_config,
        peer_config,
        |message: &Message| Route { from: message.from, to: message.to },
        handler,
        make_core,
        client_addrs,
        logger,
    )
    .context("cannot start the node loop")?;
    let waker = node.waker();
    if let Some(listener) = metrics_listener {
        metrics::spawn(listener, config.id, requests_tx.clone(), waker.clone(), logger.clone())?;
    }
    info!(logger, "fencelockd serving"; "node_id" => config.id, "clients" => %config.client_addr,
        "peers" => %own_peer_addr, "data_dir" => %config.data_dir.display());
    if let Some(access) = &config.access {
        info!(logger, "TLS users authorized"; "rules" => access.rule_count(), "admins" => access.admin_count());
    }
    for (name, addr) in &config.exposed {
        warn!(logger, "serving plain TCP beyond loopback (--insecure): anyone who reaches this address can act \
                       as a peer or a client";
            "address" => %addr, "which" => *name);
    }

    if let Some(endpoints) = &config.join {
        join::spawn_promoter(config, endpoints.clone(), Arc::clone(&stop), logger.clone())?;
    }

    let (signal_tx, signal_rx) = bounded(4);
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ])
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
    let mut systemd = SystemdNotifier::default();
    loop {
        select! {
            recv(signal_rx) -> signal => {
                let signal = signal.unwrap_or_default();
                if signal == signal_hook::consts::SIGHUP {
                    reload_certificates(config, tls.as_ref(), logger);
                    continue;
                }
                info!(logger, "shutting down"; "signal" => signal);
                break;
            }
            recv(poll) -> _ => {
                if node.is_finished() {
                    break;
                }
                systemd.poll(&requests_tx, &waker, logger);
            }
        }
    }
    systemd.stopping();

    if !node.is_finished() {
        hand_off(&requests_tx, &waker, logger);
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
    let outcome = outcome.ok_or_else(|| anyhow::anyhow!("the node loop ended without a word"))?;
    if let Err(err @ FatalError::MemberElsewhere { .. }) = outcome {
        // What to run instead, with the endpoints the cluster announced.
        let strangers = hello_book.strangers();
        let endpoints: Vec<&str> =
            strangers.values().map(|(_, addr)| addr.as_str()).filter(|addr| !addr.is_empty()).collect();
        let join = match endpoints.is_empty() {
            true => "--join and the cluster's client endpoints".to_owned(),
            false => format!("--join {}", endpoints.join(",")),
        };
        return Err(anyhow::Error::new(err).context(format!(
            "not founding a cluster: start this node again with {join} (its data directory holds no raft state yet)"
        )));
    }
    let stats = outcome.context("the driver stopped on a fatal error")?;
    info!(logger, "fencelockd stopped"; "entries_applied" => stats.entries_applied, "syncs" => stats.syncs);
    Ok(())
}

/// The TLS configurations the node's ports take new connections with,
/// replaced together by a reload.
struct TlsConfigs {
    peer_accept: Reloadable<rustls::ServerConfig>,
    peer_dial: Reloadable<rustls::ClientConfig>,
    clients: Reloadable<rustls::ServerConfig>,
}

impl TlsConfigs {
    fn load(dir: &std::path::Path, id: u64) -> Result<TlsConfigs, fencelock_tls::CertError> {
        let loaded = fencelock_tls::node_tls(&fencelock_tls::Layout::new(dir), id)?;
        Ok(TlsConfigs {
            peer_accept: Reloadable::new(loaded.peer_server),
            peer_dial: Reloadable::new(loaded.peer_client),
            clients: Reloadable::new(loaded.client_server),
        })
    }
}

/// SIGHUP: reads the certificates again (`ca.crt`, which may hold two CAs
/// during a rotation, and this node's pair), checked as at start, and
/// serves new connections with them; open connections keep theirs. A file
/// that fails the checks changes nothing: the node serves on with what it
/// had, and says why.
fn reload_certificates(config: &ServerConfig, tls: Option<&TlsConfigs>, logger: &Logger) {
    let (Some(dir), Some(tls)) = (&config.certs_dir, tls) else {
        info!(logger, "SIGHUP: nothing to reload (no --certs-dir)");
        return;
    };
    match fencelock_tls::node_tls(&fencelock_tls::Layout::new(dir), config.id) {
        Ok(loaded) => {
            tls.peer_accept.replace(loaded.peer_server);
            tls.peer_dial.replace(loaded.peer_client);
            tls.clients.replace(loaded.client_server);
            info!(logger, "certificates reloaded"; "dir" => %dir.display(), "not_after" => %loaded.not_after);
        }
        Err(err) => {
            error!(logger, "certificate reload failed: serving on with the certificates loaded before";
                "error" => %err);
        }
    }
}

/// Tells systemd (`Type=notify`, through `$NOTIFY_SOCKET`; nothing without
/// it) when the node serves: `READY=1` once it is ready as `GET /ready`
/// says (started, a leader known, caught up), with `STATUS=` lines saying
/// what it waits for until then, and `STOPPING=1` when it stops.
#[derive(Default)]
struct SystemdNotifier {
    ready: bool,
    status: String,
}

impl SystemdNotifier {
    fn poll(&mut self, requests: &Sender<Request>, waker: &LoopWaker, logger: &Logger) {
        if self.ready || std::env::var_os("NOTIFY_SOCKET").is_none() {
            return;
        }
        let (tx, rx) = bounded(1);
        if requests.send(Request::Metrics { reply: tx }).is_err() {
            return;
        }
        waker.wake();
        let Ok((status, _)) = rx.recv_timeout(Duration::from_secs(1)) else { return };
        let (ready, line) = match metrics::readiness(&status) {
            Ok(()) => (true, "serving".to_owned()),
            Err(why) => (false, format!("not ready: {why}")),
        };
        let mut states = Vec::new();
        if line != self.status {
            states.push(sd_notify::NotifyState::Status(&line));
        }
        if ready {
            states.push(sd_notify::NotifyState::Ready);
        }
        if states.is_empty() {
            return;
        }
        match sd_notify::notify(false, &states) {
            Ok(()) => {
                self.ready = ready;
                self.status = line;
                if ready {
                    info!(logger, "told systemd the node is ready");
                }
            }
            Err(err) => warn!(logger, "cannot notify systemd"; "error" => %err),
        }
    }

    fn stopping(&self) {
        if std::env::var_os("NOTIFY_SOCKET").is_some() {
            let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
        }
    }
}

/// How long a stopping leader waits to see another voter lead after it
/// handed leadership over: raft-rs gives a transfer an election timeout.
const HAND_OFF_WAIT: Duration = Duration::from_secs(3);

/// A stopping leader hands leadership to the most caught-up voter and waits
/// (at most [`HAND_OFF_WAIT`]) until it no longer leads, so that a rolling
/// restart costs no election timeout; meanwhile it serves on, answering
/// clients with the new leader once there is one. A follower stops at once.
fn hand_off(requests: &Sender<Request>, waker: &LoopWaker, logger: &Logger) {
    let (tx, rx) = bounded(1);
    if requests.send(Request::HandOff { reply: tx }).is_err() {
        return;
    }
    waker.wake();
    let Ok(Some(to)) = rx.recv_timeout(Duration::from_secs(1)) else { return };
    let started = Instant::now();
    while started.elapsed() < HAND_OFF_WAIT {
        let (tx, rx) = bounded(1);
        if requests.send(Request::Status { reply: tx }).is_err() {
            return;
        }
        waker.wake();
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(status)
                if status.role != fencelock_raft::Role::Leader
                    && status.leader.is_some_and(|leader| leader != status.id) =>
            {
                info!(logger, "leadership handed over"; "to" => to.0,
                    "leader" => status.leader.map_or(0, |leader| leader.0),
                    "took_ms" => started.elapsed().as_millis() as u64);
                return;
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => return,
        }
    }
    warn!(logger, "leadership was not handed over in time: stopping as leader (the cluster elects another)";
        "to" => to.0, "waited_ms" => HAND_OFF_WAIT.as_millis() as u64);
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
