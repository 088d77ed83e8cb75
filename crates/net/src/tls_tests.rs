//! The client listener with TLS, over real sockets on 127.0.0.1: users
//! with a certificate of the cluster's CA are served and known by name;
//! plain TCP, strangers and nodes are refused, and the listener serves on.

#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use fencelock_tls::{client_tls, create_ca, create_client, create_node, node_tls, Layout};
use fencelock_types::client_pb::{ErrorCode, Request, Response, StatusRequest};

use crate::{error_response, read_frame, write_frame, ClientConfig, ClientListener, Handler, ResponseSink};

/// Answers every request with an error whose message names the user.
struct Whoami;

impl Handler for Whoami {
    fn handle(&self, request: Request, sink: ResponseSink) {
        let user = sink.user().unwrap_or("nobody").to_owned();
        sink.send(error_response(request.id, ErrorCode::UNAVAILABLE, user));
    }
}

fn certs(dir: &std::path::Path) -> Layout {
    let layout = Layout::new(dir);
    create_ca(&layout, false).unwrap();
    create_node(&layout, 1, &["127.0.0.1".into()], false).unwrap();
    create_client(&layout, "alice", false).unwrap();
    layout
}

fn start(layout: &Layout) -> ClientListener {
    start_with(layout, Arc::new(Whoami))
}

fn start_with(layout: &Layout, handler: Arc<dyn Handler>) -> ClientListener {
    let config = ClientConfig {
        listen_addr: "127.0.0.1:0".parse().unwrap(),
        connections_max: 8,
        per_address_max: 1024,
        idle_timeout: None,
        in_flight_max: 8,
        frame_bytes_max: 1 << 20,
        input_total_max: crate::INPUT_TOTAL_MAX,
        output_total_max: crate::OUTPUT_TOTAL_MAX,
        tls: Some(node_tls(layout, 1).unwrap().client_server.into()),
    };
    ClientListener::start(config, handler, &slog::Logger::root(slog::Discard, slog::o!())).unwrap()
}

fn status(id: u64) -> Request {
    Request {
        id,
        kind: Some(fencelock_types::client_pb::Request_oneof_kind::status(StatusRequest::default())),
        ..Default::default()
    }
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

fn tls_connect(addr: SocketAddr, config: &Arc<rustls::ClientConfig>) -> Tls {
    let socket = TcpStream::connect(addr).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    rustls::StreamOwned::new(rustls::ClientConnection::new(Arc::clone(config), name).unwrap(), socket)
}

/// One request and its answer: the user the server saw.
fn whoami(stream: &mut Tls) -> Result<String, String> {
    write_frame(stream, &status(7)).map_err(|err| err.to_string())?;
    let answer: Response = read_frame(stream, 1 << 20).map_err(|err| err.to_string())?;
    assert_eq!(answer.id, 7);
    Ok(answer.get_error().message.clone())
}

#[test]
fn a_user_with_a_certificate_of_the_cluster_is_served_and_known_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let layout = certs(dir.path());
    let listener = start(&layout);
    let alice = client_tls(&layout, "alice").unwrap();
    let mut stream = tls_connect(listener.local_addr(), &alice);
    for _ in 0..3 {
        assert_eq!(whoami(&mut stream), Ok("alice".to_owned()));
    }
    // Pipelined requests, answered in one go.
    for id in 0..50 {
        write_frame(&mut stream, &status(id)).unwrap();
    }
    for id in 0..50 {
        let answer: Response = read_frame(&mut stream, 1 << 20).unwrap();
        assert_eq!(answer.id, id);
    }
}

#[test]
fn plain_tcp_and_strangers_are_refused_nodes_are_node_principals_and_the_listener_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let layout = certs(dir.path());
    let listener = start(&layout);
    let addr = listener.local_addr();

    // Plain TCP on the TLS port: the connection closes (after an alert).
    let mut plain = TcpStream::connect(addr).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write_frame(&mut plain, &status(1)).unwrap();
    let mut rest = Vec::new();
    let _ = plain.read_to_end(&mut rest);
    assert!(rest.len() < 16, "plain TCP got an answer: {rest:?}");

    // A client of another cluster's CA.
    let other = tempfile::tempdir().unwrap();
    let other = certs(other.path());
    let mallory = client_tls(&other, "alice").unwrap();
    assert!(whoami(&mut tls_connect(addr, &mallory)).is_err(), "another CA's user was served");

    // A node's certificate is the principal node/<id> (a node that joins
    // as itself; the server's handler lets it do nothing else).
    let node = node_tls(&layout, 1).unwrap().peer_client;
    let mut node_as_client = {
        let socket = TcpStream::connect(addr).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // The listener's certificate names 127.0.0.1, not node-1.fencelock:
        // ask for what it carries, so that only the client check decides.
        let name = fencelock_tls::peer_server_name(1);
        rustls::StreamOwned::new(rustls::ClientConnection::new(node, name).unwrap(), socket)
    };
    assert_eq!(whoami(&mut node_as_client), Ok("node/1".to_owned()));

    // Still serving.
    let alice = client_tls(&layout, "alice").unwrap();
    assert_eq!(whoami(&mut tls_connect(addr, &alice)), Ok("alice".to_owned()));
}

