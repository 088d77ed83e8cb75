//! Tests of the listener's limits and of the node loop's peer side, over
//! real sockets on 127.0.0.1.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{bounded, Sender};
use fencelock_types::client_pb::{ErrorCode, PeerHello, Request, Response, StatusRequest, StatusResponse};
use fencelock_types::hello::{HelloState, PeerReport};

use crate::{
    read_frame, write_frame, ClientAddrs, ClientConfig, ClientListener, Core, Greetings, Handler, NodeIo,
    NodeLoop, PeerBook, PeerConfig, ResponseSink, Route, Turn,
};

fn logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

/// Holds every request unanswered until the test answers it.
#[derive(Default)]
struct Parked(Mutex<Vec<ResponseSink>>);

impl Handler for Arc<Parked> {
    fn handle(&self, _request: Request, sink: ResponseSink) {
        self.0.lock().unwrap().push(sink);
    }
}

fn listener(handler: Arc<dyn Handler>, connections_max: usize, in_flight_max: usize) -> ClientListener {
    let config = ClientConfig {
        listen_addr: "127.0.0.1:0".parse().unwrap(),
        connections_max,
        per_address_max: 1024,
        idle_timeout: None,
        in_flight_max,
        frame_bytes_max: 1024,
        input_total_max: crate::INPUT_TOTAL_MAX,
        output_total_max: crate::OUTPUT_TOTAL_MAX,
        tls: None,
    };
    ClientListener::start(config, handler, &logger()).unwrap()
}

fn status_request(id: u64) -> Request {
    Request {
        id,
        kind: Some(fencelock_types::client_pb::Request_oneof_kind::status(StatusRequest::default())),
        ..Default::default()
    }
}

pub(crate) fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream
}

#[test]
fn requests_over_the_in_flight_limit_are_refused_and_the_rest_answered_by_id() {
    let parked = Arc::new(Parked::default());
    let listener = listener(Arc::new(Arc::clone(&parked)), 8, 2);
    let mut stream = connect(listener.local_addr());
    for id in 1..=3 {
        write_frame(&mut stream, &status_request(id)).unwrap();
    }
    let refusal: Response = read_frame(&mut stream, 1 << 20).unwrap();
    assert_eq!(refusal.id, 3);
    assert_eq!(refusal.get_error().code, ErrorCode::UNAVAILABLE);
    // The two in flight are answered out of order, each with its own id.
    let mut sinks = std::mem::take(&mut *parked.0.lock().unwrap());
    assert_eq!(sinks.len(), 2);
    assert!(sinks.pop().unwrap().send(Response::default()));
    let answer: Response = read_frame(&mut stream, 1 << 20).unwrap();
    assert_eq!(answer.id, 2);
    assert!(sinks.pop().unwrap().send(Response::default()));
    let answer: Response = read_frame(&mut stream, 1 << 20).unwrap();
    assert_eq!(answer.id, 1);
}

#[test]
fn connections_over_the_limit_get_an_error_and_are_closed() {
    let parked = Arc::new(Parked::default());
    let listener = listener(Arc::new(Arc::clone(&parked)), 1, 8);
    let mut first = connect(listener.local_addr());
    write_frame(&mut first, &status_request(1)).unwrap();
    // Once the first is being served, a second is one too many.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while parked.0.lock().unwrap().is_empty() {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut second = connect(listener.local_addr());
    let refusal: Response = read_frame(&mut second, 1 << 20).unwrap();
    assert_eq!(refusal.id, 0);
    assert_eq!(refusal.get_error().code, ErrorCode::UNAVAILABLE);
    let mut rest = Vec::new();
    assert_eq!(second.read_to_end(&mut rest).unwrap(), 0, "closed after the refusal");
}

fn listener_with(handler: Arc<dyn Handler>, tune: impl FnOnce(&mut ClientConfig)) -> ClientListener {
    listener_logging_to(handler, tune, &logger())
}

fn listener_logging_to(
    handler: Arc<dyn Handler>,
    tune: impl FnOnce(&mut ClientConfig),
    logger: &slog::Logger,
) -> ClientListener {
    let mut config = ClientConfig {
        listen_addr: "127.0.0.1:0".parse().unwrap(),
        connections_max: 64,
        per_address_max: 1024,
        idle_timeout: None,
        in_flight_max: 8,
        frame_bytes_max: 1024,
        input_total_max: crate::INPUT_TOTAL_MAX,
        output_total_max: crate::OUTPUT_TOTAL_MAX,
        tls: None,
    };
    tune(&mut config);
    ClientListener::start(config, handler, logger).unwrap()
}

/// Keeps the message of every warning logged.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl slog::Drain for Warnings {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record<'_>, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
        if record.level() == slog::Level::Warning {
            self.0.lock().unwrap().push(record.msg().to_string());
        }
        Ok(())
    }
}

#[test]
fn a_flood_of_bad_connections_from_one_address_logs_a_line_not_a_flood() {
    let warnings = Warnings::default();
    let logger = slog::Logger::root(slog::Drain::fuse(warnings.clone()), slog::o!());
    let listener = listener_logging_to(Arc::new(Echo { padding: 0 }), |_| {}, &logger);
    let started = std::time::Instant::now();
    for _ in 0..200 {
        let mut garbage = connect(listener.local_addr());
        std::io::Write::write_all(&mut garbage, &[0xff; 16]).unwrap();
        let mut rest = Vec::new();
        let _ = garbage.read_to_end(&mut rest);
    }
    // Still serving.
    let mut good = connect(listener.local_addr());
    write_frame(&mut good, &status_request(3)).unwrap();
    let answer: Response = read_frame(&mut good, 1 << 20).unwrap();
    assert_eq!(answer.id, 3);
    let logged = warnings.0.lock().unwrap().clone();
    let closings = logged.iter().filter(|message| message.contains("closing client connection")).count();
    // One line per 10 s of flood (one, unless this machine is very slow).
    let allowed = 1 + started.elapsed().as_secs() as usize / 10;
    assert!(closings >= 1 && closings <= allowed, "200 bad connections logged {closings} lines: {logged:?}");
}

