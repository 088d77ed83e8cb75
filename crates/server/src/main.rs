//! fencelockd: one node of a fencelock cluster.
//!
//! A thin binary. It reads the configuration, builds the logger, opens the
//! raft driver on its data directory, and joins it to the network layer
//! with bounded crossbeam channels: peer messages in and out through the
//! peer transport, client requests through the client listener and
//! [`handler::ClientHandler`]. On SIGINT or SIGTERM it stops accepting
//! clients, lets what is in flight finish, and stops the driver, whose every
//! write was already synced.

mod config;
mod handler;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use crossbeam_channel::{bounded, select, tick};
use fencelock_net::{ClientAddrs, ClientConfig, ClientListener, PeerConfig, PeerOutbox, PeerTransport};
use fencelock_raft::shell::{self, Channels, MonotonicClock, PeerSink, Request, ShellConfig};
use fencelock_raft::{AsyncEngineStore, EngineStore, Replica};
use raft::prelude::Message;
use slog::{crit, info, o, Drain, Logger};

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

/// The driver's messages go straight into the transport's peer queues.
struct OutboxSink(PeerOutbox<Message>);

impl PeerSink for OutboxSink {
    fn send(&self, message: Message) {
        // A dropped message is sent again by raft.
        self.0.send(message);
    }
}

struct PeerDirectory(ClientAddrs);

impl Directory for PeerDirectory {
    fn client_addr(&self, id: u64) -> Option<String> {
        self.0.get(id)
    }
}

fn run(config: &ServerConfig, logger: &Logger) -> Result<()> {
    let raft_dir = config.data_dir.join("raft");
    std::fs::create_dir_all(&raft_dir).with_context(|| format!("cannot create {}", raft_dir.display()))?;
    let store = EngineStore::open(&raft_dir)
        .with_context(|| format!("cannot open the raft log in {}", raft_dir.display()))?;
    let (requests_tx, requests_rx) = bounded(config.max_in_flight.max(1024) * 4);
    let (peers_in_tx, peers_in_rx) = bounded::<Message>(65_536);
    let (stop_tx, stop_rx) = bounded(1);

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
        queue_max: 4_096,
        frame_bytes_max: 256 << 20,
        batch_max: 1_024,
        reconnect_backoff_min: Duration::from_millis(20),
        reconnect_backoff_max: Duration::from_secs(1),
    };
    let (transport, outbox) =
        PeerTransport::start(peer_config, |message: &Message| message.to, peers_in_tx, logger)
            .with_context(|| format!("cannot listen for peers on {own_peer_addr}"))?;

    // Writes and syncs happen on their own thread, so that the driver goes
    // on stepping and proposing while the disk syncs; that thread also sends
    // the votes and acknowledgements that wait for its syncs.
    let (store, persisted) =
        AsyncEngineStore::spawn(store, "fencelock-raft-io".into(), Box::new(OutboxSink(outbox.clone())))
            .with_context(|| format!("cannot recover the raft log in {}", raft_dir.display()))?;
    let replica = Replica::open(config.driver.clone(), store, logger).context("cannot open the replica")?;

    let channels = Channels {
        requests: requests_rx,
        peers_in: peers_in_rx,
        peers_out: Box::new(OutboxSink(outbox)),
        stop: stop_rx,
        persisted,
    };
    let shell_config = ShellConfig { tick_interval: config.tick, drain_max: 4_096 };
    let driver = shell::spawn(replica, MonotonicClock::new(), shell_config, channels, logger)
        .context("cannot start the driver")?;

    let identity = Identity {
        node_id: config.id,
        client_addr: config.client_addr,
        peers: config.peers.clone(),
        directory: Arc::new(PeerDirectory(transport.client_addrs())),
    };
    let handler = Arc::new(ClientHandler { driver: requests_tx.clone(), identity: Arc::new(identity) });
    let client_config = ClientConfig {
        listen_addr: config.client_addr,
        connections_max: config.max_connections,
        in_flight_max: config.max_in_flight,
        frame_bytes_max: config.max_frame_bytes,
    };
    let listener = ClientListener::start(client_config, handler, logger)
        .with_context(|| format!("cannot listen for clients on {}", config.client_addr))?;
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

    // Wait for a signal, or for the driver to stop on its own (a fatal error).
    let poll = tick(Duration::from_millis(100));
    loop {
        select! {
            recv(signal_rx) -> signal => {
                info!(logger, "shutting down"; "signal" => signal.unwrap_or_default());
                break;
            }
            recv(poll) -> _ => {
                if driver.is_finished() {
                    break;
                }
            }
        }
    }

    listener.stop_accepting();
    let deadline = Instant::now() + SHUTDOWN_GRACE;
    while Instant::now() < deadline && !driver.is_finished() && pending_requests(&requests_tx) > 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = stop_tx.send(());
    let outcome = driver.join().map_err(|_| anyhow::anyhow!("the driver thread panicked"))?;
    transport.stop();
    let stats = outcome.context("the driver stopped on a fatal error")?;
    info!(logger, "fencelockd stopped"; "entries_applied" => stats.entries_applied, "syncs" => stats.syncs);
    Ok(())
}

/// Requests the driver has accepted and not answered, 0 if it is gone.
fn pending_requests(requests: &crossbeam_channel::Sender<Request>) -> usize {
    let (tx, rx) = bounded(1);
    if requests.send(Request::Status { reply: tx }).is_err() {
        return 0;
    }
    rx.recv_timeout(Duration::from_secs(1)).map_or(0, |status| status.pending_requests)
}
