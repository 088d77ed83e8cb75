//! The client listener: pipelined request/response over framed TCP.
//!
//! One event-loop thread (mio: epoll on Linux) accepts connections, reads
//! and decodes [`Request`]s and hands them to the [`Handler`], and writes
//! the [`Response`]s that come back, each connection's in as few writes as
//! its socket takes. Responses are queued by whatever thread completes them
//! (the raft driver, for most) and the loop is woken once per burst, not per
//! response: no thread per connection, and no thread hand-off per request.
//!
//! Limits (frame size, requests in flight per connection, connections) are
//! answered with a clear error; a malformed frame closes that connection
//! only. A client that stops reading its responses is stopped being read
//! from once its unsent responses pass [`OUTPUT_PAUSE_BYTES`], so a slow
//! client costs bounded memory.
//!
//! A node's loop is this same event loop given the node's peer side
//! (`peers.rs`) and its [`Core`], which it turns between rounds of events
//! with a [`NodeIo`] onto its sockets; `node.rs` starts it so.

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ahash::RandomState;
use crossbeam_channel::{unbounded, Receiver};
use fencelock_types::client_pb::{Error, ErrorCode, Request, Request_oneof_kind as RequestKind, Response};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use protobuf::Message;
use slog::{debug, info, warn, Logger};

use crate::frame::{decode_frame, encode_frame, FrameError};
use crate::peers::Peers;
use crate::shared::LoopShared;
use crate::wire::{Got, Reloadable, Wire};

/// Settings of the client listener.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub listen_addr: SocketAddr,
    pub connections_max: usize,
    /// Connections served at once from one IP address: one host cannot
    /// take every place.
    pub per_address_max: usize,
    /// A connection with no request in flight that sends nothing for this
    /// long is closed (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// Requests in flight on one connection; more are refused.
    pub in_flight_max: usize,
    pub frame_bytes_max: usize,
    /// Bytes of partial requests held across every connection; past it, the
    /// connection holding the most is closed ([`INPUT_TOTAL_MAX`] by default).
    pub input_total_max: usize,
    /// Unsent answer bytes across every connection; past it, the connection
    /// holding the most is closed ([`OUTPUT_TOTAL_MAX`] by default).
    pub output_total_max: usize,
    /// TLS on this port: every client must present a certificate this
    /// configuration accepts. `None`: plain TCP.
    pub tls: Option<Reloadable<rustls::ServerConfig>>,
}

/// Serves requests. Called on the listener's event-loop thread, which
/// serves every connection: it must not block, and answers later through
/// the [`ResponseSink`].
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, request: Request, sink: ResponseSink);

    /// Whether the handler takes more requests now. False: the loop stops
    /// decoding requests (their bytes stay in their connections, and the
    /// sockets are not read) and asks again in the next round, after the
    /// core's turn: a full queue behind the handler pushes back on the
    /// clients instead of growing.
    fn ready(&self) -> bool {
        true
    }

    /// Connection `connection` (as [`ResponseSink::connection`] names it)
    /// closed, for whatever reason: after every request it carried was
    /// handed to [`Handler::handle`]. Called on the loop's thread.
    fn closed(&self, connection: u64) {
        let _ = connection;
    }
}

/// Unsent response bytes on one connection past which the loop stops
/// reading that connection's requests until its client catches up.
pub const OUTPUT_PAUSE_BYTES: usize = 256 * 1024;

/// The default of [`ClientConfig::input_total_max`]: many connections that
/// each send most of a large frame cannot add up to more than this.
pub const INPUT_TOTAL_MAX: usize = 64 << 20;

/// The default of [`ClientConfig::output_total_max`]: clients that do not
/// read their answers cannot make them add up to more than this.
pub const OUTPUT_TOTAL_MAX: usize = 256 << 20;

/// Connections the kernel queues for a listener before the loop accepts
/// them (capped by `net.core.somaxconn`). mio asks for 128, which a burst of
/// connections overflows: the overflow waits for the client's SYN retry
/// (a second or more).
pub const LISTEN_BACKLOG: i32 = 4096;

/// Binds a listener with a [`LISTEN_BACKLOG`]-long accept queue.
pub(crate) fn bind_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let listener = TcpListener::bind(addr)?;
    // Listening again changes the backlog of a listening socket.
    rustix::net::listen(&listener, LISTEN_BACKLOG)?;
    Ok(listener)
}

/// The most bytes taken from one socket in one read.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// How long a client connection may take to finish its TLS handshake (in
/// unit tests, a moment).
pub const HANDSHAKE_TIMEOUT: Duration =
    if cfg!(test) { Duration::from_millis(300) } else { Duration::from_secs(5) };