#[test]
fn one_address_gets_at_most_its_share_of_connections() {
    let listener = listener_with(Arc::new(Echo { padding: 0 }), |config| config.per_address_max = 2);
    let mut held: Vec<TcpStream> = (0..2).map(|_| connect(listener.local_addr())).collect();
    for (id, stream) in held.iter_mut().enumerate() {
        write_frame(stream, &status_request(id as u64 + 1)).unwrap();
        let answer: Response = read_frame(stream, 1 << 20).unwrap();
        assert_eq!(answer.id, id as u64 + 1);
    }
    let mut third = connect(listener.local_addr());
    let refusal: Response = read_frame(&mut third, 1 << 20).unwrap();
    assert_eq!((refusal.id, refusal.get_error().code), (0, ErrorCode::UNAVAILABLE));
    assert!(refusal.get_error().message.contains("from this address"), "{refusal:?}");
    // A place freed is a place taken again.
    drop(held.pop());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut again = connect(listener.local_addr());
        write_frame(&mut again, &status_request(7)).unwrap();
        let answer: Response = read_frame(&mut again, 1 << 20).unwrap();
        if answer.id == 7 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the freed place was never given again");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_idle_connection_is_closed_and_a_busy_or_waiting_one_is_not() {
    let parked = Arc::new(Parked::default());
    let handler: Arc<dyn Handler> = Arc::new(Arc::clone(&parked));
    let listener = listener_with(handler, |config| config.idle_timeout = Some(Duration::from_millis(300)));
    let mut idle = connect(listener.local_addr());
    // One whose request waits for its answer (a waiting acquire, say).
    let mut waiting = connect(listener.local_addr());
    write_frame(&mut waiting, &status_request(1)).unwrap();
    let started = std::time::Instant::now();
    let mut rest = Vec::new();
    assert_eq!(idle.read_to_end(&mut rest).unwrap(), 0, "the idle connection was closed");
    assert!(started.elapsed() < Duration::from_secs(9));
    // The waiting one is still open: its answer arrives.
    std::thread::sleep(Duration::from_millis(600));
    let sink = parked.0.lock().unwrap().pop().unwrap();
    assert!(sink.send(Response::default()), "the waiting connection was closed");
    let answer: Response = read_frame(&mut waiting, 1 << 20).unwrap();
    assert_eq!(answer.id, 1);
}