#[test]
fn a_connection_is_closed_when_its_client_certificate_expires() {
    let dir = tempfile::tempdir().unwrap();
    let layout = certs(dir.path());
    fencelock_tls::create_client_for(&layout, "brief", false, Duration::from_secs(2), None).unwrap();
    let listener = start(&layout);
    let brief = client_tls(&layout, "brief").unwrap();
    let mut stream = tls_connect(listener.local_addr(), &brief);
    assert_eq!(whoami(&mut stream), Ok("brief".to_owned()));
    let alice = client_tls(&layout, "alice").unwrap();
    let mut lasting = tls_connect(listener.local_addr(), &alice);
    assert_eq!(whoami(&mut lasting), Ok("alice".to_owned()));
    // The certificate ends within 2 s (whole seconds): the server closes the
    // connection by itself, with nothing asked of it.
    let mut rest = Vec::new();
    let started = std::time::Instant::now();
    let _ = stream.read_to_end(&mut rest);
    assert!(started.elapsed() < Duration::from_secs(9), "the connection outlived its certificate");
    assert!(whoami(&mut stream).is_err());
    // Its certificate is refused from now on; other connections go on.
    assert!(whoami(&mut tls_connect(listener.local_addr(), &brief)).is_err());
    assert_eq!(whoami(&mut lasting), Ok("alice".to_owned()));
}

#[test]
fn peer_connections_end_with_the_peer_certificate() {
    use crate::tests::{deliver, free_addr, msg, node_with, Immediate};

    let dir = tempfile::tempdir().unwrap();
    let layout = cluster_certs(dir.path());
    // Node 2's certificate ends within 2 s.
    fencelock_tls::create_node_for(&layout, 2, &["127.0.0.1".into()], true, Duration::from_secs(2), None)
        .unwrap();
    let addrs: std::collections::BTreeMap<u64, SocketAddr> = (1..=2).map(|id| (id, free_addr())).collect();
    let one = node_with(1, &addrs, 1 << 20, Arc::new(Immediate), Some(&layout));
    let two = node_with(2, &addrs, 1 << 20, Arc::new(Immediate), Some(&layout));
    assert_eq!(deliver((1, &one), 2, "while valid", &two).role, "while valid");
    assert_eq!(deliver((2, &two), 1, "both ways", &one).role, "both ways");
    std::thread::sleep(Duration::from_millis(2_500));
    // Node 1 closed its connection to node 2 when 2's certificate ended,
    // and node 1 closed node 2's connection to it: nothing crosses now,
    // either way, however often it is sent.
    while one.inbound.try_recv().is_ok() || two.inbound.try_recv().is_ok() {}
    for _ in 0..40 {
        one.send(msg(1, 2, "after"));
        two.send(msg(2, 1, "after"));
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(two.inbound.try_recv().is_err(), "a message crossed to a peer whose certificate ended");
    assert!(one.inbound.try_recv().is_err(), "a message came from a peer whose certificate ended");
}

/// Three nodes' certificates (and alice's) in a fresh directory.
fn cluster_certs(dir: &std::path::Path) -> Layout {
    let layout = certs(dir);
    for id in 2..=3 {
        create_node(&layout, id, &["127.0.0.1".into()], false).unwrap();
    }
    layout
}

/// Opens a TLS connection to a peer port as `config` (asking for node
/// `expect`'s name), says `hello` and `message`, and returns whether the
/// node closed the connection.
fn rogue_peer(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    expect: u64,
    hello: &fencelock_types::client_pb::PeerHello,
    message: &crate::tests::Msg,
) -> bool {
    let socket = TcpStream::connect(addr).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let session = rustls::ClientConnection::new(config, fencelock_tls::peer_server_name(expect)).unwrap();
    let mut stream = rustls::StreamOwned::new(session, socket);
    let _ = write_frame(&mut stream, hello).and_then(|()| write_frame(&mut stream, message));
    let mut rest = Vec::new();
    // Closed: end of stream or a TLS error; never a message back.
    matches!(stream.read_to_end(&mut rest), Ok(0) | Err(_))
}

#[test]
fn peers_over_tls_exchange_messages_and_a_hello_must_match_its_certificate() {
    use crate::tests::{deliver, free_addr, msg, node_with, Immediate};
    use fencelock_types::client_pb::PeerHello;

    let dir = tempfile::tempdir().unwrap();
    let layout = cluster_certs(dir.path());
    let addrs: std::collections::BTreeMap<u64, SocketAddr> = (1..=3).map(|id| (id, free_addr())).collect();
    let one = node_with(1, &addrs, 1 << 20, Arc::new(Immediate), Some(&layout));
    let two = node_with(2, &addrs, 1 << 20, Arc::new(Immediate), Some(&layout));
    assert_eq!(deliver((1, &one), 2, "over tls", &two).role, "over tls");
    assert_eq!(deliver((2, &two), 1, "and back", &one).role, "and back");

    // Node 3's own certificate, claiming to be node 1.
    let three = node_tls(&layout, 3).unwrap().peer_client;
    let hello = PeerHello { node_id: 1, ..Default::default() };
    assert!(rogue_peer(addrs[&2], three, 2, &hello, &msg(1, 2, "spoofed")));
    // A user's certificate on the peer port.
    let alice = client_tls(&layout, "alice").unwrap();
    assert!(rogue_peer(addrs[&2], alice, 2, &hello, &msg(1, 2, "user")));
    // Another cluster's node 1.
    let other = tempfile::tempdir().unwrap();
    let other = cluster_certs(other.path());
    let stranger = node_tls(&other, 1).unwrap().peer_client;
    assert!(rogue_peer(addrs[&2], stranger, 2, &hello, &msg(1, 2, "stranger")));
    // Plain TCP on the TLS peer port.
    let mut plain = TcpStream::connect(addrs[&2]).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write_frame(&mut plain, &hello).unwrap();
    let mut rest = Vec::new();
    let _ = plain.read_to_end(&mut rest);
    assert!(rest.len() < 16, "plain TCP got an answer: {rest:?}");

    while let Ok(message) = two.inbound.try_recv() {
        assert!(
            !["spoofed", "user", "stranger"].contains(&message.role.as_str()),
            "{} delivered",
            message.role
        );
    }
    assert_eq!(deliver((1, &one), 2, "still", &two).role, "still");
    one.stop();
    two.stop();
}

/// Counts the requests it is handed.
struct Counting(Arc<std::sync::atomic::AtomicUsize>);

impl Handler for Counting {
    fn handle(&self, request: Request, sink: ResponseSink) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        sink.send(error_response(request.id, ErrorCode::UNAVAILABLE, "counted"));
    }
}