/// The most requests one connection dispatches in one round of the loop;
/// the rest wait for the next round, after the core's turn.
const REQUESTS_PER_ROUND: usize = 256;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
pub(crate) const PEER_LISTENER: Token = Token(2);
/// Connection tokens start here and are never reused, so that a response
/// for a closed connection can never reach a newer one.
const FIRST_CONNECTION: usize = 3;

/// Where the answer to one request goes.
#[derive(Debug)]
pub struct ResponseSink {
    id: u64,
    connection: Arc<ConnectionShared>,
    /// It answers a `list`: one may be in flight per connection.
    list: bool,
}

impl ResponseSink {
    /// The id of the request this sink answers.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The connection the request came on: a number never reused while
    /// the listener runs.
    pub fn connection(&self) -> u64 {
        self.connection.token.0 as u64
    }

    /// The user the connection's certificate names (TLS only; `None` on
    /// plain TCP).
    pub fn user(&self) -> Option<&str> {
        self.connection.user.get().map(String::as_str)
    }

    /// Queues the response (its id is set here) for the event loop to
    /// write. False when the connection is gone: for an acquire, the grant
    /// has no one to go to.
    pub fn send(self, mut response: Response) -> bool {
        response.id = self.id;
        let connection = &self.connection;
        if !connection.alive.load(Ordering::SeqCst) {
            connection.in_flight.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        connection.shared.post(connection.token, response, self.list)
    }
}

/// What a connection shares with the sinks of its requests.
#[derive(Debug)]
struct ConnectionShared {
    token: Token,
    alive: AtomicBool,
    /// Requests handed to the handler whose response is not yet queued
    /// for writing.
    in_flight: AtomicUsize,
    shared: Arc<LoopShared>,
    /// The user its certificate names, once its TLS handshake is done.
    user: std::sync::OnceLock<String>,
}

/// A running client listener.
#[derive(Debug)]
pub struct ClientListener {
    local_addr: SocketAddr,
    shared: Arc<LoopShared>,
}

impl ClientListener {
    pub fn start(
        config: ClientConfig,
        handler: Arc<dyn Handler>,
        logger: &Logger,
    ) -> std::io::Result<ClientListener> {
        // No peers: the loop's peer message type is never used.
        let listener = bind_listener(config.listen_addr)?;
        let event_loop =
            EventLoop::<fencelock_types::client_pb::PeerHello>::bind(config, listener, handler, logger)?;
        let local_addr = event_loop.local_addr()?;
        let shared = Arc::clone(&event_loop.shared);
        let loop_shared = Arc::clone(&shared);
        std::thread::Builder::new().name("fencelock-client-io".into()).spawn(move || {
            let _ = loop_shared.loop_thread.set(std::thread::current().id());
            event_loop.run();
        })?;
        Ok(ClientListener { local_addr, shared })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting new connections and closes the listening socket;
    /// open connections carry on.
    pub fn stop_accepting(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = self.shared.waker.wake();
    }
}

/// An error response with a stable code.
pub fn error_response(id: u64, code: ErrorCode, message: impl Into<String>) -> Response {
    Response {
        id,
        error: protobuf::SingularPtrField::some(Error {
            code,
            message: message.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What a node loop runs between rounds of socket events: the server's
/// raft driver. Called on the loop's thread only; it must not block for
/// long (a synchronous disk write is the longest it should take).
pub trait Core<M>: Send {
    /// Takes the peer messages that came in (`inbound`, to drain) and does
    /// its work, sending messages through `io`. Returns how long the loop
    /// may wait for events before calling again, or that it should stop.
    fn turn(&mut self, inbound: &mut Vec<M>, io: &mut NodeIo<'_, M>) -> Turn;
}

/// What a [`Core`] asks of the loop after a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Call again after the next events, or after this long at the latest.
    Wait(Duration),
    /// End the loop: every connection closes.
    Stop,
}

/// The loop's sockets, as a [`Core`] sees them during its turn.
pub struct NodeIo<'a, M> {
    pub(crate) event_loop: &'a mut EventLoop<M>,
}

impl<M> std::fmt::Debug for NodeIo<'_, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeIo")
    }
}

impl<M: Message> NodeIo<'_, M> {
    /// Queues `message` for its peer. False when it was dropped: the peer
    /// is unknown, unreachable, or too far behind.
    pub fn send(&mut self, message: M) -> bool {
        match &mut self.event_loop.peers {
            Some(peers) => peers.send(message),
            None => false,
        }
    }

    /// Writes what is queued (peer messages and client responses) now,
    /// as far as the sockets take it, instead of after the turn.
    pub fn flush(&mut self) {
        self.event_loop.flush_all();
    }
}

pub(crate) struct EventLoop<M> {
    pub(crate) poll: Poll,
    /// `None` once the listener stopped accepting.
    listener: Option<TcpListener>,
    inbox: Receiver<(Token, Response, bool)>,
    /// An empty buffer to swap with [`LoopShared::local`].
    local_spare: Vec<(Token, Response, bool)>,
    pub(crate) shared: Arc<LoopShared>,
    connections: HashMap<Token, Connection, RandomState>,
    next_token: usize,
    /// Connections with output to write after this round of events.
    to_flush: Vec<Token>,
    scratch: Vec<u8>,
    config: ClientConfig,
    handler: Arc<dyn Handler>,
    /// A node loop's peer side and core; `None` for a client listener.
    pub(crate) peers: Option<Peers<M>>,
    pub(crate) core: Option<Box<dyn Core<M>>>,
    /// Peer messages read and not yet taken by the core.
    inbound: Vec<M>,
    /// Client connections to read again next round: their budget ran out
    /// with requests or bytes left.
    read_again: Vec<Token>,
    /// TLS connections by when their handshake must be done, oldest first
    /// (accept order is deadline order).
    handshakes: std::collections::VecDeque<(Instant, Token)>,
    /// TLS connections by when their client's certificate ends: they are
    /// closed then (a handshake checks a certificate only once).
    expiries: std::collections::BTreeSet<(Instant, Token)>,
    /// Open connections by remote IP address.
    per_address: HashMap<std::net::IpAddr, usize, RandomState>,
    /// When idle connections are next looked for.
    next_idle_sweep: Option<Instant>,
    /// Repeated warnings, per kind and address.
    throttle: crate::throttle::Throttle,
    /// Bytes of partial requests, and of unsent answers, over every
    /// connection (bounded by [`ClientConfig::input_total_max`] and
    /// [`ClientConfig::output_total_max`]).
    input_bytes: usize,
    output_bytes: usize,
    logger: Logger,
}

/// The event loop's side of one connection.
struct Connection {
    wire: Wire,
    shared: Arc<ConnectionShared>,
    /// Bytes read and not yet decoded: at most one partial frame.
    input: Vec<u8>,
    /// Encoded responses; `output[written..]` is still to go.
    output: Vec<u8>,
    written: usize,
    /// In `to_flush` already.
    flush_queued: bool,
    /// Reading stopped because too much output is waiting; the socket may
    /// still hold requests, read once the output drains.
    read_paused: bool,
    /// Close once the output is written (after a refusal that ends the
    /// connection).
    closing: bool,
    /// `input` may hold whole requests not yet dispatched: the round's
    /// budget ran out.
    backlog: bool,
    /// When its client's certificate ends (its entry in `expiries`).
    expiry: Option<Instant>,
    remote_ip: std::net::IpAddr,
    /// When the client last sent a byte.
    last_heard: Instant,
    /// A `list` is in flight: its answer may be large, so the next one
    /// waits for it.
    list_in_flight: bool,
    /// Decoding stopped at a `list` while another was in flight; it goes
    /// on once that one is answered.
    list_blocked: bool,
    logger: Logger,
}

impl Connection {
    fn unsent(&self) -> usize {
        self.output.len() - self.written
    }
}

/// How often idle connections are looked for: a quarter of the timeout,
/// at most once a second.
fn idle_sweep_every(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// Why a connection is closed.
enum Close {
    /// The client closed it, or the socket failed: nothing to tell.
    Quietly(String),
    /// A protocol violation: logged as a warning.
    Violation(String),
}

impl<M: protobuf::Message> EventLoop<M> {
    /// Takes the client listener (bound by [`crate::Listeners::bind`]); the
    /// loop runs once [`EventLoop::run`] is called on its thread.
    pub(crate) fn bind(
        config: ClientConfig,
        mut listener: TcpListener,
        handler: Arc<dyn Handler>,
        logger: &Logger,
    ) -> io::Result<EventLoop<M>> {
        let poll = Poll::new()?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let (outbox, inbox) = unbounded();
        let shared = Arc::new(LoopShared {
            outbox,
            local: std::sync::Mutex::new(Vec::new()),
            waker,
            wake_pending: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            loop_thread: std::sync::OnceLock::new(),
        });
        info!(logger, "client listener ready"; "addr" => %listener.local_addr()?);
        Ok(EventLoop {
            poll,
            listener: Some(listener),
            inbox,
            local_spare: Vec::new(),
            shared,
            connections: HashMap::default(),
            next_token: FIRST_CONNECTION,
            to_flush: Vec::new(),
            scratch: vec![0; READ_CHUNK_BYTES],
            config,
            handler,
            peers: None,
            core: None,
            inbound: Vec::new(),
            read_again: Vec::new(),
            handshakes: std::collections::VecDeque::new(),
            expiries: std::collections::BTreeSet::new(),
            per_address: HashMap::default(),
            next_idle_sweep: None,
            throttle: crate::throttle::Throttle::default(),
            input_bytes: 0,
            output_bytes: 0,
            logger: logger.clone(),
        })
    }

    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.listener {
            Some(listener) => listener.local_addr(),
            None => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    pub(crate) fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        // Until the core says otherwise, a node loop turns at once.
        let mut core_wait = self.core.as_ref().map(|_| Duration::ZERO);
        loop {
            let now = Instant::now();
            // The earliest of: a handshake due, a certificate ending, the
            // idle sweep, a peer connection's deadline.
            let deadline = [
                self.handshakes.front().map(|(deadline, _)| *deadline),
                self.expiries.first().map(|(deadline, _)| *deadline),
                self.next_idle_sweep,
                self.peers.as_ref().and_then(Peers::next_deadline),
            ]
            .into_iter()
            .flatten()
            .min();
            let timeout = match (core_wait, deadline) {
                (Some(wait), Some(deadline)) => Some(wait.min(deadline.saturating_duration_since(now))),
                (Some(wait), None) => Some(wait),
                (None, Some(deadline)) => Some(deadline.saturating_duration_since(now)),
                (None, None) => None,
            };
            // Connections cut short last round go on without waiting.
            let read_again = std::mem::take(&mut self.read_again);
            let peers_again = self.peers.as_mut().map(Peers::take_again).unwrap_or_default();
            let timeout =
                if read_again.is_empty() && peers_again.is_empty() { timeout } else { Some(Duration::ZERO) };
            if let Err(err) = self.poll.poll(&mut events, timeout) {
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                warn!(self.logger, "event loop failed; no more connections are served"; "error" => %err);
                return;
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept_all(),
                    WAKER => {}
                    PEER_LISTENER => {
                        if let Some(peers) = &mut self.peers {
                            peers.accept_all(self.poll.registry());
                        }
                    }
                    token if self.connections.contains_key(&token) => {
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            self.read(token);
                        }
                        if event.is_writable() {
                            self.queue_flush(token);
                        }
                    }
                    token => {
                        if let Some(peers) = &mut self.peers {
                            if peers.owns(token) {
                                peers.on_event(self.poll.registry(), event, &mut self.inbound);
                            }
                        }
                    }
                }
            }
            for token in read_again {
                self.read(token);
            }
            self.expire_handshakes(Instant::now());
            self.close_idle(Instant::now());
            if let Some(peers) = &mut self.peers {
                for token in peers_again {
                    peers.read_more(self.poll.registry(), token, &mut self.inbound);
                }
                peers.on_time(self.poll.registry(), Instant::now());
            }
            if self.shared.stopping.load(Ordering::SeqCst) {
                if let Some(mut listener) = self.listener.take() {
                    let _ = self.poll.registry().deregister(&mut listener);
                    info!(self.logger, "client listener stopped accepting");
                }
            }
            self.take_outbox();
            if let Some(mut core) = self.core.take() {
                // Cleared before the turn: whatever another thread sends
                // the core after this wakes the loop again.
                self.shared.wake_pending.store(false, Ordering::SeqCst);
                let mut inbound = std::mem::take(&mut self.inbound);
                let turn = core.turn(&mut inbound, &mut NodeIo { event_loop: &mut self });
                inbound.clear();
                self.inbound = inbound;
                self.core = Some(core);
                match turn {
                    Turn::Wait(wait) => core_wait = Some(wait),
                    Turn::Stop => {
                        self.flush_all();
                        return;
                    }
                }
            }
            self.flush_all();
            #[cfg(debug_assertions)]
            self.check_totals();
        }
    }

