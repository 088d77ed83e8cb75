//! The peer side of a node loop ([`Peers`], run by the event loop of
//! `client.rs` between its client connections; `node.rs` starts it), and
//! what it is configured and tells the core with: [`PeerConfig`],
//! [`PeerBook`], [`Greetings`], [`ClientAddrs`].
//!
//! One outgoing connection per peer, opened without
//! blocking and reopened with backoff, carrying this node's messages after
//! a [`PeerHello`]; incoming connections open with a hello from a
//! configured peer and carry that peer's messages for this node, and
//! nothing else. A peer's unsent output is bounded: past the bound new
//! messages are dropped (raft sends again), so a stopped peer costs bounded
//! memory and never blocks the loop. A connection that sends anything
//! malformed is closed; the rest carry on.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use ahash::RandomState;
use fencelock_types::client_pb::PeerHello;
use fencelock_types::hello::{HelloState, PeerReport};
use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};
use protobuf::Message;
use slog::{debug, info, warn, Logger};

use crate::frame::{decode_frame, decode_piece, encode_frame, encode_parts};
use crate::shared::LoopWaker;
use crate::wire::{Got, Reloadable, Wire};

/// Incoming peer connections beyond two per peer, for those that have not
/// said their hello yet.
const INCOMING_UNNAMED_MAX: usize = 8;

/// The largest hello accepted from a peer.
const HELLO_BYTES_MAX: usize = 64 * 1024;
/// How long an incoming peer connection may take to say its hello (its
/// TLS handshake included; in unit tests, a moment).
pub const HELLO_TIMEOUT: Duration =
    if cfg!(test) { Duration::from_millis(2_000) } else { Duration::from_secs(5) };
/// How long an outgoing connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Peer connection tokens start here, far above any client connection's.
const FIRST_PEER_TOKEN: usize = usize::MAX / 2;
/// The most bytes read from one peer connection in one round of the loop
/// (a snapshot arrives over several rounds, with the core's turns between).
/// One read's worth in tests, so that a burst is sure to take several.
const PEER_BYTES_PER_ROUND: usize = if cfg!(test) { 64 * 1024 } else { 1 << 20 };

/// Messages to peers over this many bytes (snapshots) are sent in parts of
/// this size, each one frame: peers take frames of up to
/// [`PeerConfig::frame_bytes_max`], which must be at least this.
pub const PART_BYTES: usize = if cfg!(test) { 512 } else { 8 << 20 };

/// Messages to peers over this many bytes (snapshots) are encoded on a
/// thread of their own, one per peer at a time (a second one meanwhile is
/// dropped; raft sends again).
const ENCODE_ELSEWHERE_BYTES: usize = if cfg!(test) { 8 * 1024 } else { 8 << 20 };

/// Settings of the peer side of a node loop.
#[derive(Clone, Debug)]
pub struct PeerConfig {
    pub node_id: u64,
    /// Where this node listens for peers.
    pub listen_addr: SocketAddr,
    /// Every other node's peer address, changed as the membership changes.
    pub peers: PeerBook,
    /// This node's client address, announced to peers in the hello.
    pub client_addr: String,
    /// The largest frame accepted from a peer. A larger message (a
    /// snapshot) travels in parts of [`PART_BYTES`] (see `frame`).
    pub frame_bytes_max: usize,
    /// The largest message accepted from a peer, parts put together: what
    /// bounds the snapshot a follower can take.
    pub message_bytes_max: usize,
    /// Unsent bytes queued for one peer past which new messages to it are
    /// dropped (one message is always taken into an empty queue).
    pub output_bytes_max: usize,
    pub reconnect_backoff_min: Duration,
    pub reconnect_backoff_max: Duration,
    /// What the hellos say, both ways (see [`Greetings`]).
    pub greetings: Greetings,
    /// Sizes up a peer's message from its bytes before it is decoded: an
    /// `Err` (why) closes the connection without decoding it, so that a
    /// message that would decode into far more memory than its bytes
    /// (millions of empty entries) never does. The server passes the
    /// node's `scan::peer_message`.
    pub precheck: fn(&[u8]) -> Result<(), String>,
    /// TLS between peers; `None`: plain TCP.
    pub tls: Option<PeerTls>,
}

/// The other nodes' peer addresses (`HOST:PORT`; a host name is resolved
/// again at every connection, off the loop's thread), shared with whoever
/// changes the membership: the loop connects to added peers, drops removed
/// ones and reconnects to moved ones at its next round.
#[derive(Clone, Debug, Default)]
pub struct PeerBook(Arc<RwLock<BookInner>>);

#[derive(Debug, Default)]
struct BookInner {
    version: u64,
    peers: BTreeMap<u64, String>,
    /// Nodes of this cluster that the configuration behind `peers` does
    /// not name (added since), learned from their hellos: at most
    /// [`LEARNED_MAX`], until a configuration names them.
    learned: BTreeMap<u64, String>,
}

/// The most peers a book learns from hellos ([`PeerBook::learn`]).
const LEARNED_MAX: usize = 16;

impl PeerBook {
    pub fn new(peers: BTreeMap<u64, String>) -> PeerBook {
        PeerBook(Arc::new(RwLock::new(BookInner { version: 1, peers, learned: BTreeMap::new() })))
    }

    /// Replaces the addresses (a no-op when they are the same). Learned
    /// peers that the new addresses name are forgotten as learned.
    pub fn set(&self, peers: BTreeMap<u64, String>) {
        let mut inner = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if inner.peers != peers {
            inner.learned.retain(|id, _| !peers.contains_key(id));
            inner.peers = peers;
            inner.version += 1;
        }
    }