#[test]
fn a_too_large_frame_is_answered_then_the_connection_closed_while_others_carry_on() {
    let parked = Arc::new(Parked::default());
    let listener = listener(Arc::new(Arc::clone(&parked)), 8, 8);
    let mut bad = connect(listener.local_addr());
    std::io::Write::write_all(&mut bad, &[0, 1, 0, 0]).unwrap();
    let refusal: Response = read_frame(&mut bad, 1 << 20).unwrap();
    assert_eq!(refusal.get_error().code, ErrorCode::INVALID_ARGUMENT);
    let mut good = connect(listener.local_addr());
    write_frame(&mut good, &status_request(9)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while parked.0.lock().unwrap().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the good connection was not served");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Answers every request at once, on the event loop, with a response of
/// about `padding` bytes.
struct Echo {
    padding: usize,
}

impl Handler for Echo {
    fn handle(&self, request: Request, sink: ResponseSink) {
        let message = "x".repeat(self.padding);
        assert!(sink.send(crate::error_response(request.id, ErrorCode::INTERNAL, message)));
    }
}

#[test]
fn frames_split_across_reads_and_many_in_one_write_are_all_answered_in_order() {
    let listener = listener(Arc::new(Echo { padding: 0 }), 8, 64);
    let mut stream = connect(listener.local_addr());
    let mut bytes = Vec::new();
    for id in 1..=40 {
        crate::encode_frame(&status_request(id), &mut bytes);
    }
    // The first quarter a byte at a time, the rest in one write.
    let split = bytes.len() / 4;
    for byte in &bytes[..split] {
        std::io::Write::write_all(&mut stream, std::slice::from_ref(byte)).unwrap();
        std::io::Write::flush(&mut stream).unwrap();
    }
    std::io::Write::write_all(&mut stream, &bytes[split..]).unwrap();
    for id in 1..=40 {
        let answer: Response = read_frame(&mut stream, 1 << 20).unwrap();
        assert_eq!(answer.id, id);
    }
}

#[test]
fn a_client_that_does_not_read_is_paused_without_stalling_others_and_resumed_when_it_reads() {
    let listener = listener(Arc::new(Echo { padding: 4096 }), 8, 64);
    let mut lazy = connect(listener.local_addr());
    // About 8 MiB of answers: far past the socket buffers and the pause
    // threshold, so the loop must stop reading this client and start again.
    let requests = 2_000u64;
    let writer_stream = lazy.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let mut writer_stream = writer_stream;
        for id in 1..=requests {
            write_frame(&mut writer_stream, &status_request(id)).unwrap();
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    // Meanwhile another client is served.
    let mut other = connect(listener.local_addr());
    write_frame(&mut other, &status_request(7)).unwrap();
    let answer: Response = read_frame(&mut other, 1 << 20).unwrap();
    assert_eq!(answer.id, 7);
    // Now the lazy client reads, and gets every answer (none refused).
    let mut answered = std::collections::BTreeSet::new();
    for _ in 1..=requests {
        let answer: Response = read_frame(&mut lazy, 1 << 20).unwrap();
        assert_eq!(answer.get_error().code, ErrorCode::INTERNAL, "the handler's answer, not a refusal");
        assert!(answered.insert(answer.id), "answered twice: {}", answer.id);
    }
    assert_eq!(answered, (1..=requests).collect());
    writer.join().unwrap();
}

#[test]
fn a_frame_that_does_not_decode_closes_only_its_connection() {
    let listener = listener(Arc::new(Echo { padding: 0 }), 8, 8);
    let mut bad = connect(listener.local_addr());
    std::io::Write::write_all(&mut bad, &[0, 0, 0, 3, 0xff, 0xff, 0xff]).unwrap();
    let mut rest = Vec::new();
    assert_eq!(bad.read_to_end(&mut rest).unwrap(), 0, "closed without an answer");
    let mut good = connect(listener.local_addr());
    write_frame(&mut good, &status_request(3)).unwrap();
    let answer: Response = read_frame(&mut good, 1 << 20).unwrap();
    assert_eq!(answer.id, 3);
}

#[test]
fn a_stopped_listener_refuses_new_connections_and_serves_open_ones() {
    let listener = listener(Arc::new(Echo { padding: 0 }), 8, 8);
    let mut open = connect(listener.local_addr());
    write_frame(&mut open, &status_request(1)).unwrap();
    let _: Response = read_frame(&mut open, 1 << 20).unwrap();
    listener.stop_accepting();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(listener.local_addr()).is_ok() {
        assert!(std::time::Instant::now() < deadline, "still accepting");
        std::thread::sleep(Duration::from_millis(5));
    }
    write_frame(&mut open, &status_request(2)).unwrap();
    let answer: Response = read_frame(&mut open, 1 << 20).unwrap();
    assert_eq!(answer.id, 2);
}

/// A port no other test of this process is given, outside the ephemeral
/// range: a port bound at 0 and dropped could be taken by a peer's outgoing
/// connection before its node binds it (CI failed on that, AddrInUse).
pub(crate) fn free_addr() -> SocketAddr {
    fencelock_launch::free_addr().expect("a free port")
}

/// The test's peer message: from `node_id` to `leader_id`, carrying `role`.
pub(crate) type Msg = StatusResponse;

/// A node loop's core for tests: hands inbound messages to a channel,
/// sends what the test queues (reporting whether each was taken), counts
/// its turns, and stops when told.
struct Relay {
    outbound: crossbeam_channel::Receiver<Msg>,
    taken: Sender<bool>,
    inbound: Sender<Msg>,
    turns: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    /// Milliseconds to sleep in the next turn, holding the loop.
    hold_ms: Arc<AtomicU64>,
    wait: Duration,
}

impl Core<Msg> for Relay {
    fn turn(&mut self, inbound: &mut Vec<Msg>, io: &mut NodeIo<'_, Msg>) -> Turn {
        self.turns.fetch_add(1, Ordering::SeqCst);
        let hold = self.hold_ms.swap(0, Ordering::SeqCst);
        if hold > 0 {
            std::thread::sleep(Duration::from_millis(hold));
        }
        for message in inbound.drain(..) {
            let _ = self.inbound.send(message);
        }
        for message in self.outbound.try_iter() {
            let _ = self.taken.send(io.send(message));
        }
        if self.stop.load(Ordering::SeqCst) {
            Turn::Stop
        } else {
            Turn::Wait(self.wait)
        }
    }
}

/// A running test node: its loop and the ends of its relay's channels.
pub(crate) struct TestNode {
    pub(crate) node: NodeLoop,
    pub(crate) outbound: Sender<Msg>,
    pub(crate) taken: crossbeam_channel::Receiver<bool>,
    pub(crate) inbound: crossbeam_channel::Receiver<Msg>,
    pub(crate) turns: Arc<AtomicUsize>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) hold_ms: Arc<AtomicU64>,
    pub(crate) client_addrs: ClientAddrs,
    pub(crate) greetings: Greetings,
    /// The other nodes' addresses, to change while the node runs.
    pub(crate) book: PeerBook,
}

impl TestNode {
    /// Queues `message` and waits for the core to take it or drop it.
    pub(crate) fn send(&self, message: Msg) -> bool {
        self.outbound.send(message).unwrap();
        self.node.waker().wake();
        self.taken.recv_timeout(Duration::from_secs(10)).expect("the core never ran")
    }

    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        self.node.waker().wake();
        self.node.join().unwrap();
    }
}

fn node(id: u64, addrs: &BTreeMap<u64, SocketAddr>, output_bytes_max: usize) -> TestNode {
    node_with(id, addrs, output_bytes_max, Arc::new(Immediate), None)
}

/// A test node; with `tls`, both its ports speak TLS with node `id`'s
/// certificate from that directory.
pub(crate) fn node_with(
    id: u64,
    addrs: &BTreeMap<u64, SocketAddr>,
    output_bytes_max: usize,
    handler: Arc<dyn Handler>,
    tls: Option<&fencelock_tls::Layout>,
) -> TestNode {
    let tls = tls.map(|layout| fencelock_tls::node_tls(layout, id).unwrap());
    let (outbound_tx, outbound_rx) = crossbeam_channel::unbounded();
    let (taken_tx, taken_rx) = crossbeam_channel::unbounded();
    let (inbound_tx, inbound_rx) = crossbeam_channel::unbounded();
    let turns = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let hold_ms = Arc::new(AtomicU64::new(0));
    let relay = Relay {
        outbound: outbound_rx,
        taken: taken_tx,
        inbound: inbound_tx,
        turns: Arc::clone(&turns),
        stop: Arc::clone(&stop),
        hold_ms: Arc::clone(&hold_ms),
        wait: Duration::from_millis(10),
    };
    let clients = ClientConfig {
        listen_addr: "127.0.0.1:0".parse().unwrap(),
        connections_max: 8,
        per_address_max: 1024,
        idle_timeout: None,
        in_flight_max: 8,
        frame_bytes_max: 1024,
        input_total_max: crate::INPUT_TOTAL_MAX,
        output_total_max: crate::OUTPUT_TOTAL_MAX,
        tls: tls.as_ref().map(|tls| Arc::clone(&tls.client_server).into()),
    };
    let peers = PeerConfig {
        node_id: id,
        listen_addr: addrs[&id],
        peers: PeerBook::new(
            addrs
                .iter()
                .filter(|(peer, _)| **peer != id)
                .map(|(peer, addr)| (*peer, addr.to_string()))
                .collect(),
        ),
        client_addr: format!("client-of-{id}"),
        frame_bytes_max: 1024,
        message_bytes_max: 64 * 1024,
        output_bytes_max,
        reconnect_backoff_min: Duration::from_millis(10),
        reconnect_backoff_max: Duration::from_millis(100),
        greetings: Greetings::new(),
        tls: tls.map(|tls| crate::PeerTls { accept: tls.peer_server.into(), dial: tls.peer_client.into() }),
        precheck: refuse_forbidden,
    };
    let greetings = peers.greetings.clone();
    let book = peers.peers.clone();
    let client_addrs = ClientAddrs::new();
    let node = NodeLoop::start(
        clients,
        peers,
        |message: &Msg| Route { from: message.node_id, to: message.leader_id },
        handler,
        |_waker| Box::new(relay) as Box<dyn Core<Msg>>,
        client_addrs.clone(),
        &logger(),
    )
    .unwrap();
    TestNode {
        node,
        outbound: outbound_tx,
        taken: taken_rx,
        inbound: inbound_rx,
        turns,
        stop,
        hold_ms,
        client_addrs,
        greetings,
        book,
    }
}

/// Answers every request after 20 µs of work.
struct Slow;

impl Handler for Slow {
    fn handle(&self, request: Request, sink: ResponseSink) {
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_micros(20) {
            std::hint::spin_loop();
        }
        sink.send(crate::error_response(request.id, ErrorCode::INTERNAL, "answered"));
    }
}

/// Answers every request at once.
pub(crate) struct Immediate;

impl Handler for Immediate {
    fn handle(&self, request: Request, sink: ResponseSink) {
        sink.send(crate::error_response(request.id, ErrorCode::INTERNAL, "answered"));
    }
}

/// A test message from node `from` to node `to`.
pub(crate) fn msg(from: u64, to: u64, payload: &str) -> Msg {
    Msg { node_id: from, leader_id: to, role: payload.into(), ..Default::default() }
}

/// Sends `payload` from node `from` to node `to` until it arrives there.
pub(crate) fn deliver(from: (u64, &TestNode), to: u64, payload: &str, at: &TestNode) -> Msg {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        // Messages sent before the connection is up are dropped: resend.
        from.1.send(msg(from.0, to, payload));
        if let Ok(message) = at.inbound.recv_timeout(Duration::from_millis(50)) {
            return message;
        }
        assert!(std::time::Instant::now() < deadline, "no message crossed");
    }
}

