//! The wire protocol spoken by hand (docs/protocol.md), for clients that
//! `fencelock_client` would never be: thousands of pipelined requests on
//! one connection, answers never read, connections from another source
//! address.
//!
//! A frame is a 4-byte big-endian length and one protobuf message
//! (`fencelock_net::encode_frame`). [`pipeline`] writes requests with a
//! window of unanswered ones while a second thread reads and tallies the
//! answers; [`connect_from`] binds a source address before it connects,
//! which `std::net::TcpStream` cannot.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fencelock_types::client_pb::{
    AcquireOutcome, AcquireRequest, ErrorCode, ListRequest, Request, Request_oneof_kind, Response,
    Response_oneof_kind,
};
use serde::Serialize;

/// The largest answer frame read: a full `list` of the longest keys and
/// owners is about 13 MB (the client's own limit is the same).
const ANSWER_BYTES_MAX: usize = 16 << 20;

/// How long a blocked read waits before the reader looks at its deadline.
const READ_POLL: Duration = Duration::from_millis(50);

/// An acquire request.
pub fn acquire(id: u64, key: &[u8], owner: &[u8], lease_ms: u64, wait_ms: u64) -> Request {
    let acquire =
        AcquireRequest { key: key.to_vec(), owner: owner.to_vec(), lease_ms, wait_ms, ..Default::default() };
    Request { id, kind: Some(Request_oneof_kind::acquire(acquire)), ..Default::default() }
}

/// A `list` of every lock (empty prefix, the server's maximum).
pub fn list_all(id: u64) -> Request {
    Request { id, kind: Some(Request_oneof_kind::list(ListRequest::default())), ..Default::default() }
}

/// `text` padded with `fill` (or cut) to exactly `len` bytes: keys of
/// 1,024 bytes and owners of 256, the longest the server takes.
pub fn padded(text: &str, len: usize, fill: u8) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    bytes.resize(len, fill);
    bytes
}

/// A TCP connection to `to` from the local address `from` (port chosen by
/// the kernel), so that the server counts it against `from`'s
/// per-address limit rather than 127.0.0.1's. `timeout` bounds the
/// connect.
pub fn connect_from(from: IpAddr, to: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    use rustix::net::{sockopt, AddressFamily, SocketType};
    let family = if to.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
    let socket = rustix::net::socket(family, SocketType::STREAM, None).context("socket")?;
    rustix::net::bind(&socket, &SocketAddr::new(from, 0)).with_context(|| format!("cannot bind {from}"))?;
    // SO_SNDTIMEO bounds a blocking connect on Linux.
    sockopt::set_socket_timeout(&socket, sockopt::Timeout::Send, Some(timeout)).context("SO_SNDTIMEO")?;
    rustix::net::connect(&socket, &to).with_context(|| format!("cannot connect {from} -> {to}"))?;
    let stream = TcpStream::from(socket);
    stream.set_write_timeout(None)?;
    Ok(stream)
}

/// Starts a TCP connection to `to` from `from` without waiting for it:
/// the stream is non-blocking and may still be connecting (its
/// `peer_addr` fails until the handshake is done).
pub fn start_connect_from(from: IpAddr, to: SocketAddr) -> Result<TcpStream> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let family = if to.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
    let socket = rustix::net::socket_with(family, SocketType::STREAM, SocketFlags::NONBLOCK, None)
        .context("socket")?;
    rustix::net::bind(&socket, &SocketAddr::new(from, 0)).with_context(|| format!("cannot bind {from}"))?;
    match rustix::net::connect(&socket, &to) {
        Ok(()) | Err(rustix::io::Errno::INPROGRESS) => Ok(TcpStream::from(socket)),
        Err(err) => Err(err).with_context(|| format!("cannot connect {from} -> {to}")),
    }
}

/// What a connection's answers were.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    pub answers: u64,
    pub granted: u64,
    /// Acquire answers other than a grant (held, wait timed out).
    pub not_granted: u64,
    /// Successful answers to anything else.
    pub other_ok: u64,
    pub not_leader: u64,
    pub unavailable: u64,
    pub resource_exhausted: u64,
    pub invalid_argument: u64,
    /// Any other error code.
    pub other_error: u64,
    /// An error answer with id 0 (about the whole connection) came.
    pub connection_errors: u64,
    /// The first message of each error code seen, for the report.
    pub messages: Vec<String>,
}

impl Tally {
    pub fn add(&mut self, response: &Response) {
        self.answers += 1;
        let code = response.get_error().get_code();
        if code != ErrorCode::OK {
            if response.id == 0 {
                self.connection_errors += 1;
            }
            let message = format!("{code:?}: {}", response.get_error().get_message());
            if self.messages.len() < 8
                && !self.messages.iter().any(|seen| seen.starts_with(&format!("{code:?}")))
            {
                self.messages.push(message);
            }
        }
        match code {
            ErrorCode::OK => match &response.kind {
                Some(Response_oneof_kind::acquire(acquire)) if acquire.outcome == AcquireOutcome::GRANTED => {
                    self.granted += 1
                }
                Some(Response_oneof_kind::acquire(_)) => self.not_granted += 1,
                _ => self.other_ok += 1,
            },
            ErrorCode::NOT_LEADER => self.not_leader += 1,
            ErrorCode::UNAVAILABLE => self.unavailable += 1,
            ErrorCode::RESOURCE_EXHAUSTED => self.resource_exhausted += 1,
            ErrorCode::INVALID_ARGUMENT => self.invalid_argument += 1,
            _ => self.other_error += 1,
        }
    }

