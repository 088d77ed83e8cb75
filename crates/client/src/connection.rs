//! One pipelined TCP connection to one node.
//!
//! Many requests are in flight at once, each under a fresh id. Writes are
//! serialized by a mutex. There is no reader thread: a caller waiting for
//! its response takes the *reading role* if no other caller has it, reads
//! frames, hands each response to the caller waiting on its id, and passes
//! the role on when its own response has come. A lone caller thus reads
//! its own answer, with no thread hand-off. When the connection fails (I/O
//! error, end of stream, a frame that does not decode, or a
//! connection-level refusal sent with id 0) every waiting caller is told at
//! once and the connection is closed for good: the pool opens a new one on
//! next use.
//!
//! With TLS the handshake is made when the connection opens. Afterwards the
//! session lives with the writing side, under its lock: a writer encrypts
//! and writes; the reader reads raw bytes without the lock, then takes it
//! to decrypt them (and to write whatever the session must answer), so
//! that records leave in the order the session made them.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender, TryRecvError};
use fencelock_net::frame::encode_frame;
use fencelock_types::client_pb::{Request, Response};

use crate::sansio::inbound::{self, Inbound};

/// Why a call on one connection got no response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CallError {
    /// The connection failed or was closed; the reason says how.
    Closed(String),
    /// No response within the attempt's timeout. The connection stays up:
    /// the answer may still come, and is then dropped.
    TimedOut,
}

/// What a waiting caller receives: its response, or why the connection died.
type Delivery = Result<Box<Response>, String>;

/// What a waiting caller is woken with.
#[derive(Debug)]
enum Wake {
    Delivered(Delivery),
    /// The reading role was given up: take it if still waiting.
    ReadingRoleFree,
}

/// How long a waiting caller sleeps before looking at the reading role
/// again, should a nudge that passes it on ever be missed: a safety net,
/// not the way the role moves.
const ROLE_POLL: Duration = Duration::from_millis(50);

/// The callers waiting for responses, by request id.
#[derive(Debug, Default)]
struct Waiters {
    state: Mutex<WaitersState>,
}

#[derive(Debug, Default)]
struct WaitersState {
    pending: HashMap<u64, Sender<Wake>>,
    /// Set once the connection failed; no caller is registered after that.
    closed: Option<String>,
}

impl Waiters {
    fn lock(&self) -> MutexGuard<'_, WaitersState> {
        // The state is a map and a flag, each update complete under the
        // lock, so a panic elsewhere cannot leave it half-changed.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn register(&self, id: u64, sender: Sender<Wake>) -> Result<(), String> {
        let mut state = self.lock();
        if let Some(reason) = &state.closed {
            return Err(reason.clone());
        }
        state.pending.insert(id, sender);
        Ok(())
    }

    fn forget(&self, id: u64) {
        self.lock().pending.remove(&id);
    }

    fn deliver(&self, response: Response) {
        // A response whose caller gave up (timed out) is dropped here.
        if let Some(sender) = self.lock().pending.remove(&response.id) {
            let _ = sender.send(Wake::Delivered(Ok(Box::new(response))));
        }
    }

    /// Tells one waiting caller that no one is reading.
    fn nudge_one(&self) {
        if let Some(sender) = self.lock().pending.values().next() {
            let _ = sender.send(Wake::ReadingRoleFree);
        }
    }

    /// Fails every waiting caller with `outcome` and refuses new ones.
    fn close(&self, reason: &str, outcome: &Delivery) {
        let mut state = self.lock();
        if state.closed.is_none() {
            state.closed = Some(reason.to_owned());
        }
        for (_, sender) in state.pending.drain() {
            let _ = sender.send(Wake::Delivered(outcome.clone()));
        }
    }

    fn is_closed(&self) -> bool {
        self.lock().closed.is_some()
    }
}

/// The reading side, held by whichever caller has the reading role.
#[derive(Debug)]
struct ReadHalf {
    stream: TcpStream,
    /// Bytes read and not yet decoded: at most one partial frame, kept
    /// across callers, so that a read that times out mid-frame loses nothing.
    input: Vec<u8>,
    chunk: Vec<u8>,
}

/// The writing side: the socket and, with TLS, the session.
#[derive(Debug)]
struct WriteHalf {
    stream: TcpStream,
    tls: Option<rustls::ClientConnection>,
}