#[test]
fn peers_exchange_messages_and_learn_client_addresses_despite_garbage() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
    let one = node(1, &addrs, 1 << 20);
    let two = node(2, &addrs, 1 << 20);

    // Garbage on node 2's peer port is closed and forgotten.
    let mut garbage = connect(addrs[&2]);
    std::io::Write::write_all(&mut garbage, &[0xff; 16]).unwrap();
    let mut rest = Vec::new();
    let _ = garbage.read_to_end(&mut rest);

    assert_eq!(deliver((1, &one), 2, "payload", &two).role, "payload");
    assert_eq!(deliver((2, &two), 1, "back", &one).role, "back");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while one.client_addrs.get(2).is_none() {
        assert!(std::time::Instant::now() < deadline, "node 1 never learned node 2's client address");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(one.client_addrs.get(2).as_deref(), Some("client-of-2"));
    // A message for a node that is not a peer is refused, not queued.
    assert!(!one.send(msg(1, 9, "nobody")));
    // The client side of the same loop answers too.
    let mut client = connect(one.node.client_addr());
    write_frame(&mut client, &status_request(5)).unwrap();
    let answer: Response = read_frame(&mut client, 1 << 20).unwrap();
    assert_eq!(answer.id, 5);
}

#[test]
fn a_peer_named_by_host_name_is_resolved_and_reached() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
    let one = node(1, &addrs, 1 << 20);
    let two = node(2, &addrs, 1 << 20);
    one.book.set([(2, format!("localhost:{}", addrs[&2].port()))].into_iter().collect());
    // Node 1 now dials "localhost" (resolved off the loop); what it had
    // sent before may or may not have arrived, so only fresh ones count.
    assert_eq!(deliver((1, &one), 2, "by name", &two).role, "by name");
    // A name that does not resolve is retried, and costs nothing else.
    one.book.set([(2, "no-such-host.invalid:7001".to_owned())].into_iter().collect());
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(deliver((2, &two), 1, "still served", &one).role, "still served");
    one.book.set([(2, addrs[&2].to_string())].into_iter().collect());
    assert_eq!(deliver((1, &one), 2, "back by address", &two).role, "back by address");
}

#[test]
fn peers_added_to_the_book_are_reached_and_removed_ones_are_refused() {
    let addrs: BTreeMap<u64, SocketAddr> =
        [(1, free_addr()), (2, free_addr()), (3, free_addr())].into_iter().collect();
    let two_only: BTreeMap<u64, SocketAddr> =
        addrs.iter().filter(|(id, _)| **id != 3).map(|(id, a)| (*id, *a)).collect();
    let one = node(1, &two_only, 1 << 20);
    let three = node(3, &addrs, 1 << 20);
    assert!(!one.send(msg(1, 3, "not a peer yet")), "a message for a stranger was queued");
    // Node 3 is not in node 1's book: its hello to node 1 is refused.
    three.send(msg(3, 1, "refused"));
    std::thread::sleep(Duration::from_millis(300));
    assert!(one.inbound.try_recv().is_err(), "a message from a node not in the book arrived");
    one.book.set(addrs.iter().filter(|(id, _)| **id != 1).map(|(id, a)| (*id, a.to_string())).collect());
    assert_eq!(deliver((1, &one), 3, "welcome", &three).role, "welcome");
    assert_eq!(deliver((3, &three), 1, "thanks", &one).role, "thanks");
    // Removed again: nothing more goes to it, and its connection is refused.
    one.book.set(two_only.iter().filter(|(id, _)| **id != 1).map(|(id, a)| (*id, a.to_string())).collect());
    std::thread::sleep(Duration::from_millis(100));
    assert!(!one.send(msg(1, 3, "gone")));
    while one.inbound.try_recv().is_ok() {}
    // Node 3's connection to node 1 stays open until it reconnects; a new
    // one is refused at its hello.
    let mut rogue = connect(addrs[&1]);
    write_frame(&mut rogue, &PeerHello { node_id: 3, client_addr: "x".into(), ..Default::default() })
        .unwrap();
    let mut rest = Vec::new();
    assert_eq!(rogue.read_to_end(&mut rest).unwrap(), 0, "closed");
    one.stop();
    three.stop();
}

#[test]
fn a_frame_over_the_limit_closes_only_that_peer_connection() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
    let one = node(1, &addrs, 1 << 20);
    let two = node(2, &addrs, 1 << 20);
    let mut rogue = connect(addrs[&2]);
    write_frame(&mut rogue, &PeerHello { node_id: 1, client_addr: "rogue".into(), ..Default::default() })
        .unwrap();
    // Over node 2's 1024-byte frame limit.
    write_frame(&mut rogue, &msg(1, 2, &"x".repeat(4096))).unwrap();
    let mut rest = Vec::new();
    assert_eq!(rogue.read_to_end(&mut rest).unwrap(), 0, "closed");
    assert!(two.inbound.try_recv().is_err(), "the oversized message was not delivered");
    // The real peer's connection carries on.
    assert_eq!(deliver((1, &one), 2, "still here", &two).role, "still here");
}

#[test]
fn a_message_larger_than_a_frame_travels_in_parts_and_one_over_the_message_limit_is_refused() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
    let one = node(1, &addrs, 1 << 20);
    let two = node(2, &addrs, 1 << 20);
    // 20 KiB against 1,024-byte frames: about 40 parts, put together whole.
    let large = "y".repeat(20 * 1024);
    assert_eq!(deliver((1, &one), 2, &large, &two).role, large);
    // Parts that add up past node 2's 64 KiB message limit close the
    // connection before the rest is held.
    let mut rogue = connect(addrs[&2]);
    write_frame(&mut rogue, &PeerHello { node_id: 1, client_addr: "rogue".into(), ..Default::default() })
        .unwrap();
    // Under the limit, parts from any writer are put together...
    let mut parts = Vec::new();
    crate::encode_parts(&msg(1, 2, &"w".repeat(30 * 1024)), &mut parts, 1000);
    std::io::Write::write_all(&mut rogue, &parts).unwrap();
    let under = two.inbound.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(under.role.len(), 30 * 1024);
    // ...over it, the connection is closed.
    parts.clear();
    crate::encode_parts(&msg(1, 2, &"z".repeat(100 * 1024)), &mut parts, 1000);
    let _ = std::io::Write::write_all(&mut rogue, &parts);
    let mut rest = Vec::new();
    // Closed by the node (an end of file or a reset), not left open until
    // the read times out.
    if let Err(err) = rogue.read_to_end(&mut rest) {
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "the connection was not closed");
    }
    assert!(two.inbound.try_recv().is_err(), "the oversized message was delivered");
    // The real peer's connection carries on, parts and all.
    assert_eq!(deliver((1, &one), 2, &large, &two).role, large);
}

