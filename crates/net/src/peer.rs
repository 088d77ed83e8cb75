//! The peer transport: TCP between nodes, one outgoing connection per peer.
//!
//! Each peer has a bounded outbound queue, fed directly by the
//! [`PeerOutbox`] the caller sends through, and a writer thread that sends
//! everything queued in one write, reconnecting with backoff. A full queue
//! drops the message: raft retransmits, and a dead or slow peer never blocks
//! the sender. Incoming connections open with a [`PeerHello`]; every frame
//! after it is one message for the inbound channel. A connection that sends
//! anything malformed is closed; the rest carry on.

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use fencelock_types::client_pb::PeerHello;
use protobuf::Message;
use slog::{debug, info, warn, Logger};

use crate::frame::{encode_frame, read_frame, FrameError};

/// Settings of the peer transport.
#[derive(Clone, Debug)]
pub struct PeerConfig {
    pub node_id: u64,
    /// Where this node listens for peers.
    pub listen_addr: SocketAddr,
    /// Every other node's peer address.
    pub peers: BTreeMap<u64, SocketAddr>,
    /// This node's client address, announced to peers in the hello.
    pub client_addr: String,
    /// Messages queued per peer before new ones are dropped.
    pub queue_max: usize,
    /// The largest frame accepted from a peer (snapshots travel as frames).
    pub frame_bytes_max: usize,
    /// The most frames written in one write.
    pub batch_max: usize,
    pub reconnect_backoff_min: Duration,
    pub reconnect_backoff_max: Duration,
}

/// The client addresses that peers announced in their hellos, by node id.
#[derive(Clone, Debug)]
pub struct ClientAddrs(Arc<RwLock<BTreeMap<u64, String>>>);

impl ClientAddrs {
    pub fn get(&self, id: u64) -> Option<String> {
        self.0.read().ok()?.get(&id).cloned()
    }
}

/// A running peer transport.
#[derive(Debug)]
pub struct PeerTransport {
    /// Client addresses that peers announced, by node id.
    client_addrs: Arc<RwLock<BTreeMap<u64, String>>>,
    local_addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl PeerTransport {
    /// Starts listening and connecting. Messages sent through the returned
    /// [`PeerOutbox`] go to the peer `recipient` names; messages from peers
    /// go into `inbound`.
    pub fn start<M: Message>(
        config: PeerConfig,
        recipient: fn(&M) -> u64,
        inbound: Sender<M>,
        logger: &Logger,
    ) -> std::io::Result<(PeerTransport, PeerOutbox<M>)> {
        let listener = TcpListener::bind(config.listen_addr)?;
        let local_addr = listener.local_addr()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let client_addrs = Arc::new(RwLock::new(BTreeMap::new()));
        let logger = logger.new(slog::o!("node_id" => config.node_id));
        let mut threads = Vec::new();

        let mut queues = BTreeMap::new();
        for (&peer, &addr) in &config.peers {
            let (tx, rx) = bounded::<M>(config.queue_max);
            queues.insert(peer, tx);
            let writer = PeerWriter {
                addr,
                hello: PeerHello {
                    node_id: config.node_id,
                    client_addr: config.client_addr.clone(),
                    ..Default::default()
                },
                queue: rx,
                config: config.clone(),
                stopping: Arc::clone(&stopping),
                logger: logger.new(slog::o!("peer" => peer)),
            };
            threads.push(spawn_named(format!("fencelock-peer-out-{peer}"), move || writer.run())?);
        }
        let outbox = PeerOutbox { queues: Arc::new(queues), recipient };

        let acceptor = Acceptor {
            listener,
            inbound,
            frame_bytes_max: config.frame_bytes_max,
            client_addrs: Arc::clone(&client_addrs),
            stopping: Arc::clone(&stopping),
            logger: logger.clone(),
        };
        threads.push(spawn_named("fencelock-peer-accept".into(), move || acceptor.run())?);
        info!(logger, "peer transport listening"; "addr" => %local_addr);
        Ok((PeerTransport { client_addrs, local_addr, stopping, threads }, outbox))
    }

    /// The client address node `id` announced, once it has connected.
    pub fn client_addr(&self, id: u64) -> Option<String> {
        self.client_addrs().get(id)
    }

    /// A handle on the client addresses peers announce, for other threads.
    pub fn client_addrs(&self) -> ClientAddrs {
        ClientAddrs(Arc::clone(&self.client_addrs))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting and connecting. The writer threads end once every
    /// clone of the [`PeerOutbox`] is gone.
    pub fn stop(self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wake the acceptor, which blocks in accept().
        let _ = TcpStream::connect_timeout(&self.local_addr, Duration::from_millis(200));
        drop(self.threads);
    }
}

/// Sends messages to peers: each goes straight into its peer's queue, from
/// the sender's own thread. Cheap to clone.
#[derive(Debug)]
pub struct PeerOutbox<M> {
    queues: Arc<BTreeMap<u64, Sender<M>>>,
    recipient: fn(&M) -> u64,
}

impl<M> Clone for PeerOutbox<M> {
    fn clone(&self) -> PeerOutbox<M> {
        PeerOutbox { queues: Arc::clone(&self.queues), recipient: self.recipient }
    }
}

impl<M> PeerOutbox<M> {
    /// Queues `message` for its peer without blocking. False when it was
    /// dropped: the queue is full, the transport stopped, or the recipient
    /// is not a peer.
    pub fn send(&self, message: M) -> bool {
        let to = (self.recipient)(&message);
        self.queues.get(&to).is_some_and(|queue| queue.try_send(message).is_ok())
    }
}

fn spawn_named(name: String, body: impl FnOnce() + Send + 'static) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name).spawn(body)
}

struct PeerWriter<M> {
    addr: SocketAddr,
    hello: PeerHello,
    queue: Receiver<M>,
    config: PeerConfig,
    stopping: Arc<AtomicBool>,
    logger: Logger,
}

impl<M: Message> PeerWriter<M> {
    fn run(self) {
        let mut backoff = self.config.reconnect_backoff_min;
        while !self.stopping.load(Ordering::SeqCst) {
            match self.connect() {
                Ok(stream) => {
                    info!(self.logger, "connected to peer"; "addr" => %self.addr);
                    backoff = self.config.reconnect_backoff_min;
                    match self.send_until_error(stream) {
                        Ok(()) => return,
                        Err(err) => warn!(self.logger, "peer connection lost"; "error" => %err),
                    }
                }
                Err(err) => debug!(self.logger, "cannot reach peer"; "addr" => %self.addr, "error" => %err),
            }
            // Messages queued while the peer is unreachable are stale; raft
            // sends fresh ones.
            while self.queue.try_recv().is_ok() {}
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(self.config.reconnect_backoff_max);
        }
    }

    fn connect(&self) -> std::io::Result<TcpStream> {
        let mut stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1))?;
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(Duration::from_secs(5)))?;
        let mut buffer = Vec::new();
        encode_frame(&self.hello, &mut buffer);
        stream.write_all(&buffer)?;
        Ok(stream)
    }

    /// Sends until the queue closes (`Ok`) or the connection fails.
    fn send_until_error(&self, mut stream: TcpStream) -> std::io::Result<()> {
        let mut buffer = Vec::new();
        loop {
            let first = match self.queue.recv_timeout(Duration::from_millis(200)) {
                Ok(message) => message,
                Err(RecvTimeoutError::Timeout) if self.stopping.load(Ordering::SeqCst) => return Ok(()),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            };
            buffer.clear();
            encode_frame(&first, &mut buffer);
            for message in self.queue.try_iter().take(self.config.batch_max) {
                encode_frame(&message, &mut buffer);
            }
            stream.write_all(&buffer)?;
        }
    }
}