#[test]
fn requests_sent_just_before_a_close_notice_are_still_handed_on() {
    let dir = tempfile::tempdir().unwrap();
    let layout = certs(dir.path());
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let listener = start_with(&layout, Arc::new(Counting(Arc::clone(&count))));
    let alice = client_tls(&layout, "alice").unwrap();
    let mut stream = tls_connect(listener.local_addr(), &alice);
    // Finish the handshake first, so that the requests and the notice go
    // out together.
    assert_eq!(whoami_counted(&mut stream), Ok(()));
    let before = count.load(std::sync::atomic::Ordering::SeqCst);
    let mut bytes = Vec::new();
    for id in 10..13 {
        crate::encode_frame(&status(id), &mut bytes);
    }
    // The requests' records and the notice in one write, so that the
    // listener reads them together.
    std::io::Write::write_all(&mut stream.conn.writer(), &bytes).unwrap();
    stream.conn.send_close_notify();
    let mut records = Vec::new();
    while stream.conn.wants_write() {
        stream.conn.write_tls(&mut records).unwrap();
    }
    std::io::Write::write_all(&mut stream.sock, &records).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while count.load(std::sync::atomic::Ordering::SeqCst) < before + 3 {
        assert!(std::time::Instant::now() < deadline, "requests before the close notice were lost");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn whoami_counted(stream: &mut Tls) -> Result<(), String> {
    write_frame(stream, &status(1)).map_err(|err| err.to_string())?;
    let _: Response = read_frame(stream, 1 << 20).map_err(|err| err.to_string())?;
    Ok(())
}

/// Whether the other side closes `stream` within `within` (an alert or a
/// close notice may come first).
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut rest = Vec::new();
    match stream.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(err) => !matches!(err.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

#[test]
fn a_connection_that_never_finishes_its_handshake_or_hello_is_closed() {
    use crate::tests::{free_addr, node_with, Immediate};

    let dir = tempfile::tempdir().unwrap();
    let layout = certs(dir.path());
    let listener = start(&layout);
    // Silent on the TLS client port: closed after the handshake deadline.
    let mut silent = TcpStream::connect(listener.local_addr()).unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(5)), "a silent client kept its connection");

    // Silent on a peer port, plain or TLS: closed after the hello deadline.
    let addrs: std::collections::BTreeMap<u64, SocketAddr> = (1..=2).map(|id| (id, free_addr())).collect();
    let plain = node_with(1, &addrs, 1 << 20, Arc::new(Immediate), None);
    let mut silent = TcpStream::connect(addrs[&1]).unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(5)), "a silent peer kept its connection");
    plain.stop();
    let certs_dir = tempfile::tempdir().unwrap();
    let layout = cluster_certs(certs_dir.path());
    let addrs: std::collections::BTreeMap<u64, SocketAddr> = (1..=2).map(|id| (id, free_addr())).collect();
    let tls = node_with(1, &addrs, 1 << 20, Arc::new(Immediate), Some(&layout));
    let mut silent = TcpStream::connect(addrs[&1]).unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(5)), "a silent TLS peer kept its connection");
    tls.stop();
}