/// The test nodes' precheck: a message whose bytes say `forbidden` is not
/// decoded.
fn refuse_forbidden(bytes: &[u8]) -> Result<(), String> {
    match bytes.windows(9).any(|window| window == b"forbidden") {
        true => Err("it says forbidden".into()),
        false => Ok(()),
    }
}

#[test]
fn a_message_the_precheck_refuses_is_never_decoded_whole_or_in_parts() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
    let one = node(1, &addrs, 1 << 20);
    let two = node(2, &addrs, 1 << 20);
    let hello = PeerHello { node_id: 1, client_addr: "rogue".into(), ..Default::default() };
    // One frame (under the nodes' 1,024-byte frames), then a message in
    // parts (the check runs on the whole).
    for (len, part_max) in [(100, 1000), (3000, 1000)] {
        let mut rogue = connect(addrs[&2]);
        write_frame(&mut rogue, &hello).unwrap();
        let mut bytes = Vec::new();
        let role = format!("{}forbidden", "x".repeat(len));
        crate::encode_parts(&msg(1, 2, &role), &mut bytes, part_max);
        let _ = std::io::Write::write_all(&mut rogue, &bytes);
        let mut rest = Vec::new();
        if let Err(err) = rogue.read_to_end(&mut rest) {
            assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "the connection was not closed");
        }
        assert!(two.inbound.try_recv().is_err(), "a refused message of {len} bytes was delivered");
    }
    assert_eq!(deliver((1, &one), 2, "genuine", &two).role, "genuine");
}

#[test]
fn a_connection_that_is_not_a_peer_or_lies_about_its_messages_is_closed() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
    let one = node(1, &addrs, 1 << 20);
    let two = node(2, &addrs, 1 << 20);
    let impostors = [
        // A hello from a node that is not in the configuration.
        (PeerHello { node_id: 7, ..Default::default() }, msg(7, 2, "stranger")),
        // A peer's hello, then a message from another node.
        (PeerHello { node_id: 1, ..Default::default() }, msg(3, 2, "spoofed")),
        // A peer's hello, then a message for another node.
        (PeerHello { node_id: 1, ..Default::default() }, msg(1, 9, "misrouted")),
    ];
    for (hello, message) in impostors {
        let mut rogue = connect(addrs[&2]);
        write_frame(&mut rogue, &hello).unwrap();
        write_frame(&mut rogue, &message).unwrap();
        let mut rest = Vec::new();
        assert_eq!(rogue.read_to_end(&mut rest).unwrap(), 0, "{} was not closed", message.role);
    }
    assert!(two.inbound.try_recv().is_err(), "an impostor's message was delivered");
    assert_eq!(two.client_addrs.get(7), None, "a stranger's address was recorded");
    assert_eq!(deliver((1, &one), 2, "genuine", &two).role, "genuine");
}

#[test]
fn a_burst_of_peer_messages_larger_than_a_round_arrives_whole_and_in_order() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
    let one = node(1, &addrs, 1 << 20);
    // Node 2 speaks from a plain socket: 4.5 MB at once, while node 1's
    // loop is held, so that the socket is full when it reads: many of the
    // loop's rounds (one read each in tests) to read it all, each ending
    // with bytes still waiting and no new edge to announce them.
    let mut two = connect(addrs[&1]);
    one.hold_ms.store(300, Ordering::SeqCst);
    one.node.waker().wake();
    let mut burst = Vec::new();
    crate::encode_frame(&PeerHello { node_id: 2, ..Default::default() }, &mut burst);
    for n in 0..5_000u64 {
        crate::encode_frame(&msg(2, 1, &format!("{n:0>900}")), &mut burst);
    }
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut two, &burst).map(|()| two));
    for n in 0..5_000u64 {
        let message = one.inbound.recv_timeout(Duration::from_secs(10)).expect("the burst stalled");
        assert_eq!(message.role, format!("{n:0>900}"));
    }
    drop(writer.join().unwrap().unwrap());
}