    /// Adds a node of this cluster that the configuration this node
    /// applied does not name yet, at the peer address its hello gave, so
    /// that this node can answer it (it leads a configuration this node
    /// missed). Bounded: past [`LEARNED_MAX`], nothing more is learned.
    pub fn learn(&self, id: u64, addr: &str) {
        let mut inner = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if addr.is_empty()
            || inner.peers.contains_key(&id)
            || inner.learned.get(&id).is_some_and(|at| at == addr)
        {
            return;
        }
        if inner.learned.len() >= LEARNED_MAX && !inner.learned.contains_key(&id) {
            return;
        }
        inner.learned.insert(id, addr.to_owned());
        inner.version += 1;
    }

    /// The peers to connect to: the configuration's and the learned.
    pub fn get(&self) -> BTreeMap<u64, String> {
        let inner = self.0.read().unwrap_or_else(PoisonError::into_inner);
        let mut all = inner.learned.clone();
        all.extend(inner.peers.iter().map(|(id, addr)| (*id, addr.clone())));
        all
    }

    pub fn contains(&self, id: u64) -> bool {
        let inner = self.0.read().unwrap_or_else(PoisonError::into_inner);
        inner.peers.contains_key(&id) || inner.learned.contains_key(&id)
    }

    fn len(&self) -> usize {
        self.0.read().unwrap_or_else(PoisonError::into_inner).peers.len()
    }

    fn version(&self) -> u64 {
        self.0.read().unwrap_or_else(PoisonError::into_inner).version
    }
}

/// How long a host name may take to resolve before the attempt counts as
/// failed (the lookup's thread may linger; its answer is then ignored).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS configurations of a node's peer side (from
/// `fencelock_tls::NodeTls`).
#[derive(Clone, Debug)]
pub struct PeerTls {
    /// Accepts peers: node certificates of the cluster's CA only.
    pub accept: Reloadable<rustls::ServerConfig>,
    /// Dials peers, asking each for its own node name.
    pub dial: Reloadable<rustls::ClientConfig>,
}

/// Who sends a peer message and who it is for, read from the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub from: u64,
    pub to: u64,
}

/// The client addresses that peers announced in their hellos, by node id.
#[derive(Clone, Debug)]
pub struct ClientAddrs(Arc<RwLock<BTreeMap<u64, String>>>);

impl ClientAddrs {
    pub fn get(&self, id: u64) -> Option<String> {
        self.0.read().ok()?.get(&id).cloned()
    }

    /// An empty directory, for a node loop to fill in.
    pub fn new() -> ClientAddrs {
        ClientAddrs(Arc::new(RwLock::new(BTreeMap::new())))
    }

    fn insert(&self, id: u64, addr: String) {
        if let Ok(mut addrs) = self.0.write() {
            addrs.insert(id, addr);
        }
    }

    fn remove(&self, id: u64) {
        if let Ok(mut addrs) = self.0.write() {
            addrs.remove(&id);
        }
    }
}

impl Default for ClientAddrs {
    fn default() -> ClientAddrs {
        ClientAddrs::new()
    }
}

/// What this node says of itself in the hello it opens each peer
/// connection with, and what each peer said in the last hello it sent
/// here. The core keeps the first up to date; a hello is built from it
/// when a connection opens, so it says what was true then.
#[derive(Clone, Debug, Default)]
pub struct Greetings(Arc<RwLock<GreetingsInner>>);

#[derive(Debug, Default)]
struct GreetingsInner {
    /// What the node says of its raft state, as it built it: carried, not
    /// read.
    own: HelloState,
    /// This node's cluster id, empty until it knows one.
    cluster_id: Vec<u8>,
    /// Where this node's peers reach it, as its hellos say.
    peer_addr: String,
    heard: BTreeMap<u64, PeerReport>,
    /// Nodes outside this node's peers whose hellos named a cluster while
    /// this node knew none (a running cluster that added it), with what
    /// they said and the client address each said it serves on; at most
    /// [`STRANGERS_MAX`].
    strangers: BTreeMap<u64, (PeerReport, String)>,
    /// Bumped by every hello recorded, so that the loop feeds the node
    /// only what is new.
    hellos: u64,
}

/// The most strangers a node keeps ([`Greetings::strangers`]): one is
/// enough to know that a cluster runs.
const STRANGERS_MAX: usize = 8;

impl Greetings {
    pub fn new() -> Greetings {
        Greetings::default()
    }

    /// Sets what this node's hellos say of its raft state from now on,
    /// as the node built it ([`HelloState`]).
    pub fn set_own(&self, own: HelloState) {
        // A panic elsewhere while holding the lock leaves consistent data:
        // every write is a plain assignment. Never answer "unknown" for it.
        self.0.write().unwrap_or_else(PoisonError::into_inner).own = own;
    }

    /// Sets the cluster id this node's hellos name, once it knows it. From
    /// then on, a hello that names another cluster is refused.
    pub fn set_cluster_id(&self, cluster_id: &[u8]) {
        let mut inner = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if inner.cluster_id != cluster_id {
            inner.cluster_id = cluster_id.to_vec();
        }
    }