    /// The running totals of partial requests and unsent answers are the
    /// sums over the connections (debug builds: every round).
    #[cfg(debug_assertions)]
    fn check_totals(&self) {
        let input: usize = self.connections.values().map(|connection| connection.input.len()).sum();
        let output: usize = self.connections.values().map(Connection::unsent).sum();
        assert_eq!((self.input_bytes, self.output_bytes), (input, output), "byte totals drifted");
    }

    /// Writes everything queued: client responses and peer messages.
    pub(crate) fn flush_all(&mut self) {
        self.take_outbox();
        self.flush_queued();
        if let Some(peers) = &mut self.peers {
            peers.flush(self.poll.registry());
        }
    }

    fn accept_all(&mut self) {
        loop {
            let Some(listener) = &self.listener else { return };
            match listener.accept() {
                Ok((stream, remote)) => self.admit(stream, remote),
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => {
                    // Out of descriptors, say: the connection waits in the
                    // backlog until the next one arrives.
                    warn!(self.logger, "accepting a client failed"; "error" => %err);
                    return;
                }
            }
        }
    }

    fn admit(&mut self, mut stream: TcpStream, remote: SocketAddr) {
        let _ = stream.set_nodelay(true);
        if self.connections.len() >= self.config.connections_max {
            if let Some(suppressed) = self.throttle.admit("too many connections", remote.ip(), Instant::now())
            {
                warn!(self.logger, "refusing client: too many connections";
                    "remote" => %remote, "max" => self.config.connections_max, "suppressed" => suppressed);
            }
            if self.config.tls.is_none() {
                let mut buffer = Vec::new();
                encode_frame(&error_response(0, ErrorCode::UNAVAILABLE, "too many connections"), &mut buffer);
                // A new socket's send buffer is empty: this small write fits.
                let _ = stream.write(&buffer);
            }
            return;
        }
        let from_here = self.per_address.get(&remote.ip()).copied().unwrap_or(0);
        if from_here >= self.config.per_address_max {
            if let Some(suppressed) =
                self.throttle.admit("too many from an address", remote.ip(), Instant::now())
            {
                warn!(self.logger, "refusing client: too many connections from its address";
                    "remote" => %remote, "max" => self.config.per_address_max, "suppressed" => suppressed);
            }
            if self.config.tls.is_none() {
                let mut buffer = Vec::new();
                let refusal =
                    error_response(0, ErrorCode::UNAVAILABLE, "too many connections from this address");
                encode_frame(&refusal, &mut buffer);
                let _ = stream.write(&buffer);
            }
            return;
        }
        let token = Token(self.next_token);
        self.next_token += 1;
        let interest = Interest::READABLE | Interest::WRITABLE;
        if let Err(err) = self.poll.registry().register(&mut stream, token, interest) {
            warn!(self.logger, "cannot watch a client connection"; "remote" => %remote, "error" => %err);
            return;
        }
        let wire = match &self.config.tls {
            None => Wire::plain(stream),
            Some(tls) => match Wire::tls_server(stream, &tls.current()) {
                Ok(wire) => {
                    self.handshakes.push_back((Instant::now() + HANDSHAKE_TIMEOUT, token));
                    wire
                }
                Err(err) => {
                    warn!(self.logger, "cannot start TLS on a client connection"; "remote" => %remote, "error" => %err);
                    return;
                }
            },
        };
        let logger = self.logger.new(slog::o!("remote" => remote.to_string()));
        debug!(logger, "client connected");
        let shared = Arc::new(ConnectionShared {
            token,
            alive: AtomicBool::new(true),
            in_flight: AtomicUsize::new(0),
            shared: Arc::clone(&self.shared),
            user: std::sync::OnceLock::new(),
        });
        let connection = Connection {
            wire,
            shared,
            input: Vec::new(),
            output: Vec::new(),
            written: 0,
            flush_queued: false,
            read_paused: false,
            closing: false,
            backlog: false,
            expiry: None,
            remote_ip: remote.ip(),
            last_heard: Instant::now(),
            list_in_flight: false,
            list_blocked: false,
            logger,
        };
        self.connections.insert(token, connection);
        *self.per_address.entry(remote.ip()).or_insert(0) += 1;
        if let (Some(timeout), None) = (self.config.idle_timeout, self.next_idle_sweep) {
            self.next_idle_sweep = Some(Instant::now() + idle_sweep_every(timeout));
        }
        // Bytes may have come before registration; edge-triggered events
        // would not report them.
        self.read(token);
    }