/// Waits until `node` has a hello from `peer` that satisfies `check`.
fn heard_from(node: &TestNode, peer: u64, check: impl Fn(&PeerReport) -> bool) -> PeerReport {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(heard) = node.greetings.heard().get(&peer) {
            if check(heard) {
                return heard.clone();
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no such hello from {peer}: {:?}",
            node.greetings.heard()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn hellos_say_what_the_caller_knows_when_it_connects() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
    // Node 2 is not up yet, so node 1's first hello is built after this.
    let one = node(1, &addrs, 1 << 20);
    one.greetings.set_own(HelloState {
        term: 7,
        last_index: 42,
        known: [2].into_iter().collect(),
        voters: vec![1, 2],
        applied: 40,
        ..HelloState::default()
    });
    let two = node(2, &addrs, 1 << 20);
    let heard = heard_from(&two, 1, |_| true);
    // The hello says the command level of the caller's build too.
    assert_eq!(
        heard,
        PeerReport {
            knows_you: true,
            term: 7,
            last_index: 42,
            level: fencelock_types::LEVEL,
            named: false,
            voters: vec![1, 2],
            applied: 40,
        }
    );
    let hellos = two.greetings.hellos();
    assert!(hellos >= 1);
    // Node 2 knows nothing of node 1 and says so.
    assert_eq!(
        heard_from(&one, 2, |_| true),
        PeerReport { level: fencelock_types::LEVEL, ..PeerReport::default() }
    );
    // A connection opened later says what is true then.
    one.greetings.set_own(HelloState { term: 9, last_index: 50, ..HelloState::default() });
    two.stop();
    let two = node(2, &addrs, 1 << 20);
    let heard = heard_from(&two, 1, |_| true);
    assert_eq!(
        heard,
        PeerReport {
            knows_you: false,
            term: 9,
            last_index: 50,
            level: fencelock_types::LEVEL,
            named: false,
            ..PeerReport::default()
        }
    );
}

#[test]
fn a_hello_naming_another_cluster_is_refused_once_this_node_knows_its_own() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
    let two = node(2, &addrs, 1 << 20);
    let hello =
        |cluster_id: &[u8]| PeerHello { node_id: 1, cluster_id: cluster_id.to_vec(), ..Default::default() };
    let closed = |hello: PeerHello| {
        let mut rogue = connect(addrs[&2]);
        rogue.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        write_frame(&mut rogue, &hello).unwrap();
        write_frame(&mut rogue, &msg(1, 2, "foreign")).unwrap();
        let mut rest = Vec::new();
        matches!(rogue.read_to_end(&mut rest), Ok(0))
    };
    // Node 2 has no name yet: it listens to anyone's hello.
    assert!(!closed(hello(&[9; 16])));
    assert_eq!(two.inbound.recv_timeout(Duration::from_secs(10)).unwrap().role, "foreign");
    two.greetings.set_cluster_id(&[1; 16]);
    assert!(closed(hello(&[9; 16])), "another cluster's hello was taken");
    assert!(two.inbound.try_recv().is_err(), "another cluster's message was delivered");
    // Its own cluster's is taken.
    assert!(!closed(hello(&[1; 16])));
    assert_eq!(two.inbound.recv_timeout(Duration::from_secs(10)).unwrap().role, "foreign");
    // A node that names no cluster (blank, or one that hides its id) is
    // taken, and its messages, but clients are never sent to the address
    // it announces.
    let mut blank = connect(addrs[&2]);
    write_frame(&mut blank, &PeerHello { client_addr: "127.0.0.1:46999".into(), ..hello(&[]) }).unwrap();
    write_frame(&mut blank, &msg(1, 2, "from a blank node")).unwrap();
    assert_eq!(two.inbound.recv_timeout(Duration::from_secs(10)).unwrap().role, "from a blank node");
    assert_eq!(two.client_addrs.get(1), None, "a node that named no cluster was made a redirect target");
    drop(blank);
    // And its own hellos name the cluster.
    let one = node(1, &addrs, 1 << 20);
    one.greetings.set_cluster_id(&[1; 16]);
    assert_eq!(deliver((1, &one), 2, "same cluster", &two).role, "same cluster");
}

#[test]
fn a_stranger_naming_a_cluster_is_refused_but_noted_while_this_node_knows_no_cluster() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
    let two = node(2, &addrs, 1 << 20);
    let hello = |node_id: u64, cluster_id: &[u8], client_addr: &str| PeerHello {
        node_id,
        cluster_id: cluster_id.to_vec(),
        client_addr: client_addr.to_owned(),
        ..Default::default()
    };
    let refused = |hello: PeerHello| {
        let mut rogue = connect(addrs[&2]);
        rogue.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write_frame(&mut rogue, &hello).unwrap();
        let mut rest = Vec::new();
        matches!(rogue.read_to_end(&mut rest), Ok(0))
    };
    // A stranger without a cluster says nothing worth keeping.
    assert!(refused(hello(7, &[], "127.0.0.1:1")));
    assert!(two.greetings.strangers().is_empty());
    // A running cluster's node (the cluster added node 2): refused as a
    // peer, and noted with the client address it serves on.
    let before = two.greetings.hellos();
    assert!(refused(hello(4, &[5; 16], "127.0.0.1:7104")));
    assert_eq!(two.greetings.strangers().get(&4).map(|(_, addr)| addr.as_str()), Some("127.0.0.1:7104"));
    assert!(two.greetings.hellos() > before, "the loop would not look at it");
    assert!(two.inbound.try_recv().is_err());
    // A flood of them is bounded.
    for id in 100..140 {
        assert!(refused(hello(id, &[5; 16], "127.0.0.1:1")));
    }
    assert!(two.greetings.strangers().len() <= 8, "{:?}", two.greetings.strangers());
    // Once node 2 knows its cluster, strangers are no longer its business.
    let three_addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (3, free_addr())].into_iter().collect();
    let three = node(3, &three_addrs, 1 << 20);
    three.greetings.set_cluster_id(&[1; 16]);
    let mut rogue = connect(three_addrs[&3]);
    rogue.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write_frame(&mut rogue, &hello(9, &[5; 16], "127.0.0.1:9")).unwrap();
    assert!(matches!(rogue.read_to_end(&mut Vec::new()), Ok(0)));
    assert!(three.greetings.strangers().is_empty());
}

#[test]
fn strangers_holding_peer_connections_do_not_crowd_out_the_peers_and_are_bounded() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
    let two = node(2, &addrs, 1 << 20);
    // Silent connections, far more than node 2 holds at once (two per peer
    // and 8 that have not said their hello).
    let started = std::time::Instant::now();
    let mut silent: Vec<TcpStream> = (0..50).map(|_| connect(addrs[&2])).collect();
    for stream in &silent {
        stream.set_nonblocking(true).unwrap();
    }
    // The oldest are closed as the newest come, long before any of them
    // could time out (its hello is due within 2 s, in unit tests).
    let mut closed = 0;
    while started.elapsed() < Duration::from_millis(1_500) {
        closed = silent
            .iter_mut()
            .map(|stream| matches!(stream.read(&mut [0u8; 1]), Ok(0)))
            .filter(|closed| *closed)
            .count();
        if closed >= 40 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(closed >= 40, "node 2 held {} silent connections", 50 - closed);
    // And a real peer gets through the crowd.
    let one = node(1, &addrs, 1 << 20);
    assert_eq!(deliver((1, &one), 2, "through the crowd", &two).role, "through the crowd");
}

#[test]
fn a_restarted_peer_is_reconnected() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
    let one = node(1, &addrs, 1 << 20);
    let two = node(2, &addrs, 1 << 20);
    assert_eq!(deliver((1, &one), 2, "first", &two).role, "first");
    two.stop();
    let two = node(2, &addrs, 1 << 20);
    assert_eq!(deliver((1, &one), 2, "second", &two).role, "second");
}

#[test]
fn a_peer_that_does_not_read_costs_bounded_output_and_stops_nothing() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
    // Node 2 accepts and never reads, like a stopped process.
    let silent = std::net::TcpListener::bind(addrs[&2]).unwrap();
    let one = node(1, &addrs, 64 * 1024);
    let (accepted_tx, accepted_rx) = bounded(1);
    std::thread::spawn(move || {
        let (stream, _) = silent.accept().unwrap();
        // The test holds the connection open, unread.
        accepted_tx.send(stream).unwrap();
    });
    let payload = "p".repeat(900);
    let big = || msg(1, 2, &payload);
    // Until the connection is up, messages are dropped; after, they are
    // taken until the socket buffers and the 64 KiB of output are full.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !one.send(big()) {
        assert!(std::time::Instant::now() < deadline, "never connected");
        std::thread::sleep(Duration::from_millis(5));
    }
    let _held = accepted_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let mut taken = 1;
    while one.send(big()) {
        taken += 1;
        assert!(taken < 1_000_000, "output to a peer that does not read was never bounded");
    }
    assert!(taken > 10, "took only {taken}");
    // The loop still serves clients, and turns on its own.
    let mut client = connect(one.node.client_addr());
    write_frame(&mut client, &status_request(9)).unwrap();
    let answer: Response = read_frame(&mut client, 1 << 20).unwrap();
    assert_eq!(answer.id, 9);
    let turns = one.turns.load(Ordering::SeqCst);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while one.turns.load(Ordering::SeqCst) <= turns {
        assert!(std::time::Instant::now() < deadline, "the core stopped turning");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_client_that_floods_requests_does_not_starve_the_core() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr())].into_iter().collect();
    // Each request costs the loop 20 µs: the client writes faster than that.
    let one = node_with(1, &addrs, 1 << 20, Arc::new(Slow), None);
    let stream = connect(one.node.client_addr());
    // A reader drains the answers, so the flood is never paused for them.
    let mut reader = stream.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut buffer = vec![0u8; 1 << 16];
        while matches!(reader.read(&mut buffer), Ok(n) if n > 0) {}
    });
    let stop = Arc::new(AtomicBool::new(false));
    let flooding = Arc::clone(&stop);
    let mut writer = stream;
    let (started_tx, started_rx) = bounded(1);
    let flooder = std::thread::spawn(move || {
        let mut burst = Vec::new();
        for id in 0..4_096 {
            crate::encode_frame(&status_request(id), &mut burst);
        }
        while !flooding.load(Ordering::SeqCst) {
            if std::io::Write::write_all(&mut writer, &burst).is_err() {
                return;
            }
            let _ = started_tx.try_send(());
        }
    });
    // Measured from the first burst on, with the flood under way.
    started_rx.recv_timeout(Duration::from_secs(10)).expect("the flood never started");
    let before = one.turns.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(1_000));
    let during = one.turns.load(Ordering::SeqCst) - before;
    stop.store(true, Ordering::SeqCst);
    flooder.join().unwrap();
    // The core asks to be called every 10 ms: a flood may slow that down,
    // never stop it (a leader that stops turning stops sending heartbeats).
    assert!(during >= 10, "the core turned {during} times in 1 s of flood");
}