    fn cluster_id(&self) -> Vec<u8> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).cluster_id.clone()
    }

    fn is_named(&self) -> bool {
        !self.0.read().unwrap_or_else(PoisonError::into_inner).cluster_id.is_empty()
    }

    /// What each peer said in the last hello it sent here.
    pub fn heard(&self) -> BTreeMap<u64, PeerReport> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).heard.clone()
    }

    /// The nodes outside this node's peers whose hellos named a cluster
    /// while this node knew none, with what each said and the client
    /// address it announced: refused as peers, but a blank node must not
    /// found a cluster of its own while one that added it runs.
    pub fn strangers(&self) -> BTreeMap<u64, (PeerReport, String)> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).strangers.clone()
    }

    fn record_stranger(&self, hello: &PeerHello) {
        let mut inner = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if inner.strangers.len() < STRANGERS_MAX || inner.strangers.contains_key(&hello.node_id) {
            inner.strangers.insert(hello.node_id, (PeerReport::read(hello), hello.client_addr.clone()));
            inner.hellos += 1;
        }
    }

    /// Sets where this node's peers reach it, as its hellos say.
    pub fn set_peer_addr(&self, peer_addr: &str) {
        let mut inner = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if inner.peer_addr != peer_addr {
            inner.peer_addr = peer_addr.to_owned();
        }
    }

    /// How many hellos were recorded so far: a change says there is news
    /// in [`Greetings::heard`].
    pub fn hellos(&self) -> u64 {
        self.0.read().unwrap_or_else(PoisonError::into_inner).hellos
    }

    fn hello_for(&self, node_id: u64, client_addr: &str, peer: u64) -> PeerHello {
        let inner = self.0.read().unwrap_or_else(PoisonError::into_inner);
        let mut hello = PeerHello {
            node_id,
            client_addr: client_addr.to_owned(),
            cluster_id: inner.cluster_id.clone(),
            peer_addr: inner.peer_addr.clone(),
            ..Default::default()
        };
        inner.own.report_for(peer).write(&mut hello);
        hello
    }

    fn record(&self, peer: u64, hello: &PeerHello) {
        let heard = PeerReport::read(hello);
        let mut inner = self.0.write().unwrap_or_else(PoisonError::into_inner);
        inner.heard.insert(peer, heard);
        inner.hellos += 1;
    }
}

/// Bytes as lowercase hex, as cluster ids are shown.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The peer side of a node loop.
pub(crate) struct Peers<M> {
    config: PeerConfig,
    listener: TcpListener,
    route: fn(&M) -> Route,
    client_addrs: ClientAddrs,
    outgoing: BTreeMap<u64, Outgoing>,
    /// This node knew its cluster's id at the last check.
    named: bool,
    /// Repeated warnings, per kind and address.
    throttle: crate::throttle::Throttle,
    /// Outgoing connection tokens to their peer.
    by_token: HashMap<Token, u64, RandomState>,
    incoming: HashMap<Token, Incoming, RandomState>,
    next_token: usize,
    /// Peers with output to write.
    dirty: Vec<u64>,
    /// Incoming connections to read again next round: their budget ran out.
    again: Vec<Token>,
    scratch: Vec<u8>,
    /// Messages over [`PART_BYTES`] (snapshots) are encoded on a thread of
    /// their own, not the loop's: the peers with one being encoded, and
    /// where the encoded frames come back.
    encoding: BTreeSet<u64>,
    encoded_tx: crossbeam_channel::Sender<(u64, Vec<u8>)>,
    encoded: crossbeam_channel::Receiver<(u64, Vec<u8>)>,
    /// Wakes the loop when an encoding or a lookup is done.
    waker: LoopWaker,
    /// The version of the peer book the outgoing connections follow.
    book_version: u64,
    /// Host name lookups' answers: the peer, the attempt, the address.
    resolved_tx: crossbeam_channel::Sender<(u64, u64, io::Result<SocketAddr>)>,
    resolved: crossbeam_channel::Receiver<(u64, u64, io::Result<SocketAddr>)>,
    /// Draws the reconnect backoff's jitter.
    jitter: u64,
    logger: Logger,
}

struct Outgoing {
    /// `HOST:PORT`, as the peer book has it.
    addr: String,
    /// Counts connection attempts: a lookup's late answer names an old one.
    attempt: u64,
    link: Link,
    /// The hello of the current connection named this node's cluster.
    named: bool,
    /// When the peer's certificate on the current connection ends (TLS,
    /// once its handshake is done): the connection is closed then.
    expiry: Option<Instant>,
    /// Encoded frames; `output[written..]` is still to go.
    output: Vec<u8>,
    written: usize,
    backoff: Duration,
    logger: Logger,
}

impl Outgoing {
    /// A peer not connected yet, to connect to at once.
    fn new(peer: u64, addr: &str, config: &PeerConfig, logger: &Logger) -> Outgoing {
        Outgoing {
            addr: addr.to_owned(),
            attempt: 0,
            link: Link::Down { retry_at: Instant::now() },
            named: false,
            expiry: None,
            output: Vec::new(),
            written: 0,
            backoff: config.reconnect_backoff_min,
            logger: logger.new(slog::o!("peer" => peer)),
        }
    }
}

enum Link {
    Down {
        retry_at: Instant,
    },
    /// Waiting for the lookup of the peer's host name.
    Resolving {
        since: Instant,
    },
    Connecting {
        wire: Wire,
        token: Token,
        since: Instant,
    },
    Up {
        wire: Wire,
        token: Token,
        since: Instant,
    },
}

struct Incoming {
    wire: Wire,
    /// When it was accepted: its hello is due within [`HELLO_TIMEOUT`].
    since: Instant,
    /// Bytes read and not yet decoded: at most one partial frame.
    input: Vec<u8>,
    /// The parts of a message sent in parts, so far (see `frame`).
    parts: Vec<u8>,
    /// The peer, once its hello came.
    peer: Option<u64>,
    /// Its hello named a cluster.
    named: bool,
    /// When the peer's certificate ends (TLS): the connection is closed.
    expiry: Option<Instant>,
    remote: SocketAddr,
}