impl WriteHalf {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        let Some(session) = self.tls.as_mut() else { return self.stream.write_all(frame) };
        session.writer().write_all(frame)?;
        flush_session(session, &mut self.stream)
    }

    /// Takes `bytes` read from the socket, appending the plaintext to
    /// `input`; `Ok(true)` when the server closed the session.
    fn take_in(&mut self, bytes: &[u8], input: &mut Vec<u8>) -> Result<bool, String> {
        let Some(session) = self.tls.as_mut() else {
            input.extend_from_slice(bytes);
            return Ok(false);
        };
        let mut fed = 0;
        let mut closed = false;
        while fed < bytes.len() {
            let taken = session.read_tls(&mut &bytes[fed..]).map_err(|err| format!("TLS: {err}"))?;
            if taken == 0 {
                return Err("TLS: the session takes no more input".into());
            }
            fed += taken;
            if let Err(err) = session.process_new_packets() {
                let _ = flush_session(session, &mut self.stream);
                return Err(format!("TLS: {err}"));
            }
            let mut chunk = [0u8; 16 * 1024];
            loop {
                match session.reader().read(&mut chunk) {
                    Ok(0) => {
                        closed = true;
                        break;
                    }
                    Ok(n) => input.extend_from_slice(&chunk[..n]),
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                    Err(err) => return Err(format!("TLS: {err}")),
                }
            }
        }
        flush_session(session, &mut self.stream).map_err(|err| format!("write failed: {err}"))?;
        Ok(closed)
    }
}

/// Writes out every record the session has made.
fn flush_session(session: &mut rustls::ClientConnection, stream: &mut TcpStream) -> io::Result<()> {
    while session.wants_write() {
        session.write_tls(stream)?;
    }
    Ok(())
}

/// A connection to one node, shared by every caller using that node.
#[derive(Debug)]
pub(crate) struct Connection {
    writer: Mutex<WriteHalf>,
    reader: Mutex<ReadHalf>,
    waiters: Waiters,
    next_id: AtomicU64,
    /// The node id the server's certificate names (TLS only).
    node: Option<u64>,
}

