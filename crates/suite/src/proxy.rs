//! The fault-injecting TCP proxy between the nodes.
//!
//! Every node is told (through `--peers`) that node B lives at B's proxy,
//! which forwards to B's real peer port. A peer connection opens with a
//! `PeerHello` frame naming the sending node A, so B's proxy learns the
//! direction A→B of each connection from its first frame. While [`Rules`]
//! block A→B, the proxy closes A's connections to B and refuses new ones,
//! which is what a partition looks like to the node loop's peer side: the
//! connection drops and reconnects fail until the partition heals.
//!
//! Only the direction a connection carries is blocked; a partition between
//! A and B blocks both A→B and B→A.
//!
//! Over TLS (`--tls`) the hello is encrypted: the proxy cannot tell who
//! sends, and forwards the connection untouched. The suite refuses TLS with
//! partition faults for that reason.

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use fencelock_types::client_pb::PeerHello;

/// The largest hello frame accepted; a real one is a few dozen bytes.
const HELLO_BYTES_MAX: usize = 4_096;

/// How long a new connection may take to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a forwarding thread looks at the rules when no bytes come:
/// the longest a cut connection may carry on after a partition starts.
const RULE_POLL: Duration = Duration::from_millis(20);

/// Which directed links between nodes are cut, shared by every proxy.
#[derive(Debug, Default)]
pub struct Rules {
    blocked: Mutex<BTreeSet<(u64, u64)>>,
    /// Connections refused at their hello because their link was cut.
    pub refused: AtomicU64,
    /// Established connections closed because their link was cut.
    pub cut: AtomicU64,
}

impl Rules {
    /// Cuts both directions between every node of `left` and every node of
    /// `right`.
    pub fn separate(&self, left: &[u64], right: &[u64]) {
        let mut blocked = self.blocked.lock().unwrap_or_else(PoisonError::into_inner);
        for &a in left {
            for &b in right {
                if a != b {
                    blocked.insert((a, b));
                    blocked.insert((b, a));
                }
            }
        }
    }

    /// Restores every link.
    pub fn heal(&self) {
        self.blocked.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    pub fn is_blocked(&self, from: u64, to: u64) -> bool {
        self.blocked.lock().unwrap_or_else(PoisonError::into_inner).contains(&(from, to))
    }

    /// The cut directed links, for the report.
    pub fn blocked(&self) -> Vec<(u64, u64)> {
        self.blocked.lock().unwrap_or_else(PoisonError::into_inner).iter().copied().collect()
    }
}

/// The proxy in front of one node's peer port.
#[derive(Debug)]
pub struct PeerProxy {
    listen_addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl PeerProxy {
    /// Listens on a free 127.0.0.1 port and forwards to `target`, the real
    /// peer port of node `node`.
    pub fn start(node: u64, target: SocketAddr, rules: Arc<Rules>) -> Result<PeerProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind a proxy port")?;
        let listen_addr = listener.local_addr()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let accepting = Arc::clone(&stopping);
        let acceptor = std::thread::Builder::new()
            .name(format!("proxy-accept-{node}"))
            .spawn(move || accept_loop(&listener, node, target, &rules, &accepting))
            .context("cannot start a proxy thread")?;
        Ok(PeerProxy { listen_addr, stopping, acceptor: Some(acceptor) })
    }

    /// The address the nodes are told node `node` has.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen_addr
    }

    /// Stops accepting; open connections close within [`RULE_POLL`].
    pub fn stop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // The acceptor blocks in accept(): a connection wakes it to see the
        // flag.
        let _ = TcpStream::connect_timeout(&self.listen_addr, Duration::from_millis(200));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

impl Drop for PeerProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(
    listener: &TcpListener,
    node: u64,
    target: SocketAddr,
    rules: &Arc<Rules>,
    stopping: &Arc<AtomicBool>,
) {
    for incoming in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = incoming else { continue };
        let rules = Arc::clone(rules);
        let stopping = Arc::clone(stopping);
        // A connection thread ends when either side closes, the link is
        // cut, or the proxy stops; nobody needs to join it.
        let _ = std::thread::Builder::new()
            .name(format!("proxy-conn-{node}"))
            .spawn(move || connection(stream, node, target, &rules, &stopping));
    }
}

/// Reads the hello, decides, and forwards both ways until something ends.
fn connection(
    inbound: TcpStream,
    node: u64,
    target: SocketAddr,
    rules: &Arc<Rules>,
    stopping: &Arc<AtomicBool>,
) {
    let Ok((from, hello)) = read_hello(&inbound) else {
        return;
    };
    // `from` 0: a TLS connection whose sender the proxy cannot read; no
    // rule names it.
    if rules.is_blocked(from, node) {
        rules.refused.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let Ok(mut outbound) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) else {
        // The node is down: the sender sees the connection close and
        // reconnects with backoff, as it would without a proxy.
        return;
    };
    let _ = outbound.set_nodelay(true);
    let _ = inbound.set_nodelay(true);
    if outbound.write_all(&hello).is_err() {
        return;
    }
    let (Ok(inbound_copy), Ok(outbound_copy)) = (inbound.try_clone(), outbound.try_clone()) else {
        return;
    };
    let back_rules = Arc::clone(rules);
    let back_stopping = Arc::clone(stopping);
    // Peer connections carry messages one way; the other direction is
    // forwarded all the same, so that the proxy changes nothing but the
    // faults it is told to make.
    let back = std::thread::Builder::new()
        .name(format!("proxy-back-{node}"))
        .spawn(move || pump(outbound_copy, inbound_copy, from, node, &back_rules, &back_stopping));
    pump(inbound, outbound, from, node, rules, stopping);
    if let Ok(back) = back {
        let _ = back.join();
    }
}