impl<M: Message> Peers<M> {
    pub(crate) fn new(
        config: PeerConfig,
        listener: TcpListener,
        route: fn(&M) -> Route,
        client_addrs: ClientAddrs,
        waker: LoopWaker,
        logger: Logger,
    ) -> Peers<M> {
        let (encoded_tx, encoded) = crossbeam_channel::unbounded();
        let (resolved_tx, resolved) = crossbeam_channel::unbounded();
        let jitter = {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new().build_hasher().finish() | 1
        };
        let mut peers = Peers {
            config,
            listener,
            route,
            client_addrs,
            outgoing: BTreeMap::new(),
            named: false,
            throttle: crate::throttle::Throttle::default(),
            by_token: HashMap::default(),
            incoming: HashMap::default(),
            next_token: FIRST_PEER_TOKEN,
            dirty: Vec::new(),
            again: Vec::new(),
            scratch: vec![0; 64 * 1024],
            encoding: BTreeSet::new(),
            encoded_tx,
            encoded,
            waker,
            book_version: 0,
            resolved_tx,
            resolved,
            jitter,
            logger,
        };
        peers.follow_book(None);
        peers
    }

    /// Brings the outgoing connections in line with the peer book: new
    /// peers are connected to at once, removed ones dropped, moved ones
    /// reconnected at their new address.
    fn follow_book(&mut self, registry: Option<&Registry>) {
        let version = self.config.peers.version();
        if version == self.book_version {
            return;
        }
        self.book_version = version;
        let book = self.config.peers.get();
        let now = Instant::now();
        let gone: Vec<u64> = self.outgoing.keys().filter(|peer| !book.contains_key(peer)).copied().collect();
        for peer in gone {
            if let Some(mut outgoing) = self.outgoing.remove(&peer) {
                info!(outgoing.logger, "peer removed: disconnecting");
                if let Some(registry) = registry {
                    Self::close_link(registry, &mut self.by_token, &mut outgoing, now);
                }
            }
        }
        for (&peer, addr) in &book {
            if peer == self.config.node_id {
                continue;
            }
            match self.outgoing.get_mut(&peer) {
                Some(outgoing) if outgoing.addr == *addr => {}
                Some(outgoing) => {
                    info!(outgoing.logger, "peer moved: reconnecting"; "from" => &outgoing.addr, "to" => addr);
                    let mut moved =
                        std::mem::replace(outgoing, Outgoing::new(peer, addr, &self.config, &self.logger));
                    if let Some(registry) = registry {
                        Self::close_link(registry, &mut self.by_token, &mut moved, now);
                    }
                }
                None => {
                    self.outgoing.insert(peer, Outgoing::new(peer, addr, &self.config, &self.logger));
                }
            }
        }
    }

    fn token(&mut self) -> Token {
        self.next_token += 1;
        Token(self.next_token)
    }

    pub(crate) fn send(&mut self, message: M) -> bool {
        let to = (self.route)(&message).to;
        let Some(outgoing) = self.outgoing.get_mut(&to) else { return false };
        if matches!(outgoing.link, Link::Down { .. } | Link::Resolving { .. }) {
            // Stale by the time the peer is back: raft sends fresh ones.
            return false;
        }
        let unsent = outgoing.output.len() - outgoing.written;
        if unsent > 0 && unsent >= self.config.output_bytes_max {
            return false;
        }
        if message.compute_size() as usize > ENCODE_ELSEWHERE_BYTES {
            // A snapshot: encoding it takes a while, done elsewhere. One
            // per peer at a time; raft sends another when it is needed.
            if !self.encoding.insert(to) {
                return false;
            }
            let (done, waker) = (self.encoded_tx.clone(), self.waker.clone());
            let spawned = std::thread::Builder::new().name("fencelock-encode".into()).spawn(move || {
                let mut frames = Vec::new();
                encode_parts(&message, &mut frames, PART_BYTES);
                if done.send((to, frames)).is_ok() {
                    waker.wake();
                }
            });
            if spawned.is_err() {
                self.encoding.remove(&to);
                return false;
            }
            return true;
        }
        if unsent == 0 {
            self.dirty.push(to);
        }
        encode_parts(&message, &mut outgoing.output, PART_BYTES);
        true
    }

    /// Queues the large messages whose encoding is done.
    fn take_encoded(&mut self) {
        while let Ok((to, frames)) = self.encoded.try_recv() {
            self.encoding.remove(&to);
            let Some(outgoing) = self.outgoing.get_mut(&to) else { continue };
            if matches!(outgoing.link, Link::Down { .. } | Link::Resolving { .. }) {
                continue;
            }
            let unsent = outgoing.output.len() - outgoing.written;
            if unsent == 0 {
                // No copy: the frames become the output.
                outgoing.output = frames;
                outgoing.written = 0;
                self.dirty.push(to);
            } else {
                outgoing.output.extend_from_slice(&frames);
            }
        }
    }

    /// Writes every peer's queued output as far as its socket takes it.
    pub(crate) fn flush(&mut self, registry: &Registry) {
        self.take_encoded();
        for peer in std::mem::take(&mut self.dirty) {
            self.write_out(registry, peer);
        }
    }