impl Connection {
    /// Connects to `addr` (`host:port`, every resolved address tried in
    /// turn, within `timeout` each).
    pub(crate) fn open(
        addr: &str,
        timeout: Duration,
        write_timeout: Duration,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> Result<Arc<Connection>, String> {
        let mut stream = connect(addr, timeout)?;
        // Requests are small and latency-bound; batching them in the kernel
        // would only delay them.
        stream.set_nodelay(true).map_err(|err| format!("cannot set TCP_NODELAY: {err}"))?;
        // A write that cannot finish means a stuck peer; the write error then
        // fails the connection instead of blocking callers forever.
        stream
            .set_write_timeout(Some(write_timeout.max(Duration::from_millis(1))))
            .map_err(|err| err.to_string())?;
        let tls = match tls {
            Some(config) => Some(handshake(&mut stream, addr, config, timeout)?),
            None => None,
        };
        let node = tls
            .as_ref()
            .and_then(|session| session.peer_certificates()?.first().map(|der| der.to_vec()))
            .and_then(|der| crate::sansio::retry::node_named(&der));
        let read_half = stream.try_clone().map_err(|err| format!("cannot split the connection: {err}"))?;
        Ok(Arc::new(Connection {
            writer: Mutex::new(WriteHalf { stream, tls }),
            reader: Mutex::new(ReadHalf { stream: read_half, input: Vec::new(), chunk: vec![0; 64 * 1024] }),
            waiters: Waiters::default(),
            next_id: AtomicU64::new(1),
            node,
        }))
    }

    /// The node id the server's certificate names (TLS), `None` on plain
    /// connections.
    pub(crate) fn node(&self) -> Option<u64> {
        self.node
    }

    /// Sends `request` under a fresh id and waits up to `timeout` for its
    /// response.
    pub(crate) fn call(&self, mut request: Request, timeout: Duration) -> Result<Response, CallError> {
        let deadline = Instant::now() + timeout;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        request.id = id;
        // Unbounded: a delivery must never find the queue full of nudges.
        let (sender, receiver) = unbounded();
        self.waiters.register(id, sender).map_err(CallError::Closed)?;
        let mut frame = Vec::new();
        encode_frame(&request, &mut frame);
        let written = {
            let mut writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
            writer.send(&frame)
        };
        if let Err(err) = written {
            // A partial write leaves the stream mid-frame; nothing more can
            // be sent on it.
            let reason = format!("write failed: {err}");
            self.fail(&reason);
            return Err(CallError::Closed(reason));
        }
        let outcome = self.wait(&receiver, deadline);
        if matches!(outcome, Err(CallError::TimedOut)) {
            self.waiters.forget(id);
            // A nudge meant for this caller may have come as it gave up:
            // pass it on, so that the others are not left without a reader.
            self.waiters.nudge_one();
        }
        outcome
    }

    /// Waits for this caller's response, reading for everyone while no one
    /// else does.
    fn wait(&self, receiver: &Receiver<Wake>, deadline: Instant) -> Result<Response, CallError> {
        loop {
            match receiver.try_recv() {
                Ok(Wake::Delivered(delivery)) => {
                    return delivery.map(|response| *response).map_err(CallError::Closed)
                }
                Ok(Wake::ReadingRoleFree) | Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => return Err(CallError::Closed("connection closed".into())),
            }
            if let Ok(mut half) = self.reader.try_lock() {
                let outcome = self.read_until(&mut half, receiver, deadline);
                drop(half);
                // Whoever still waits must be able to read next.
                self.waiters.nudge_one();
                return outcome;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CallError::TimedOut);
            }
            match receiver.recv_timeout(left.min(ROLE_POLL)) {
                Ok(Wake::Delivered(delivery)) => {
                    return delivery.map(|response| *response).map_err(CallError::Closed)
                }
                Ok(Wake::ReadingRoleFree) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(CallError::Closed("connection closed".into()));
                }
            }
        }
    }

    /// With the reading role: reads and hands out responses until the
    /// caller's own comes, the deadline passes or the connection fails.
    fn read_until(
        &self,
        half: &mut ReadHalf,
        receiver: &Receiver<Wake>,
        deadline: Instant,
    ) -> Result<Response, CallError> {
        loop {
            // The last reader may have handed ours over before we took
            // the role; or a frame for us may be in the input already.
            if let Ok(Wake::Delivered(delivery)) = receiver.try_recv() {
                return delivery.map(|response| *response).map_err(CallError::Closed);
            }
            if let Err(reason) = self.hand_out(half) {
                self.fail(&reason);
            }
            if let Ok(Wake::Delivered(delivery)) = receiver.try_recv() {
                return delivery.map(|response| *response).map_err(CallError::Closed);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CallError::TimedOut);
            }
            if let Err(err) = half.stream.set_read_timeout(Some(left)) {
                self.fail(&format!("cannot set a read timeout: {err}"));
                continue;
            }
            let ReadHalf { stream, input, chunk } = half;
            match stream.read(chunk) {
                Ok(0) => self.fail("connection closed by the server"),
                Ok(n) => {
                    let taken = self
                        .writer
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .take_in(&chunk[..n], input);
                    match taken {
                        Ok(false) => {}
                        Ok(true) => {
                            // What came before the close notice is answered
                            // first, as plain TCP's last bytes are.
                            if let Err(reason) = self.hand_out(half) {
                                self.fail(&reason);
                            }
                            self.fail("connection closed by the server");
                        }
                        Err(reason) => self.fail(&reason),
                    }
                }
                Err(err) if matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => self.fail(&format!("read failed: {err}")),
            }
        }
    }

    /// Decodes every whole frame in the input and delivers it
    /// ([`inbound::next`] reads them).
    fn hand_out(&self, half: &mut ReadHalf) -> Result<(), String> {
        let mut at = 0;
        let mut result = Ok(());
        while let Some((inbound, used)) = inbound::next(&half.input[at..]) {
            at += used;
            match inbound {
                Inbound::Response(response) => self.waiters.deliver(*response),
                Inbound::Refused { reason, response } => {
                    self.waiters.close(&reason, &Ok(response));
                    result = Err(reason);
                    break;
                }
                Inbound::Broken(reason) => {
                    result = Err(reason);
                    break;
                }
            }
        }
        half.input.drain(..at.min(half.input.len()));
        result
    }

    fn fail(&self, reason: &str) {
        self.waiters.close(reason, &Err(reason.to_owned()));
        self.shutdown();
    }

    fn shutdown(&self) {
        let writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        // Wakes a caller blocked reading; it then finds the connection closed.
        let _ = writer.stream.shutdown(Shutdown::Both);
    }
}

