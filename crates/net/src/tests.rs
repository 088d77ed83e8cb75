//! Tests of the listener's limits and of the peer transport, over real
//! sockets on 127.0.0.1.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{bounded, Sender};
use fencelock_types::client_pb::{ErrorCode, PeerHello, Request, Response, StatusRequest};

use crate::{
    read_frame, write_frame, ClientConfig, ClientListener, Handler, PeerConfig, PeerOutbox, PeerTransport,
    ResponseSink,
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
        in_flight_max,
        frame_bytes_max: 1024,
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

fn connect(addr: SocketAddr) -> TcpStream {
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

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn transport(
    id: u64,
    addrs: &BTreeMap<u64, SocketAddr>,
) -> (PeerTransport, PeerOutbox<PeerHello>, crossbeam_channel::Receiver<PeerHello>) {
    let (in_tx, in_rx) = bounded(64);
    let config = PeerConfig {
        node_id: id,
        listen_addr: addrs[&id],
        peers: addrs.iter().filter(|(peer, _)| **peer != id).map(|(peer, addr)| (*peer, *addr)).collect(),
        client_addr: format!("client-of-{id}"),
        queue_max: 64,
        frame_bytes_max: 1024,
        batch_max: 16,
        reconnect_backoff_min: Duration::from_millis(10),
        reconnect_backoff_max: Duration::from_millis(100),
    };
    // The test's "messages" are hellos; the recipient rides in `node_id`.
    let (transport, outbox) =
        PeerTransport::start(config, |message: &PeerHello| message.node_id, in_tx, &logger()).unwrap();
    (transport, outbox, in_rx)
}

#[test]
fn peers_exchange_messages_and_learn_client_addresses_despite_garbage() {
    let addrs: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
    let (one, one_out, _one_in) = transport(1, &addrs);
    let (_two, _two_out, two_in) = transport(2, &addrs);

    // Garbage on node 2's peer port is closed and forgotten.
    let mut garbage = connect(addrs[&2]);
    std::io::Write::write_all(&mut garbage, &[0xff; 16]).unwrap();
    let mut rest = Vec::new();
    let _ = garbage.read_to_end(&mut rest);

    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let message = loop {
        // Messages sent before the connection is up may be dropped: resend.
        one_out.send(PeerHello { node_id: 2, client_addr: "payload".into(), ..Default::default() });
        if let Ok(message) = two_in.recv_timeout(Duration::from_millis(50)) {
            break message;
        }
        assert!(std::time::Instant::now() < deadline, "no message crossed");
    };
    assert_eq!(message.client_addr, "payload");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while one.client_addr(2).is_none() {
        assert!(std::time::Instant::now() < deadline, "node 1 never learned node 2's client address");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(one.client_addr(2).as_deref(), Some("client-of-2"));
    // A message for a node that is not a peer is refused, not queued.
    assert!(!one_out.send(PeerHello { node_id: 9, ..Default::default() }));
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