    pub fn merge(&mut self, other: &Tally) {
        self.answers += other.answers;
        self.granted += other.granted;
        self.not_granted += other.not_granted;
        self.other_ok += other.other_ok;
        self.not_leader += other.not_leader;
        self.unavailable += other.unavailable;
        self.resource_exhausted += other.resource_exhausted;
        self.invalid_argument += other.invalid_argument;
        self.other_error += other.other_error;
        self.connection_errors += other.connection_errors;
        for message in &other.messages {
            if self.messages.len() < 8 && !self.messages.contains(message) {
                self.messages.push(message.clone());
            }
        }
    }
}

/// How reading a connection's answers ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Answers {
    pub tally: Tally,
    /// The server closed the connection (end of stream or reset).
    pub closed_by_server: bool,
    /// A frame that did not decode, or another read error.
    pub error: Option<String>,
    /// When the first RESOURCE_EXHAUSTED came, from when reading started.
    pub first_exhausted_ms: Option<u64>,
}

/// Reads and tallies answers from `stream` until `deadline`, the end of
/// the stream, or `stop`; `answered` counts them as they come, for a
/// writer that keeps a window.
pub fn read_answers(
    mut stream: TcpStream,
    deadline: Instant,
    answered: &AtomicU64,
    stop: &AtomicBool,
) -> Answers {
    let mut answers = Answers::default();
    let started = Instant::now();
    let mut input = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    if let Err(err) = stream.set_read_timeout(Some(READ_POLL)) {
        answers.error = Some(format!("set_read_timeout: {err}"));
        return answers;
    }
    while Instant::now() < deadline && !stop.load(Ordering::SeqCst) {
        match stream.read(&mut chunk) {
            Ok(0) => {
                answers.closed_by_server = true;
                break;
            }
            Ok(n) => input.extend_from_slice(&chunk[..n]),
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(err) if err.kind() == ErrorKind::Interrupted => continue,
            Err(err) if is_closed(&err) => {
                answers.closed_by_server = true;
                break;
            }
            Err(err) => {
                answers.error = Some(format!("read: {err}"));
                break;
            }
        }
        let mut at = 0;
        loop {
            match fencelock_net::decode_frame::<Response>(&input[at..], ANSWER_BYTES_MAX) {
                Ok(Some((response, used))) => {
                    answers.tally.add(&response);
                    if answers.first_exhausted_ms.is_none() && answers.tally.resource_exhausted > 0 {
                        let elapsed = started.elapsed().as_millis();
                        answers.first_exhausted_ms = Some(u64::try_from(elapsed).unwrap_or(u64::MAX));
                    }
                    answered.fetch_add(1, Ordering::SeqCst);
                    at += used;
                }
                Ok(None) => break,
                Err(err) => {
                    answers.error = Some(format!("answer frame: {err}"));
                    return answers;
                }
            }
        }
        input.drain(..at);
    }
    answers
}

/// True for the errors a connection the server closed gives.
pub fn is_closed(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        ErrorKind::ConnectionReset
            | ErrorKind::BrokenPipe
            | ErrorKind::ConnectionAborted
            | ErrorKind::UnexpectedEof
    )
}

/// Whether the server has closed `stream`, looking without blocking: the
/// end of the stream or a reset says so; bytes waiting are read and
/// decoded (an answer with id 0 says why it was closed).
pub fn peek_closed(mut stream: &TcpStream) -> (bool, Option<Response>) {
    if stream.set_nonblocking(true).is_err() {
        return (true, None);
    }
    let mut input = Vec::new();
    let mut chunk = [0u8; 4096];
    let closed = loop {
        match stream.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => {
                input.extend_from_slice(&chunk[..n]);
                if input.len() > 1 << 20 {
                    break false;
                }
            }
            Err(err) if err.kind() == ErrorKind::WouldBlock => break false,
            Err(err) if err.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break true,
        }
    };
    let first = fencelock_net::decode_frame::<Response>(&input, ANSWER_BYTES_MAX).ok().flatten();
    (closed, first.map(|(response, _)| response))
}

/// How a pipelined run of requests went.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Pipelined {
    pub sent: u64,
    #[serde(flatten)]
    pub answers: Answers,
    /// Why writing stopped early, if it did.
    pub write_error: Option<String>,
}