    /// Closes the connections that have nothing in flight and have sent
    /// nothing for the idle timeout: an idle client does not keep its place
    /// for ever. Looked for a few times per timeout.
    fn close_idle(&mut self, now: Instant) {
        let (Some(timeout), Some(sweep)) = (self.config.idle_timeout, self.next_idle_sweep) else { return };
        if sweep > now {
            return;
        }
        let idle: Vec<Token> = self
            .connections
            .iter()
            .filter(|(_, connection)| {
                connection.shared.in_flight.load(Ordering::SeqCst) == 0
                    && now.saturating_duration_since(connection.last_heard) >= timeout
            })
            .map(|(token, _)| *token)
            .collect();
        for token in idle {
            self.close(token, Close::Quietly(format!("idle for {timeout:?}")));
        }
        self.next_idle_sweep = (!self.connections.is_empty()).then(|| now + idle_sweep_every(timeout));
    }

    /// Closes the TLS connections whose handshake is late: a client that
    /// opens a connection and never finishes does not keep its place. And
    /// those whose client certificate has ended.
    fn expire_handshakes(&mut self, now: Instant) {
        while let Some(&(deadline, token)) = self.expiries.first() {
            if deadline > now {
                break;
            }
            self.expiries.pop_first();
            if self.connections.contains_key(&token) {
                self.close(token, Close::Violation("the client's certificate has expired".into()));
            }
        }
        while let Some(&(deadline, token)) = self.handshakes.front() {
            if deadline > now {
                return;
            }
            self.handshakes.pop_front();
            if self.connections.get(&token).is_some_and(|connection| connection.wire.is_handshaking()) {
                self.close(token, Close::Violation(format!("no TLS handshake within {HANDSHAKE_TIMEOUT:?}")));
            }
        }
    }