impl crate::sansio::pool::Pooled for Connection {
    /// True once the connection failed; it is then replaced on next use.
    fn is_closed(&self) -> bool {
        self.waiters.is_closed()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Makes the TLS handshake on a fresh connection to `addr`, whose host part
/// the node's certificate must name, within `timeout`.
fn handshake(
    stream: &mut TcpStream,
    addr: &str,
    config: &Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> Result<rustls::ClientConnection, String> {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|err| format!("`{host}` cannot name a TLS server: {err}"))?;
    let mut session =
        rustls::ClientConnection::new(Arc::clone(config), name).map_err(|err| format!("TLS: {err}"))?;
    session.set_buffer_limit(None);
    stream.set_read_timeout(Some(timeout.max(Duration::from_millis(1)))).map_err(|err| err.to_string())?;
    while session.is_handshaking() {
        session.complete_io(stream).map_err(|err| format!("TLS handshake failed: {err}"))?;
    }
    Ok(session)
}

fn connect(addr: &str, timeout: Duration) -> Result<TcpStream, String> {
    let deadline = Instant::now() + timeout;
    let addrs = addr.to_socket_addrs().map_err(|err| format!("cannot resolve: {err}"))?;
    let mut last = "resolves to no address".to_owned();
    for socket_addr in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            last = "connect timed out".to_owned();
            break;
        }
        match TcpStream::connect_timeout(&socket_addr, left) {
            Ok(stream) => return Ok(stream),
            Err(err) => last = format!("cannot connect: {err}"),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use std::io::BufReader;
    use std::net::TcpListener;
    use std::sync::Arc;

    use fencelock_net::frame::read_frame;
    use fencelock_types::client_pb::{
        GetRequest, GetResponse, LockInfo, Request_oneof_kind, Response_oneof_kind,
    };

    use super::*;
    use crate::sansio::pool::Pooled;

    fn get(key: &str) -> Request {
        let get = GetRequest { key: key.as_bytes().to_vec(), ..Default::default() };
        Request { kind: Some(Request_oneof_kind::get(get)), ..Default::default() }
    }

    /// The answer to a get: the key asked for, so callers can check it is theirs.
    fn answer_to(request: &Request) -> Response {
        let Some(Request_oneof_kind::get(get)) = &request.kind else { panic!("not a get") };
        let holder = LockInfo { key: get.key.clone(), ..Default::default() };
        let kind =
            Response_oneof_kind::get(GetResponse { holder: Some(holder).into(), ..Default::default() });
        Response { id: request.id, kind: Some(kind), ..Default::default() }
    }

    fn key_of(response: &Response) -> String {
        let Some(Response_oneof_kind::get(get)) = &response.kind else { panic!("not a get answer") };
        String::from_utf8(get.get_holder().key.clone()).unwrap()
    }

    /// A server for one connection, run by `serve` on its own thread with
    /// the connection's reading and writing halves.
    fn one_connection_server(serve: impl FnOnce(BufReader<TcpStream>, TcpStream) + Send + 'static) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            serve(BufReader::new(stream.try_clone().unwrap()), stream);
        });
        addr
    }

    /// A server that answers `batch` requests at a time, in reverse order,
    /// each batch's bytes in two writes split inside a frame.
    fn reversing_server(batch: usize) -> String {
        one_connection_server(move |mut reader, mut writer| {
            let mut held = Vec::new();
            while let Ok(request) = read_frame::<Request>(&mut reader, 1 << 20) {
                held.push(request);
                if held.len() < batch {
                    continue;
                }
                let mut bytes = Vec::new();
                for request in held.drain(..).rev() {
                    encode_frame(&answer_to(&request), &mut bytes);
                }
                let half = bytes.len() / 2 + 1;
                writer.write_all(&bytes[..half]).unwrap();
                std::thread::sleep(Duration::from_millis(1));
                writer.write_all(&bytes[half..]).unwrap();
            }
        })
    }