struct Acceptor<M> {
    listener: TcpListener,
    inbound: Sender<M>,
    frame_bytes_max: usize,
    client_addrs: Arc<RwLock<BTreeMap<u64, String>>>,
    stopping: Arc<AtomicBool>,
    logger: Logger,
}

impl<M: Message> Acceptor<M> {
    fn run(self) {
        for stream in self.listener.incoming() {
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let stream = match stream {
                Ok(stream) => stream,
                Err(err) => {
                    warn!(self.logger, "accepting a peer failed"; "error" => %err);
                    continue;
                }
            };
            let reader = PeerReader {
                inbound: self.inbound.clone(),
                frame_bytes_max: self.frame_bytes_max,
                client_addrs: Arc::clone(&self.client_addrs),
                logger: self.logger.clone(),
            };
            let spawned = spawn_named("fencelock-peer-in".into(), move || reader.run(stream));
            if let Err(err) = spawned {
                warn!(self.logger, "cannot start a peer reader"; "error" => %err);
            }
        }
    }
}

struct PeerReader<M> {
    inbound: Sender<M>,
    frame_bytes_max: usize,
    client_addrs: Arc<RwLock<BTreeMap<u64, String>>>,
    logger: Logger,
}

impl<M: Message> PeerReader<M> {
    fn run(self, stream: TcpStream) {
        let remote = stream.peer_addr().map(|addr| addr.to_string()).unwrap_or_default();
        let mut reader = BufReader::new(stream);
        let hello: PeerHello = match read_frame(&mut reader, 64 * 1024) {
            Ok(hello) => hello,
            Err(err) => {
                warn!(self.logger, "closing peer connection: bad hello"; "remote" => remote, "error" => %err);
                return;
            }
        };
        if let Ok(mut addrs) = self.client_addrs.write() {
            addrs.insert(hello.node_id, hello.client_addr.clone());
        }
        let peer = hello.node_id;
        loop {
            match read_frame::<M>(&mut reader, self.frame_bytes_max) {
                Ok(message) => {
                    if self.inbound.send(message).is_err() {
                        return;
                    }
                }
                Err(FrameError::Closed) => return,
                Err(err) => {
                    warn!(self.logger, "closing peer connection"; "peer" => peer, "remote" => remote, "error" => %err);
                    return;
                }
            }
        }
    }
}