/// Sends the requests `next` makes (ids from 1 up; `None` ends them) on one
/// connection to `addr`, keeping at most `window` unanswered, until `next`
/// ends or `deadline`; then waits for the answers until `deadline` (or
/// until all have come, when `wait_for_all`). A second thread reads.
pub fn pipeline(
    addr: SocketAddr,
    window: u64,
    deadline: Instant,
    wait_for_all: bool,
    mut next: impl FnMut(u64) -> Option<Request>,
) -> Result<Pipelined> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_nodelay(true)?;
    let reader_stream = stream.try_clone()?;
    let answered = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (answered, stop) = (Arc::clone(&answered), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("raw-reader".into())
            .spawn(move || read_answers(reader_stream, deadline, &answered, &stop))
            .context("cannot start a reader thread")?
    };
    let mut sent = 0u64;
    let mut write_error = None;
    let mut buffer = Vec::new();
    let mut done = false;
    while !done && Instant::now() < deadline {
        let room = window.saturating_sub(sent - answered.load(Ordering::SeqCst)).min(256);
        if room == 0 {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        buffer.clear();
        let mut batch = 0;
        while batch < room {
            match next(sent + batch + 1) {
                Some(request) => {
                    fencelock_net::encode_frame(&request, &mut buffer);
                    batch += 1;
                }
                None => {
                    done = true;
                    break;
                }
            }
        }
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        stream.set_write_timeout(Some(left))?;
        if let Err(err) = stream.write_all(&buffer) {
            write_error = Some(err.to_string());
            break;
        }
        sent += batch;
    }
    while wait_for_all && answered.load(Ordering::SeqCst) < sent && Instant::now() < deadline {
        if reader.is_finished() {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // The reader stops first, so that our own hang-up does not count as
    // the server's.
    stop.store(true, Ordering::SeqCst);
    let answers = reader.join().map_err(|_| anyhow::anyhow!("the reader thread panicked"))?;
    let _ = stream.shutdown(Shutdown::Both);
    Ok(Pipelined { sent, answers, write_error })
}

#[cfg(test)]
mod tests {
    use fencelock_types::client_pb::{AcquireResponse, Error};

    use super::*;

    fn answer(id: u64, code: ErrorCode, outcome: Option<AcquireOutcome>) -> Response {
        let mut response = Response { id, ..Default::default() };
        if code != ErrorCode::OK {
            response.error =
                Some(Error { code, message: format!("{code:?} here"), ..Default::default() }).into();
        }
        if let Some(outcome) = outcome {
            response.kind =
                Some(Response_oneof_kind::acquire(AcquireResponse { outcome, ..Default::default() }));
        }
        response
    }

    #[test]
    fn a_tally_counts_each_kind_of_answer() {
        let mut tally = Tally::default();
        tally.add(&answer(1, ErrorCode::OK, Some(AcquireOutcome::GRANTED)));
        tally.add(&answer(2, ErrorCode::OK, Some(AcquireOutcome::HELD)));
        tally.add(&answer(3, ErrorCode::RESOURCE_EXHAUSTED, None));
        tally.add(&answer(4, ErrorCode::RESOURCE_EXHAUSTED, None));
        tally.add(&answer(0, ErrorCode::UNAVAILABLE, None));
        let mut total = Tally::default();
        total.merge(&tally);
        total.merge(&tally);
        assert_eq!((total.answers, total.granted, total.not_granted), (10, 2, 2));
        assert_eq!((total.resource_exhausted, total.unavailable, total.connection_errors), (4, 2, 2));
        assert_eq!(
            total.messages,
            ["RESOURCE_EXHAUSTED: RESOURCE_EXHAUSTED here", "UNAVAILABLE: UNAVAILABLE here"]
        );
    }

    #[test]
    fn requests_are_frames_the_server_decodes() {
        let key = padded("fill/1/", fencelock_types::KEY_LEN_MAX, b'k');
        assert_eq!(key.len(), 1024);
        assert!(key.starts_with(b"fill/1/"));
        let mut frames = Vec::new();
        fencelock_net::encode_frame(&acquire(7, &key, b"owner", 2_000, 60_000), &mut frames);
        fencelock_net::encode_frame(&list_all(8), &mut frames);
        let (first, used) = fencelock_net::decode_frame::<Request>(&frames, 1 << 20).unwrap().unwrap();
        let Some(Request_oneof_kind::acquire(acquire)) = first.kind else { panic!("{first:?}") };
        assert_eq!((first.id, acquire.key, acquire.wait_ms), (7, key, 60_000));
        let (second, _) = fencelock_net::decode_frame::<Request>(&frames[used..], 1 << 20).unwrap().unwrap();
        assert!(matches!(second.kind, Some(Request_oneof_kind::list(ref list)) if list.limit == 0));
    }

    #[test]
    fn a_connection_can_come_from_another_loopback_address() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let from = IpAddr::from([127, 0, 0, 2]);
        let _stream = connect_from(from, addr, Duration::from_secs(1)).unwrap();
        let (_, remote) = listener.accept().unwrap();
        assert_eq!(remote.ip(), from);
    }
}