    fn write_out(&mut self, registry: &Registry, peer: u64) {
        let Some(outgoing) = self.outgoing.get_mut(&peer) else { return };
        let Link::Up { wire, .. } = &mut outgoing.link else { return };
        let mut failed = wire.flush().err();
        if wire.is_handshaking() {
            // Nothing of ours goes before the peer's certificate is known
            // to be in date (see below); its handshake bytes went above.
            if let Some(err) = failed {
                warn!(outgoing.logger, "peer connection lost"; "error" => %err);
                self.go_down(registry, peer);
            }
            return;
        }
        if outgoing.expiry.is_none() {
            // A certificate checks out for up to a second past its end
            // (whole seconds): nothing is sent to a peer whose has ended.
            outgoing.expiry = wire.peer_expiry();
            if outgoing.expiry.is_some_and(|expiry| expiry <= Instant::now()) {
                warn!(outgoing.logger, "closing peer connection: the peer's certificate has expired");
                self.go_down(registry, peer);
                return;
            }
        }
        while failed.is_none() && outgoing.written < outgoing.output.len() {
            match wire.write(&outgoing.output[outgoing.written..]) {
                Ok(0) => {
                    failed = Some(io::Error::from(io::ErrorKind::WriteZero));
                    break;
                }
                Ok(n) => outgoing.written += n,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => {
                    failed = Some(err);
                    break;
                }
            }
        }
        if outgoing.written == outgoing.output.len() {
            outgoing.output.clear();
            outgoing.written = 0;
        } else if outgoing.written > 1 << 20 && outgoing.written * 2 > outgoing.output.len() {
            // Once the sent part is the larger half: each byte is moved at
            // most once on average. (Draining after every write moved the
            // rest of a 1.3 GB snapshot hundreds of times, for tens of
            // seconds of a stalled loop.)
            outgoing.output.drain(..outgoing.written);
            outgoing.written = 0;
        }
        if let Some(err) = failed {
            warn!(outgoing.logger, "peer connection lost"; "error" => %err);
            self.go_down(registry, peer);
        }
    }

    /// Drops the peer's connection and output; it is reopened after the
    /// backoff. The backoff doubles up to its cap unless the connection
    /// had been up for the cap or longer: a peer that accepts and then
    /// closes at once (it refuses this node) is retried ever more slowly,
    /// not every `reconnect_backoff_min`.
    fn go_down(&mut self, registry: &Registry, peer: u64) {
        let Some(outgoing) = self.outgoing.get_mut(&peer) else { return };
        let max = self.config.reconnect_backoff_max;
        let stable = matches!(&outgoing.link, Link::Up { since, .. } if since.elapsed() >= max);
        if stable {
            outgoing.backoff = self.config.reconnect_backoff_min;
        }
        // Jittered, between half the backoff and all of it: nodes that lost
        // a peer together do not call it back in step.
        self.jitter ^= self.jitter << 13;
        self.jitter ^= self.jitter >> 7;
        self.jitter ^= self.jitter << 17;
        let half = outgoing.backoff / 2;
        let spread = half.as_micros().max(1) as u64;
        let retry_at = Instant::now() + half + Duration::from_micros(self.jitter % spread);
        if !stable {
            outgoing.backoff = (outgoing.backoff * 2).min(max);
        }
        Self::close_link(registry, &mut self.by_token, outgoing, retry_at);
    }

    fn close_link(
        registry: &Registry,
        by_token: &mut HashMap<Token, u64, RandomState>,
        outgoing: &mut Outgoing,
        retry_at: Instant,
    ) {
        let link = std::mem::replace(&mut outgoing.link, Link::Down { retry_at });
        if let Link::Connecting { mut wire, token, .. } | Link::Up { mut wire, token, .. } = link {
            let _ = registry.deregister(wire.stream());
            wire.shutdown();
            by_token.remove(&token);
        }
        outgoing.output.clear();
        outgoing.written = 0;
        outgoing.expiry = None;
    }

    /// Once this node knows its cluster's id, reopens at once the
    /// connections whose hello did not name it (opened before the id was
    /// applied), so that every peer learns it and a peer of another cluster
    /// refuses them.
    fn rename(&mut self, registry: &Registry) {
        if self.named || !self.config.greetings.is_named() {
            return;
        }
        self.named = true;
        let now = Instant::now();
        for outgoing in self.outgoing.values_mut() {
            if !outgoing.named && matches!(outgoing.link, Link::Connecting { .. } | Link::Up { .. }) {
                debug!(outgoing.logger, "reconnecting to name the cluster in the hello");
                Self::close_link(registry, &mut self.by_token, outgoing, now);
            }
        }
    }