/// The hello's sender and the hello's bytes (length prefix included); for
/// a TLS connection, sender 0 and the bytes read so far.
fn read_hello(mut stream: &TcpStream) -> Result<(u64, Vec<u8>)> {
    stream.set_read_timeout(Some(HELLO_TIMEOUT))?;
    let mut header = [0u8; 4];
    stream.read_exact(&mut header)?;
    if matches!(header, [0x16, 0x03, 0x00..=0x04, _]) {
        // A TLS handshake record: no plaintext hello to read.
        return Ok((0, header.to_vec()));
    }
    let len = u32::from_be_bytes(header) as usize;
    anyhow::ensure!(len <= HELLO_BYTES_MAX, "a hello of {len} bytes");
    let mut frame = header.to_vec();
    frame.resize(4 + len, 0);
    stream.read_exact(&mut frame[4..])?;
    let hello: PeerHello = fencelock_net::read_frame(&mut frame.as_slice(), HELLO_BYTES_MAX)?;
    anyhow::ensure!(hello.node_id != 0, "a hello without a node id");
    Ok((hello.node_id, frame))
}

/// Copies `from_stream` to `to_stream` until either closes, the link
/// `from`→`to` is cut, or the proxy stops; then closes both.
fn pump(
    mut source: TcpStream,
    mut sink: TcpStream,
    from: u64,
    to: u64,
    rules: &Rules,
    stopping: &AtomicBool,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    if source.set_read_timeout(Some(RULE_POLL)).is_err()
        || sink.set_write_timeout(Some(Duration::from_secs(5))).is_err()
    {
        return;
    }
    loop {
        if stopping.load(Ordering::SeqCst) {
            break;
        }
        // The link the connection carries is A→B whichever way these bytes
        // flow: a cut drops the whole connection.
        if rules.is_blocked(from, to) {
            rules.cut.fetch_add(1, Ordering::Relaxed);
            break;
        }
        match source.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                if sink.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = source.shutdown(Shutdown::Both);
    let _ = sink.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn hello(node_id: u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        fencelock_net::encode_frame(
            &PeerHello { node_id, client_addr: "127.0.0.1:1".into(), ..Default::default() },
            &mut bytes,
        );
        bytes
    }

    /// Reads until `want` bytes came or the stream ends or stalls.
    fn read_some(stream: &mut TcpStream, want: usize) -> Vec<u8> {
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        let mut buffer = [0u8; 1024];
        while got.len() < want {
            match stream.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buffer[..n]),
            }
        }
        got
    }

    #[test]
    fn forwards_the_hello_and_bytes_and_cuts_and_refuses_a_blocked_link() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let rules = Arc::new(Rules::default());
        let proxy = PeerProxy::start(2, server.local_addr().unwrap(), Arc::clone(&rules)).unwrap();

        let mut client = TcpStream::connect(proxy.listen_addr()).unwrap();
        client.write_all(&hello(1)).unwrap();
        client.write_all(b"raft").unwrap();
        let (mut accepted, _) = server.accept().unwrap();
        let expected: Vec<u8> = [hello(1), b"raft".to_vec()].concat();
        assert_eq!(read_some(&mut accepted, expected.len()), expected);

        // Cutting 1 and 2 apart closes the open connection...
        rules.separate(&[1], &[2]);
        let deadline = Instant::now() + Duration::from_secs(5);
        accepted.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        loop {
            let mut byte = [0u8; 1];
            match accepted.read(&mut byte) {
                Ok(0) => break,
                Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                other => panic!("unexpected {other:?}"),
            }
            assert!(Instant::now() < deadline, "the cut connection stayed open");
        }
        // ...and refuses a new one from node 1, while node 3 still gets through.
        let mut refused = TcpStream::connect(proxy.listen_addr()).unwrap();
        refused.write_all(&hello(1)).unwrap();
        assert!(read_some(&mut refused, 1).is_empty());
        let mut other = TcpStream::connect(proxy.listen_addr()).unwrap();
        other.write_all(&hello(3)).unwrap();
        let (mut accepted, _) = server.accept().unwrap();
        assert_eq!(read_some(&mut accepted, hello(3).len()), hello(3));
        assert_eq!(rules.refused.load(Ordering::Relaxed), 1);

        rules.heal();
        assert!(rules.blocked().is_empty());
    }

    #[test]
    fn garbage_instead_of_a_hello_is_closed() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = PeerProxy::start(1, server.local_addr().unwrap(), Arc::new(Rules::default())).unwrap();
        let mut client = TcpStream::connect(proxy.listen_addr()).unwrap();
        client.write_all(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]).unwrap();
        assert!(read_some(&mut client, 1).is_empty());
    }
}