    /// Reads what the socket has, handing each whole request on.
    fn read(&mut self, token: Token) {
        if let Err(close) = self.read_until_blocked(token) {
            self.close(token, close);
        }
    }

    /// Reads and dispatches until the socket is empty, the client must
    /// catch up on its answers, or [`REQUESTS_PER_ROUND`] requests were
    /// dispatched: then the connection goes on in the next round (after the
    /// core's turn), so that no client can hold the loop.
    fn read_until_blocked(&mut self, token: Token) -> Result<(), Close> {
        let mut budget = REQUESTS_PER_ROUND;
        loop {
            let Some(connection) = self.connections.get_mut(&token) else { return Ok(()) };
            if connection.closing || connection.list_blocked {
                return Ok(());
            }
            if connection.unsent() > OUTPUT_PAUSE_BYTES {
                connection.read_paused = true;
                return Ok(());
            }
            connection.read_paused = false;
            if connection.backlog {
                // Whole requests left from an earlier round go first.
                if !self.decode(token, &mut budget)? {
                    if self.connections.get(&token).is_some_and(|connection| !connection.list_blocked) {
                        self.read_again.push(token);
                    }
                    return Ok(());
                }
                continue;
            }
            let handshaking = connection.wire.is_handshaking();
            let before = connection.input.len();
            let read = connection.wire.read(&mut self.scratch, &mut connection.input);
            self.input_bytes += connection.input.len() - before;
            let n = match read {
                Ok(Got::Closed) => return Err(Close::Quietly("client closed the connection".into())),
                Ok(Got::Bytes(n)) => {
                    connection.last_heard = Instant::now();
                    n
                }
                Ok(Got::Nothing) => return Ok(()),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                // A client that fails the handshake (no certificate, another
                // CA's, plain TCP on a TLS port) is refused, not a fault.
                Err(err) if err.kind() == io::ErrorKind::InvalidData => {
                    return Err(Close::Violation(err.to_string()))
                }
                Err(err) => return Err(Close::Quietly(format!("read failed: {err}"))),
            };
            if handshaking && !connection.wire.is_handshaking() {
                // The port's verifier takes user and node certificates: a
                // node is the principal `node/<id>`, which no user name
                // can be (the handler lets it only join as itself).
                let principal = match connection.wire.peer_identity() {
                    Some(fencelock_tls::Identity::User(user)) => Some(user),
                    Some(fencelock_tls::Identity::Node(id)) => Some(fencelock_tls::node_principal(id)),
                    None => None,
                };
                if let Some(user) = principal {
                    debug!(connection.logger, "client authenticated"; "user" => &user);
                    let _ = connection.shared.user.set(user);
                }
                connection.expiry = connection.wire.peer_expiry();
                if let Some(expiry) = connection.expiry {
                    // A certificate checks out for up to a second past its
                    // end (whole seconds): none of its requests is served.
                    if expiry <= Instant::now() {
                        connection.expiry = None;
                        return Err(Close::Violation("the client's certificate has expired".into()));
                    }
                    self.expiries.insert((expiry, token));
                }
            }
            if self.input_bytes > self.config.input_total_max {
                self.shed_input();
            }
            if !self.decode(token, &mut budget)? {
                if self.connections.get(&token).is_some_and(|connection| !connection.list_blocked) {
                    self.read_again.push(token);
                }
                return Ok(());
            }
            // A short read emptied the socket: a later byte is a new edge.
            if n < self.scratch.len() {
                return Ok(());
            }
        }
    }

