//! The node loop: one thread that serves a node's client connections and
//! its peer connections and runs the node's [`Core`] (the server's raft
//! driver) between rounds of socket events.
//!
//! Why one thread: a request's commit crosses the leader and a follower and
//! back, and every hand-off between threads on the way costs a wake-up,
//! tens of microseconds on a virtual machine whose idle cores halt. Here a
//! peer's message is decoded and stepped, and the messages it causes are
//! written, on the thread that read it; responses are written on the
//! thread that applied their entries.
//!
//! This module starts it: [`NodeLoop`] binds (or takes) its two
//! [`Listeners`] and runs the client listener's event loop (`client.rs`)
//! with the node's peer side (`peers.rs`) and core, on a thread named
//! `fencelock-node`.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use mio::Interest;
use protobuf::Message;
use slog::{info, Logger};

use crate::client::{ClientConfig, Core, EventLoop, Handler};
use crate::peers::{ClientAddrs, PeerConfig, Peers, Route};
use crate::shared::{LoopShared, LoopWaker};

/// A running node loop.
#[derive(Debug)]
pub struct NodeLoop {
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
    shared: Arc<LoopShared>,
    thread: JoinHandle<()>,
}

impl NodeLoop {
    /// Binds the client and peer listeners and starts the loop on a thread
    /// named `fencelock-node`. `route` reads a message's sender and
    /// recipient: messages go to their recipient's connection, and an
    /// incoming connection whose messages are not from the node its hello
    /// named, or not for this node, is closed. Client requests go to
    /// `handler`; `make_core` builds the core, given a waker for other
    /// threads. Peers' announced client addresses are recorded in
    /// `client_addrs`.
    pub fn start<M: Message>(
        clients: ClientConfig,
        peers: PeerConfig,
        route: fn(&M) -> Route,
        handler: Arc<dyn Handler>,
        make_core: impl FnOnce(LoopWaker) -> Box<dyn Core<M>>,
        client_addrs: ClientAddrs,
        logger: &Logger,
    ) -> io::Result<NodeLoop> {
        let listeners = Listeners::bind(clients.listen_addr, peers.listen_addr)
            .map_err(|err| io::Error::new(err.source.kind(), err.to_string()))?;
        NodeLoop::start_on(listeners, clients, peers, route, handler, make_core, client_addrs, logger)
    }

    /// [`NodeLoop::start`] on listeners bound before (the addresses in the
    /// configurations are not bound again).
    #[allow(clippy::too_many_arguments)]
    pub fn start_on<M: Message>(
        listeners: Listeners,
        clients: ClientConfig,
        peers: PeerConfig,
        route: fn(&M) -> Route,
        handler: Arc<dyn Handler>,
        make_core: impl FnOnce(LoopWaker) -> Box<dyn Core<M>>,
        client_addrs: ClientAddrs,
        logger: &Logger,
    ) -> io::Result<NodeLoop> {
        let logger = logger.new(slog::o!("node_id" => peers.node_id));
        let Listeners { client, peer } = listeners;
        let mut event_loop = EventLoop::<M>::bind(clients, client, handler, &logger)?;
        let client_addr = event_loop.local_addr()?;
        let mut listener = peer;
        let peer_addr = listener.local_addr()?;
        event_loop.poll.registry().register(
            &mut listener,
            crate::client::PEER_LISTENER,
            Interest::READABLE,
        )?;
        let shared = Arc::clone(&event_loop.shared);
        event_loop.core = Some(make_core(LoopWaker(Arc::clone(&shared))));
        let waker = LoopWaker(Arc::clone(&shared));
        event_loop.peers = Some(Peers::new(peers, listener, route, client_addrs, waker, logger.clone()));
        info!(logger, "node listening"; "clients" => %client_addr, "peers" => %peer_addr);
        let loop_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new().name("fencelock-node".into()).spawn(move || {
            let _ = loop_shared.loop_thread.set(std::thread::current().id());
            event_loop.run();
        })?;
        Ok(NodeLoop { client_addr, peer_addr, shared, thread })
    }

    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    pub fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    pub fn waker(&self) -> LoopWaker {
        LoopWaker(Arc::clone(&self.shared))
    }

    /// Stops accepting new clients and closes the client listening socket;
    /// open connections and peers carry on.
    pub fn stop_accepting(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = self.shared.waker.wake();
    }

    /// True once the loop ended (its core asked it to stop).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits for the loop to end; `Err` if its thread panicked.
    pub fn join(self) -> std::thread::Result<()> {
        self.thread.join()
    }
}

/// A node's two listening sockets, bound before anything else happens at
/// start (before its data directory is written, or it asks a cluster to
/// add it): a port in use is found while nothing has been done yet.
#[derive(Debug)]
pub struct Listeners {
    client: mio::net::TcpListener,
    peer: mio::net::TcpListener,
}

/// A listening address that cannot be bound, named.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for {which} on {addr}: {source}")]
pub struct BindError {
    /// `clients` or `peers`.
    pub which: &'static str,
    pub addr: SocketAddr,
    #[source]
    pub source: io::Error,
}

impl Listeners {
    /// Binds the client and the peer listener, in that order.
    pub fn bind(client_addr: SocketAddr, peer_addr: SocketAddr) -> Result<Listeners, BindError> {
        let bind = |which, addr| {
            crate::client::bind_listener(addr).map_err(|source| BindError { which, addr, source })
        };
        Ok(Listeners { client: bind("clients", client_addr)?, peer: bind("peers", peer_addr)? })
    }

    /// The addresses bound (a port 0 asked for is a real one here).
    pub fn local_addrs(&self) -> io::Result<(SocketAddr, SocketAddr)> {
        Ok((self.client.local_addr()?, self.peer.local_addr()?))
    }
}