#[test]
fn a_core_that_stops_ends_the_loop_and_closes_its_clients() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr())].into_iter().collect();
    let one = node(1, &addrs, 1 << 20);
    let mut client = connect(one.node.client_addr());
    write_frame(&mut client, &status_request(1)).unwrap();
    let _: Response = read_frame(&mut client, 1 << 20).unwrap();
    one.stop();
    let mut rest = Vec::new();
    assert_eq!(client.read_to_end(&mut rest).unwrap(), 0, "the connection closed");
}

/// Panics on request 13, answers the others.
struct Unlucky;

impl Handler for Unlucky {
    fn handle(&self, request: Request, sink: ResponseSink) {
        assert_ne!(request.id, 13, "unlucky request");
        assert!(sink.send(crate::error_response(request.id, ErrorCode::INTERNAL, "ok")));
    }
}

#[test]
fn a_handler_that_panics_closes_only_that_connection() {
    let listener = listener(Arc::new(Unlucky), 8, 8);
    let mut unlucky = connect(listener.local_addr());
    write_frame(&mut unlucky, &status_request(13)).unwrap();
    let mut rest = Vec::new();
    assert_eq!(unlucky.read_to_end(&mut rest).unwrap(), 0, "closed without an answer");
    // The event loop lives on: new and old connections are served.
    let mut lucky = connect(listener.local_addr());
    write_frame(&mut lucky, &status_request(7)).unwrap();
    let answer: Response = read_frame(&mut lucky, 1 << 20).unwrap();
    assert_eq!(answer.id, 7);
}

/// Answers every request from another thread, in batches, in reverse order
/// of arrival: as the raft driver does, a turn at a time.
struct Elsewhere(Sender<ResponseSink>);

impl Handler for Elsewhere {
    fn handle(&self, _request: Request, sink: ResponseSink) {
        self.0.send(sink).unwrap();
    }
}