    /// Decodes and dispatches the whole frames in the connection's input,
    /// at most `budget` of them. False when the budget ran out first (the
    /// connection then has a backlog).
    fn decode(&mut self, token: Token, budget: &mut usize) -> Result<bool, Close> {
        let Some(connection) = self.connections.get_mut(&token) else { return Ok(true) };
        let input = std::mem::take(&mut connection.input);
        let mut at = 0;
        let mut result = Ok(());
        let mut backlog = false;
        loop {
            if *budget == 0 || !self.handler.ready() {
                backlog = true;
                break;
            }
            match decode_frame::<Request>(&input[at..], self.config.frame_bytes_max) {
                Ok(None) => break,
                Ok(Some((request, used))) => {
                    let is_list = matches!(request.kind, Some(RequestKind::list(_)));
                    if is_list
                        && self.connections.get(&token).is_some_and(|connection| connection.list_in_flight)
                    {
                        // Its answer may be large: one at a time. Decoded
                        // again once the one in flight is answered.
                        if let Some(connection) = self.connections.get_mut(&token) {
                            connection.list_blocked = true;
                        }
                        backlog = true;
                        break;
                    }
                    *budget -= 1;
                    at += used;
                    if let Err(close) = self.dispatch(token, request) {
                        result = Err(close);
                        break;
                    }
                }
                Err(err @ FrameError::TooLarge { .. }) => {
                    // Tell the client why before closing: it may be a
                    // well-meaning client with a huge request.
                    self.refuse(token, error_response(0, ErrorCode::INVALID_ARGUMENT, err.to_string()));
                    if let Some(connection) = self.connections.get_mut(&token) {
                        if let Some(suppressed) =
                            self.throttle.admit("client closed", connection.remote_ip, Instant::now())
                        {
                            warn!(connection.logger, "closing client connection";
                                "reason" => %err, "suppressed" => suppressed);
                        }
                        connection.closing = true;
                    }
                    at = input.len();
                    break;
                }
                Err(err) => {
                    result = Err(Close::Violation(err.to_string()));
                    break;
                }
            }
        }
        match self.connections.get_mut(&token) {
            Some(connection) => {
                let mut input = input;
                let used = at.min(input.len());
                input.drain(..used);
                self.input_bytes = self.input_bytes.saturating_sub(used);
                connection.input = input;
                connection.backlog = backlog;
            }
            // Closed while its requests were handed on.
            None => self.input_bytes = self.input_bytes.saturating_sub(input.len()),
        }
        result.map(|()| !backlog)
    }