    /// The earliest moment a connection is due to be opened or given up on.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let hellos = self.incoming.values().filter_map(|incoming| match incoming.peer {
            None => Some(incoming.since + HELLO_TIMEOUT),
            Some(_) => incoming.expiry,
        });
        self.outgoing
            .values()
            .filter_map(|outgoing| match &outgoing.link {
                Link::Down { retry_at } => Some(*retry_at),
                Link::Resolving { since } => Some(*since + RESOLVE_TIMEOUT),
                Link::Connecting { since, .. } => Some(*since + CONNECT_TIMEOUT),
                Link::Up { .. } => outgoing.expiry,
            })
            .chain(hellos)
            .min()
    }

    /// Opens the connections that are due, gives up on slow ones.
    pub(crate) fn on_time(&mut self, registry: &Registry, now: Instant) {
        self.follow_book(Some(registry));
        self.take_resolved(registry);
        self.rename(registry);
        let due: Vec<(Token, String)> = self
            .incoming
            .iter()
            .filter_map(|(token, incoming)| match incoming.peer {
                None if incoming.since + HELLO_TIMEOUT <= now => {
                    Some((*token, format!("no hello within {HELLO_TIMEOUT:?}")))
                }
                Some(_) if incoming.expiry.is_some_and(|expiry| expiry <= now) => {
                    Some((*token, "the peer's certificate has expired".to_owned()))
                }
                _ => None,
            })
            .collect();
        for (token, reason) in due {
            self.close_incoming(registry, token, Some(reason));
        }
        let peers: Vec<u64> = self.outgoing.keys().copied().collect();
        for peer in peers {
            let Some(outgoing) = self.outgoing.get(&peer) else { continue };
            match &outgoing.link {
                Link::Down { retry_at } if *retry_at <= now => self.connect(registry, peer),
                Link::Resolving { since } if *since + RESOLVE_TIMEOUT <= now => {
                    debug!(outgoing.logger, "cannot resolve peer"; "addr" => &outgoing.addr, "error" => "timed out");
                    self.go_down(registry, peer);
                }
                Link::Connecting { since, .. } if *since + CONNECT_TIMEOUT <= now => {
                    debug!(outgoing.logger, "cannot reach peer"; "addr" => &outgoing.addr, "error" => "timed out");
                    self.go_down(registry, peer);
                }
                Link::Up { .. } if outgoing.expiry.is_some_and(|expiry| expiry <= now) => {
                    warn!(outgoing.logger, "closing peer connection: the peer's certificate has expired");
                    self.go_down(registry, peer);
                }
                _ => {}
            }
        }
    }

    /// Opens a connection to the peer: at once to an IP address, after a
    /// lookup (on a thread of its own) for a host name.
    fn connect(&mut self, registry: &Registry, peer: u64) {
        let Some(outgoing) = self.outgoing.get_mut(&peer) else { return };
        outgoing.attempt += 1;
        if let Ok(addr) = outgoing.addr.parse::<SocketAddr>() {
            return self.open(registry, peer, addr);
        }
        let (name, attempt) = (outgoing.addr.clone(), outgoing.attempt);
        let (done, waker) = (self.resolved_tx.clone(), self.waker.clone());
        let spawned = std::thread::Builder::new().name("fencelock-resolve".into()).spawn(move || {
            use std::net::ToSocketAddrs;
            let found = name.to_socket_addrs().and_then(|mut addrs| {
                addrs.next().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address for the name"))
            });
            if done.send((peer, attempt, found)).is_ok() {
                waker.wake();
            }
        });
        match spawned {
            Ok(_) => outgoing.link = Link::Resolving { since: Instant::now() },
            Err(err) => {
                warn!(outgoing.logger, "cannot start a host name lookup"; "error" => %err);
                self.go_down(registry, peer);
            }
        }
    }

    /// Connects to the peers whose host name lookup answered.
    fn take_resolved(&mut self, registry: &Registry) {
        while let Ok((peer, attempt, found)) = self.resolved.try_recv() {
            let Some(outgoing) = self.outgoing.get(&peer) else { continue };
            if outgoing.attempt != attempt || !matches!(outgoing.link, Link::Resolving { .. }) {
                continue;
            }
            match found {
                Ok(addr) => self.open(registry, peer, addr),
                Err(err) => {
                    debug!(outgoing.logger, "cannot resolve peer"; "addr" => &outgoing.addr, "error" => %err);
                    self.go_down(registry, peer);
                }
            }
        }
    }

    fn open(&mut self, registry: &Registry, peer: u64, addr: SocketAddr) {
        let token = self.token();
        let Some(outgoing) = self.outgoing.get_mut(&peer) else { return };
        let mut stream = match TcpStream::connect(addr) {
            Ok(stream) => stream,
            Err(err) => {
                debug!(outgoing.logger, "cannot reach peer"; "addr" => &outgoing.addr, "error" => %err);
                self.go_down(registry, peer);
                return;
            }
        };
        if let Err(err) = registry.register(&mut stream, token, Interest::READABLE | Interest::WRITABLE) {
            warn!(outgoing.logger, "cannot watch a peer connection"; "error" => %err);
            self.go_down(registry, peer);
            return;
        }
        let wire = match &self.config.tls {
            None => Wire::plain(stream),
            Some(tls) => {
                match Wire::tls_client(stream, &tls.dial.current(), fencelock_tls::peer_server_name(peer)) {
                    Ok(wire) => wire,
                    Err(err) => {
                        warn!(outgoing.logger, "cannot start TLS to a peer"; "error" => %err);
                        self.go_down(registry, peer);
                        return;
                    }
                }
            }
        };
        outgoing.output.clear();
        outgoing.written = 0;
        let hello = self.config.greetings.hello_for(self.config.node_id, &self.config.client_addr, peer);
        outgoing.named = !hello.cluster_id.is_empty();
        encode_frame(&hello, &mut outgoing.output);
        outgoing.link = Link::Connecting { wire, token, since: Instant::now() };
        self.by_token.insert(token, peer);
    }

    /// Incoming peer connections held at once: two per peer (a reconnect
    /// can overlap the connection it replaces) and a few that have not said
    /// their hello yet.
    fn incoming_max(&self) -> usize {
        2 * self.config.peers.len() + INCOMING_UNNAMED_MAX
    }

    /// Accepts every waiting peer connection.
    pub(crate) fn accept_all(&mut self, registry: &Registry) {
        loop {
            let (mut stream, remote) = match self.listener.accept() {
                Ok(accepted) => accepted,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => {
                    warn!(self.logger, "accepting a peer failed"; "error" => %err);
                    return;
                }
            };
            if self.incoming.len() >= self.incoming_max() {
                // Make room by the oldest connection that has not said who
                // it is; a stranger cannot crowd out the peers. If every one
                // has (real peers reconnecting), this one waits its turn.
                let oldest = self
                    .incoming
                    .iter()
                    .filter(|(_, incoming)| incoming.peer.is_none())
                    .min_by_key(|(_, incoming)| incoming.since)
                    .map(|(token, _)| *token);
                match oldest {
                    Some(token) => self.close_incoming(
                        registry,
                        token,
                        Some(format!("too many peer connections (at most {})", self.incoming_max())),
                    ),
                    None => {
                        debug!(self.logger, "refusing a peer connection: every place is a peer's"; "remote" => %remote);
                        drop(stream);
                        continue;
                    }
                }
            }
            let token = self.token();
            // With TLS the handshake writes too.
            let interest = if self.config.tls.is_some() {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            if let Err(err) = registry.register(&mut stream, token, interest) {
                warn!(self.logger, "cannot watch a peer connection"; "error" => %err);
                continue;
            }
            let wire = match &self.config.tls {
                None => Wire::plain(stream),
                Some(tls) => match Wire::tls_server(stream, &tls.accept.current()) {
                    Ok(wire) => wire,
                    Err(err) => {
                        warn!(self.logger, "cannot start TLS on a peer connection"; "error" => %err);
                        continue;
                    }
                },
            };
            let incoming = Incoming {
                wire,
                since: Instant::now(),
                input: Vec::new(),
                parts: Vec::new(),
                peer: None,
                named: false,
                expiry: None,
                remote,
            };
            self.incoming.insert(token, incoming);
        }
    }

    /// The incoming connections cut short last round, to read again.
    pub(crate) fn take_again(&mut self) -> Vec<Token> {
        std::mem::take(&mut self.again)
    }

    /// Reads an incoming connection again (it was cut short last round).
    pub(crate) fn read_more(&mut self, registry: &Registry, token: Token, inbound: &mut Vec<M>) {
        if let Err(reason) = self.read_incoming(token, inbound) {
            self.close_incoming(registry, token, reason);
        }
    }

    fn close_incoming(&mut self, registry: &Registry, token: Token, reason: Option<String>) {
        if let Some(mut incoming) = self.incoming.remove(&token) {
            match reason {
                Some(reason) => {
                    if let Some(suppressed) =
                        self.throttle.admit("peer connection closed", incoming.remote.ip(), Instant::now())
                    {
                        warn!(self.logger, "closing peer connection"; "peer" => incoming.peer,
                            "remote" => %incoming.remote, "error" => reason, "suppressed" => suppressed);
                    }
                }
                None => debug!(self.logger, "peer closed its connection"; "peer" => incoming.peer),
            }
            let _ = registry.deregister(incoming.wire.stream());
            incoming.wire.shutdown();
            // What its hello announced holds while a connection from that
            // peer is open: a closed one's address is forgotten (clients
            // are pointed only at a leader that is connected now).
            if let Some(peer) = incoming.peer {
                if !self.incoming.values().any(|other| other.peer == Some(peer)) {
                    self.client_addrs.remove(peer);
                }
            }
        }
    }

    /// Whether `token` is one of this side's connections.
    pub(crate) fn owns(&self, token: Token) -> bool {
        self.by_token.contains_key(&token) || self.incoming.contains_key(&token)
    }

    /// Handles an event on one of this side's connections; messages read
    /// go to `inbound`.
    pub(crate) fn on_event(&mut self, registry: &Registry, event: &Event, inbound: &mut Vec<M>) {
        let token = event.token();
        if let Some(&peer) = self.by_token.get(&token) {
            self.on_outgoing_event(registry, peer, event);
        } else if let Some(incoming) = self.incoming.get_mut(&token) {
            if event.is_writable() {
                if let Err(err) = incoming.wire.flush() {
                    self.close_incoming(registry, token, Some(format!("write failed: {err}")));
                    return;
                }
            }
            self.read_more(registry, token, inbound);
        }
    }

    fn on_outgoing_event(&mut self, registry: &Registry, peer: u64, event: &Event) {
        let Some(outgoing) = self.outgoing.get_mut(&peer) else { return };
        match &mut outgoing.link {
            Link::Connecting { wire, token, .. } => {
                let stream = wire.stream();
                if let Ok(Some(err)) | Err(err) = stream.take_error() {
                    debug!(outgoing.logger, "cannot reach peer"; "addr" => &outgoing.addr, "error" => %err);
                    self.go_down(registry, peer);
                    return;
                }
                match stream.peer_addr() {
                    Ok(_) => {}
                    Err(err) if err.kind() == io::ErrorKind::NotConnected => return,
                    Err(err) => {
                        debug!(outgoing.logger, "cannot reach peer"; "addr" => &outgoing.addr, "error" => %err);
                        self.go_down(registry, peer);
                        return;
                    }
                }
                let _ = stream.set_nodelay(true);
                let token = *token;
                let Link::Connecting { wire, .. } =
                    std::mem::replace(&mut outgoing.link, Link::Down { retry_at: Instant::now() })
                else {
                    return;
                };
                outgoing.link = Link::Up { wire, token, since: Instant::now() };
                info!(outgoing.logger, "connected to peer"; "addr" => &outgoing.addr);
                self.write_out(registry, peer);
            }
            Link::Up { wire, .. } => {
                if event.is_readable() || event.is_read_closed() || event.is_error() {
                    // Peers send nothing back on this connection but the
                    // TLS handshake: a read tells whether it is still open.
                    let mut ignored = Vec::new();
                    loop {
                        match wire.read(&mut self.scratch, &mut ignored) {
                            Ok(Got::Closed) => {
                                info!(outgoing.logger, "peer closed the connection");
                                self.go_down(registry, peer);
                                return;
                            }
                            Ok(Got::Bytes(_)) => ignored.clear(),
                            Ok(Got::Nothing) => break,
                            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                            Err(err) => {
                                warn!(outgoing.logger, "peer connection lost"; "error" => %err);
                                self.go_down(registry, peer);
                                return;
                            }
                        }
                    }
                }
                // Writable, or the handshake may have just ended: what
                // waited for it goes now.
                self.write_out(registry, peer);
            }
            Link::Down { .. } | Link::Resolving { .. } => {}
        }
    }

    /// Reads what the socket has and decodes every whole frame. `Err`
    /// closes the connection: `Some(reason)` for a violation, `None` when
    /// the peer closed it.
    fn read_incoming(&mut self, token: Token, inbound: &mut Vec<M>) -> Result<(), Option<String>> {
        let Some(incoming) = self.incoming.get_mut(&token) else { return Ok(()) };
        let mut read = 0;
        loop {
            if read >= PEER_BYTES_PER_ROUND {
                self.again.push(token);
                break;
            }
            let n = match incoming.wire.read(&mut self.scratch, &mut incoming.input) {
                Ok(Got::Closed) => return Err(None),
                Ok(Got::Bytes(n)) => n,
                Ok(Got::Nothing) => break,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(Some(format!("read failed: {err}"))),
            };
            read += n;
            let mut at = 0;
            loop {
                let rest = &incoming.input[at..];
                if incoming.peer.is_none() {
                    match decode_frame::<PeerHello>(rest, HELLO_BYTES_MAX) {
                        Ok(None) => break,
                        Ok(Some((hello, used))) => {
                            at += used;
                            if self.config.tls.is_some() {
                                // The hello may claim only the node the
                                // certificate names.
                                let named = incoming.wire.peer_identity();
                                if named != Some(fencelock_tls::Identity::Node(hello.node_id)) {
                                    return Err(Some(format!(
                                        "hello claims node {}, but the certificate names {named:?}",
                                        hello.node_id
                                    )));
                                }
                            }
                            if hello.node_id == self.config.node_id {
                                return Err(Some(format!("hello from node {}, this node", hello.node_id)));
                            }
                            if !self.config.peers.contains(hello.node_id) {
                                // Of this cluster, though the configuration
                                // this node applied does not name it (it
                                // was added since, and may lead): taken,
                                // and answered at the address it gives.
                                let ours = self.config.greetings.cluster_id();
                                let same_cluster = !hello.cluster_id.is_empty()
                                    && (hello.cluster_id == ours
                                        || (ours.is_empty() && hello.voters.contains(&self.config.node_id)));
                                if !same_cluster {
                                    // A running cluster that added this
                                    // node (member add) while its store is
                                    // blank: noted, so that it does not
                                    // found its own.
                                    if !hello.cluster_id.is_empty() && ours.is_empty() {
                                        self.config.greetings.record_stranger(&hello);
                                    }
                                    return Err(Some(format!(
                                        "hello from node {}, not a peer",
                                        hello.node_id
                                    )));
                                }
                                self.config.peers.learn(hello.node_id, &hello.peer_addr);
                            }
                            // Both sides named: the same cluster. A side that
                            // knows no name yet (a new node, or one that lost
                            // its data) learns it from the cluster's log.
                            let ours = self.config.greetings.cluster_id();
                            if !ours.is_empty() && !hello.cluster_id.is_empty() && hello.cluster_id != ours {
                                return Err(Some(format!(
                                    "hello from node {} of another cluster: its cluster id is {}, ours {}",
                                    hello.node_id,
                                    hex(&hello.cluster_id),
                                    hex(&ours)
                                )));
                            }
                            incoming.peer = Some(hello.node_id);
                            incoming.expiry = incoming.wire.peer_expiry();
                            // A certificate checks out for up to a second
                            // past its end (whole seconds).
                            if incoming.expiry.is_some_and(|expiry| expiry <= Instant::now()) {
                                return Err(Some("the peer's certificate has expired".to_owned()));
                            }
                            self.config.greetings.record(hello.node_id, &hello);
                            incoming.named = !hello.cluster_id.is_empty();
                            // Clients are sent only to a node that named
                            // this cluster: one that hides its id (blank,
                            // or of another cluster) serves none of ours.
                            if incoming.named || ours.is_empty() {
                                self.client_addrs.insert(hello.node_id, hello.client_addr);
                            }
                        }
                        Err(err) => return Err(Some(format!("bad hello: {err}"))),
                    }
                } else {
                    let piece = match decode_piece(rest, self.config.frame_bytes_max) {
                        Ok(None) => break,
                        Ok(Some(piece)) => piece,
                        Err(err) => return Err(Some(err.to_string())),
                    };
                    let crate::frame::Piece { more, body, used } = piece;
                    at += used;
                    let max = self.config.message_bytes_max;
                    if incoming.parts.len() + body.len() > max {
                        return Err(Some(format!(
                            "a message in parts passed {max} bytes (raise --max-snapshot-bytes on this node if \
                             snapshots are that large)"
                        )));
                    }
                    if more {
                        incoming.parts.extend_from_slice(body);
                        continue;
                    }
                    let decoded = if incoming.parts.is_empty() {
                        (self.config.precheck)(body).map_err(|why| Some(format!("not decoded: {why}")))?;
                        M::parse_from_bytes(body)
                    } else {
                        incoming.parts.extend_from_slice(body);
                        (self.config.precheck)(&incoming.parts)
                            .map_err(|why| Some(format!("not decoded: {why}")))?;
                        // Parsed without a copy: the message's byte fields
                        // (a snapshot's data) share the buffer.
                        let whole = bytes::Bytes::from(std::mem::take(&mut incoming.parts));
                        M::parse_from_carllerche_bytes(&whole)
                    };
                    match decoded {
                        Ok(message) => {
                            let route = (self.route)(&message);
                            if Some(route.from) != incoming.peer || route.to != self.config.node_id {
                                return Err(Some(format!(
                                    "a message from {} to {} on node {:?}'s connection",
                                    route.from, route.to, incoming.peer
                                )));
                            }
                            inbound.push(message);
                        }
                        Err(err) => return Err(Some(format!("frame does not decode: {err}"))),
                    }
                }
            }
            incoming.input.drain(..at);
            // A short read emptied the socket: a later byte is a new edge.
            if n < self.scratch.len() {
                break;
            }
        }
        Ok(())
    }
}