#[test]
fn responses_sent_from_another_thread_all_reach_their_connections() {
    let (sinks_tx, sinks_rx) = crossbeam_channel::unbounded::<ResponseSink>();
    let answerer = std::thread::spawn(move || {
        while let Ok(first) = sinks_rx.recv() {
            let mut turn = vec![first];
            turn.extend(sinks_rx.try_iter());
            for sink in turn.into_iter().rev() {
                let id = sink.id();
                assert!(sink.send(crate::error_response(id, ErrorCode::INTERNAL, format!("answer to {id}"))));
            }
        }
    });
    let listener = listener(Arc::new(Elsewhere(sinks_tx)), 64, 16);
    let addr = listener.local_addr();
    let clients: Vec<_> = (0..16u64)
        .map(|client| {
            std::thread::spawn(move || {
                let mut stream = connect(addr);
                for round in 0..100u64 {
                    // Up to 8 in flight, answered in any order.
                    let ids: Vec<u64> = (0..8).map(|n| client * 1_000_000 + round * 8 + n + 1).collect();
                    for id in &ids {
                        write_frame(&mut stream, &status_request(*id)).unwrap();
                    }
                    let mut answered: Vec<u64> = (0..ids.len())
                        .map(|_| {
                            let answer: Response = read_frame(&mut stream, 1 << 20).unwrap();
                            assert_eq!(answer.get_error().message, format!("answer to {}", answer.id));
                            answer.id
                        })
                        .collect();
                    answered.sort_unstable();
                    assert_eq!(answered, ids);
                }
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    drop(listener);
    drop(answerer);
}

fn list_request(id: u64) -> Request {
    Request {
        id,
        kind: Some(fencelock_types::client_pb::Request_oneof_kind::list(Default::default())),
        ..Default::default()
    }
}

/// Waits until `parked` holds `count` sinks, and a moment more to show that
/// no more come.
fn parked_settles_at(parked: &Parked, count: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while parked.0.lock().unwrap().len() < count {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {count} requests handed on",
            parked.0.lock().unwrap().len()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(parked.0.lock().unwrap().len(), count, "more requests were handed on");
}

#[test]
fn lists_are_handed_on_one_at_a_time_per_connection_and_nothing_is_lost() {
    let parked = Arc::new(Parked::default());
    let listener = listener(Arc::new(Arc::clone(&parked)), 8, 64);
    let mut stream = connect(listener.local_addr());
    let mut other = connect(listener.local_addr());
    for id in 1..=3 {
        write_frame(&mut stream, &list_request(id)).unwrap();
    }
    write_frame(&mut stream, &status_request(4)).unwrap();
    // Another connection's list is not held back by this one's.
    write_frame(&mut other, &list_request(10)).unwrap();
    parked_settles_at(&parked, 2);
    // Each answer lets the next list of that connection go, in order; the
    // status behind the third goes with it.
    for (answered, next, count) in [(1, vec![2], 2), (2, vec![3, 4], 3)] {
        let sink = {
            let mut sinks = parked.0.lock().unwrap();
            let at = sinks.iter().position(|sink| sink.id() == answered).unwrap();
            sinks.remove(at)
        };
        assert!(sink.send(Response::default()));
        let answer: Response = read_frame(&mut stream, 1 << 20).unwrap();
        assert_eq!(answer.id, answered);
        parked_settles_at(&parked, count);
        let ids: Vec<u64> = parked.0.lock().unwrap().iter().map(ResponseSink::id).collect();
        assert!(next.iter().all(|id| ids.contains(id)), "{ids:?}");
    }
}

/// Not ready until the test says so; then hands requests to `parked`.
struct Gated {
    open: AtomicBool,
    parked: Arc<Parked>,
}

impl Handler for Arc<Gated> {
    fn handle(&self, request: Request, sink: ResponseSink) {
        self.parked.handle(request, sink);
    }

    fn ready(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }
}

#[test]
fn a_handler_that_is_not_ready_pushes_back_and_loses_no_request() {
    let gated = Arc::new(Gated { open: AtomicBool::new(false), parked: Arc::new(Parked::default()) });
    let listener = listener(Arc::new(Arc::clone(&gated)), 8, 64);
    let mut stream = connect(listener.local_addr());
    for id in 1..=20 {
        write_frame(&mut stream, &status_request(id)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        gated.parked.0.lock().unwrap().is_empty(),
        "requests were handed to a handler that was not ready"
    );
    gated.open.store(true, Ordering::SeqCst);
    parked_settles_at(&gated.parked, 20);
    let ids: BTreeSet<u64> = gated.parked.0.lock().unwrap().iter().map(ResponseSink::id).collect();
    assert_eq!(ids, (1..=20).collect());
}

/// Answers every request at once with about `padding` bytes, whether or not
/// its connection is still there.
struct Flood {
    padding: usize,
}

impl Handler for Flood {
    fn handle(&self, request: Request, sink: ResponseSink) {
        sink.send(crate::error_response(request.id, ErrorCode::INTERNAL, "x".repeat(self.padding)));
    }
}

/// How many of `streams` the server closed, looking for up to 10 s until
/// at least `wanted` are (what they were sent is read and dropped).
fn closed_by_server(streams: &mut [TcpStream], wanted: usize) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut closed = vec![false; streams.len()];
    let mut buffer = vec![0; 1 << 16];
    while std::time::Instant::now() < deadline && closed.iter().filter(|closed| **closed).count() < wanted {
        for (stream, closed) in streams.iter_mut().zip(&mut closed) {
            if *closed {
                continue;
            }
            stream.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            match stream.read(&mut buffer) {
                Ok(0) => *closed = true,
                Ok(_) => {}
                Err(err)
                    if matches!(
                        err.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => *closed = true,
            }
        }
    }
    closed.iter().filter(|closed| **closed).count()
}

#[test]
fn clients_that_do_not_read_are_closed_once_unsent_answers_pass_the_total_and_others_are_served() {
    let listener = listener_with(Arc::new(Flood { padding: 16 << 10 }), |config| {
        config.in_flight_max = 256;
        config.output_total_max = 1 << 20;
    });
    // Two clients ask for far more than they read (or than the total).
    let mut lazy: Vec<TcpStream> = (0..2).map(|_| connect(listener.local_addr())).collect();
    for stream in &mut lazy {
        let mut bytes = Vec::new();
        for id in 1..=200 {
            crate::encode_frame(&status_request(id), &mut bytes);
        }
        std::io::Write::write_all(stream, &bytes).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    // A client that reads is served meanwhile.
    let mut good = connect(listener.local_addr());
    write_frame(&mut good, &status_request(7)).unwrap();
    let answer: Response = read_frame(&mut good, 1 << 20).unwrap();
    assert_eq!(answer.id, 7);
    // One lazy client at least held more than the total: it was closed.
    let closed = closed_by_server(&mut lazy, 1);
    assert!(closed >= 1, "no client that does not read was closed");
    write_frame(&mut good, &status_request(8)).unwrap();
    let answer: Response = read_frame(&mut good, 1 << 20).unwrap();
    assert_eq!(answer.id, 8);
}

#[test]
fn partial_requests_on_many_connections_are_bounded_in_total_and_others_are_served() {
    let parked = Arc::new(Parked::default());
    let listener = listener_with(Arc::new(Arc::clone(&parked)), |config| {
        config.frame_bytes_max = 1024;
        config.input_total_max = 4096;
    });
    // Each says a 1,000-byte frame comes and sends 900 bytes of it.
    let mut partial: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut stream = connect(listener.local_addr());
            let mut bytes = 1_000u32.to_be_bytes().to_vec();
            bytes.extend(std::iter::repeat_n(0u8, 900));
            std::io::Write::write_all(&mut stream, &bytes).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            stream
        })
        .collect();
    let closed = closed_by_server(&mut partial, 4);
    // 8 × 904 bytes against 4,096: at least four had to go.
    assert!(closed >= 4, "only {closed} of 8 connections holding partial frames were closed");
    let mut good = connect(listener.local_addr());
    write_frame(&mut good, &status_request(1)).unwrap();
    parked_settles_at(&parked, 1);
}

#[test]
fn a_peer_s_announced_client_address_is_forgotten_when_its_connection_closes() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
    let one = node(1, &addrs, 1 << 20);
    // A process claims node 2 and announces a client address: clients of
    // node 1 would be pointed there while it leads.
    let mut claimed = connect(addrs[&1]);
    let hello = PeerHello { node_id: 2, client_addr: "127.0.0.1:46999".into(), ..Default::default() };
    write_frame(&mut claimed, &hello).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while one.client_addrs.get(2).is_none() {
        assert!(std::time::Instant::now() < deadline, "the hello was never taken");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(claimed);
    while one.client_addrs.get(2).is_some() {
        assert!(std::time::Instant::now() < deadline, "a closed connection's address outlived it");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_flood_of_hellos_from_this_cluster_s_unknown_nodes_teaches_the_book_a_bounded_number() {
    // A node of this cluster that the configuration does not name yet is
    // learned from its hello, to be answered; a peer (or, in plain mode,
    // anyone who read the cluster id from a status) naming a thousand such
    // nodes teaches at most 16, and never moves a configured peer.
    let book = PeerBook::new([(2, "10.0.0.2:7001".to_owned())].into_iter().collect());
    for id in 100..1_100u64 {
        book.learn(id, &format!("10.0.9.{}:7001", id % 250));
    }
    book.learn(2, "10.6.6.6:7001");
    book.learn(3, "");
    let peers = book.get();
    assert_eq!(peers.len(), 1 + 16, "{peers:?}");
    assert_eq!(peers.get(&2).map(String::as_str), Some("10.0.0.2:7001"));
    assert!(!book.contains(3), "a hello without an address was learned");
    // A configuration that names a learned node takes it over.
    book.set([(2, "10.0.0.2:7001".to_owned()), (100, "10.0.0.100:7001".to_owned())].into_iter().collect());
    assert_eq!(book.get().get(&100).map(String::as_str), Some("10.0.0.100:7001"));
    assert_eq!(book.get().len(), 1 + 16);
}