    /// Hands one request on, or refuses it over the in-flight limit.
    fn dispatch(&mut self, token: Token, request: Request) -> Result<(), Close> {
        let at_limit = |connections: &HashMap<Token, Connection, RandomState>| {
            connections.get(&token).is_some_and(|connection| {
                connection.shared.in_flight.load(Ordering::SeqCst) >= self.config.in_flight_max
            })
        };
        if at_limit(&self.connections) {
            // Answers given on this thread wait in the outbox until drained:
            // count them out before refusing.
            self.take_outbox();
        }
        let Some(connection) = self.connections.get(&token) else { return Ok(()) };
        let shared = &connection.shared;
        if shared.in_flight.load(Ordering::SeqCst) >= self.config.in_flight_max {
            let refusal = error_response(
                request.id,
                ErrorCode::UNAVAILABLE,
                format!("more than {} requests in flight on this connection", self.config.in_flight_max),
            );
            self.refuse(token, refusal);
            return Ok(());
        }
        shared.in_flight.fetch_add(1, Ordering::SeqCst);
        let list = matches!(request.kind, Some(RequestKind::list(_)));
        let sink = ResponseSink { id: request.id, connection: Arc::clone(shared), list };
        if list {
            if let Some(connection) = self.connections.get_mut(&token) {
                connection.list_in_flight = true;
            }
        }
        // A handler bug must not take every client connection down with
        // this thread: the connection whose request hit it is closed.
        let handler = &self.handler;
        let handled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.handle(request, sink)));
        if handled.is_err() {
            return Err(Close::Violation("the request handler panicked; see the panic message above".into()));
        }
        Ok(())
    }

    /// Queues a response of the loop's own (not counted in flight).
    fn refuse(&mut self, token: Token, response: Response) {
        let Some(connection) = self.connections.get_mut(&token) else { return };
        let before = connection.output.len();
        encode_frame(&response, &mut connection.output);
        self.output_bytes += connection.output.len() - before;
        self.queue_flush(token);
    }

    fn queue_flush(&mut self, token: Token) {
        if let Some(connection) = self.connections.get_mut(&token) {
            if !connection.flush_queued {
                connection.flush_queued = true;
                self.to_flush.push(token);
            }
        }
    }

    /// Moves every queued response into its connection's output.
    fn take_outbox(&mut self) {
        // Cleared before draining: a response queued after the drain
        // finds the flag clear and wakes the loop again.
        self.shared.wake_pending.store(false, Ordering::SeqCst);
        let mut local = std::mem::take(&mut self.local_spare);
        self.shared.take_local(&mut local);
        for (token, response, list) in local.drain(..) {
            self.deliver(token, &response, list);
        }
        self.local_spare = local;
        while let Ok((token, response, list)) = self.inbox.try_recv() {
            self.deliver(token, &response, list);
        }
        if self.output_bytes > self.config.output_total_max {
            self.shed_output();
        }
    }

    /// Queues `response` for writing on `token`'s connection, if it is
    /// still open.
    fn deliver(&mut self, token: Token, response: &Response, list: bool) {
        let Some(connection) = self.connections.get_mut(&token) else { return };
        connection.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
        let before = connection.output.len();
        encode_frame(response, &mut connection.output);
        self.output_bytes += connection.output.len() - before;
        if list {
            connection.list_in_flight = false;
            if std::mem::take(&mut connection.list_blocked) {
                self.read_again.push(token);
            }
        }
        self.queue_flush(token);
    }

    /// Closes the connections holding the most partial request bytes until
    /// the total is back under [`ClientConfig::input_total_max`].
    fn shed_input(&mut self) {
        let max = self.config.input_total_max;
        while self.input_bytes > max {
            let largest = self.connections.iter().max_by_key(|(_, connection)| connection.input.len());
            let Some((&token, connection)) = largest else { return };
            if connection.input.is_empty() {
                return;
            }
            let reason = format!(
                "partial requests on every connection passed {max} bytes; this one held the most ({})",
                connection.input.len()
            );
            self.close(token, Close::Violation(reason));
        }
    }

    /// Closes the connections holding the most unsent answers (clients
    /// that do not read them) until the total is back under
    /// [`ClientConfig::output_total_max`].
    fn shed_output(&mut self) {
        let max = self.config.output_total_max;
        while self.output_bytes > max {
            let largest = self.connections.iter().max_by_key(|(_, connection)| connection.unsent());
            let Some((&token, connection)) = largest else { return };
            if connection.unsent() == 0 {
                return;
            }
            let reason = format!(
                "unsent answers on every connection passed {max} bytes; this client had not read the most ({})",
                connection.unsent()
            );
            self.close(token, Close::Violation(reason));
        }
    }

    /// Writes out every connection with output, until none is left to
    /// try: a read resumed here can queue more.
    fn flush_queued(&mut self) {
        while !self.to_flush.is_empty() {
            self.flush_once();
            self.take_outbox();
        }
    }

    fn flush_once(&mut self) {
        for token in std::mem::take(&mut self.to_flush) {
            let Some(connection) = self.connections.get_mut(&token) else { continue };
            connection.flush_queued = false;
            let before = connection.unsent();
            let written = write_out(connection);
            self.output_bytes = self.output_bytes.saturating_sub(before - connection.unsent());
            match written {
                Ok(()) => {}
                Err(err) => {
                    self.close(token, Close::Quietly(format!("write failed: {err}")));
                    continue;
                }
            }
            let Some(connection) = self.connections.get(&token) else { continue };
            if connection.closing && connection.unsent() == 0 {
                self.close(token, Close::Quietly("refusal sent".into()));
            } else if connection.read_paused && connection.unsent() <= OUTPUT_PAUSE_BYTES {
                self.read(token);
            }
        }
    }

    fn close(&mut self, token: Token, close: Close) {
        let Some(mut connection) = self.connections.remove(&token) else { return };
        connection.shared.alive.store(false, Ordering::SeqCst);
        self.input_bytes = self.input_bytes.saturating_sub(connection.input.len());
        self.output_bytes = self.output_bytes.saturating_sub(connection.unsent());
        if let Some(count) = self.per_address.get_mut(&connection.remote_ip) {
            *count -= 1;
            if *count == 0 {
                self.per_address.remove(&connection.remote_ip);
            }
        }
        if let Some(expiry) = connection.expiry {
            self.expiries.remove(&(expiry, token));
        }
        let handler = &self.handler;
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.closed(token.0 as u64))).is_err()
        {
            warn!(connection.logger, "the request handler panicked on a closed connection");
        }
        match close {
            Close::Quietly(reason) => {
                debug!(connection.logger, "closing client connection"; "reason" => reason)
            }
            Close::Violation(reason) => {
                if let Some(suppressed) =
                    self.throttle.admit("client closed", connection.remote_ip, Instant::now())
                {
                    warn!(connection.logger, "closing client connection"; "reason" => reason, "suppressed" => suppressed)
                }
            }
        }
        // Best effort: what is already encoded may still fit the socket.
        let _ = write_out(&mut connection);
        let _ = self.poll.registry().deregister(connection.wire.stream());
        connection.wire.shutdown();
    }
}

/// Writes the connection's unsent output until done or the socket is full.
fn write_out(connection: &mut Connection) -> io::Result<()> {
    // TLS records from an earlier write, or the handshake, go first.
    connection.wire.flush()?;
    while connection.written < connection.output.len() {
        match connection.wire.write(&connection.output[connection.written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => connection.written += n,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        }
    }
    if connection.written == connection.output.len() {
        connection.output.clear();
        connection.written = 0;
    } else if connection.written > OUTPUT_PAUSE_BYTES && connection.written * 2 > connection.output.len() {
        // Keep the buffer from growing without bound on a slow reader, once
        // the sent part is the larger half: each byte moves at most once on
        // average.
        connection.output.drain(..connection.written);
        connection.written = 0;
    }
    Ok(())
}