    #[test]
    fn many_callers_on_one_connection_each_get_their_own_answer() {
        let threads = 8;
        let calls = 50;
        let connection = Connection::open(
            &reversing_server(threads),
            Duration::from_secs(5),
            Duration::from_secs(5),
            None,
        )
        .unwrap();
        let callers: Vec<_> = (0..threads)
            .map(|thread| {
                let connection = Arc::clone(&connection);
                std::thread::spawn(move || {
                    for call in 0..calls {
                        let key = format!("{thread}-{call}");
                        let response = connection.call(get(&key), Duration::from_secs(10)).unwrap();
                        assert_eq!(key_of(&response), key);
                    }
                })
            })
            .collect();
        for caller in callers {
            caller.join().unwrap();
        }
        assert!(!connection.is_closed());
    }

    #[test]
    fn a_reader_that_times_out_mid_frame_hands_the_role_and_the_bytes_on() {
        let addr = one_connection_server(|mut reader, mut writer| {
            // The first request is never answered.
            let _first = read_frame::<Request>(&mut reader, 1 << 20).unwrap();
            let second = read_frame::<Request>(&mut reader, 1 << 20).unwrap();
            let mut bytes = Vec::new();
            encode_frame(&answer_to(&second), &mut bytes);
            // Half now, while the first caller reads; the rest after it gave up.
            writer.write_all(&bytes[..bytes.len() / 2]).unwrap();
            std::thread::sleep(Duration::from_millis(400));
            writer.write_all(&bytes[bytes.len() / 2..]).unwrap();
            std::thread::sleep(Duration::from_secs(5));
        });
        let connection =
            Connection::open(&addr, Duration::from_secs(5), Duration::from_secs(5), None).unwrap();
        let first = {
            let connection = Arc::clone(&connection);
            std::thread::spawn(move || connection.call(get("first"), Duration::from_millis(200)))
        };
        // Once the first caller holds the reading role (and waits in a read):
        let deadline = Instant::now() + Duration::from_secs(5);
        while connection.reader.try_lock().is_ok() {
            assert!(Instant::now() < deadline, "the first caller never took the reading role");
            std::thread::sleep(Duration::from_millis(1));
        }
        let second = connection.call(get("second"), Duration::from_secs(5)).unwrap();
        assert_eq!(key_of(&second), "second");
        assert_eq!(first.join().unwrap(), Err(CallError::TimedOut));
        assert!(!connection.is_closed());
    }

    /// A TLS server that answers one request with its response and a close
    /// notice in one write, as a node closing a connection does.
    #[test]
    fn a_response_that_comes_with_the_close_notice_is_still_delivered() {
        let dir = tempfile::tempdir().unwrap();
        let layout = fencelock_tls::Layout::new(dir.path());
        fencelock_tls::create_ca(&layout, false).unwrap();
        fencelock_tls::create_node(&layout, 1, &["127.0.0.1".into()], false).unwrap();
        fencelock_tls::create_client(&layout, "alice", false).unwrap();
        let server = fencelock_tls::node_tls(&layout, 1).unwrap().client_server;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let (socket, _) = listener.accept().unwrap();
            let session = rustls::ServerConnection::new(server).unwrap();
            let mut stream = rustls::StreamOwned::new(session, socket);
            let request: Request = read_frame(&mut stream, 1 << 20).unwrap();
            let mut frame = Vec::new();
            encode_frame(&Response { id: request.id, ..Default::default() }, &mut frame);
            stream.conn.writer().write_all(&frame).unwrap();
            stream.conn.send_close_notify();
            let mut records = Vec::new();
            while stream.conn.wants_write() {
                stream.conn.write_tls(&mut records).unwrap();
            }
            stream.sock.write_all(&records).unwrap();
            // Keep the socket open until the test is done: only the notice
            // says the end.
            let _ = finished.recv();
        });
        let alice = fencelock_tls::client_tls(&layout, "alice").unwrap();
        let connection =
            Connection::open(&addr, Duration::from_secs(5), Duration::from_secs(5), Some(&alice)).unwrap();
        let answer = connection.call(get("k"), Duration::from_secs(5));
        assert!(answer.is_ok(), "the response before the close notice was lost: {answer:?}");
        drop(done);
        thread.join().unwrap();
    }
}
