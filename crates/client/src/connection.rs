//! One pipelined TCP connection to one node.
//!
//! Many requests are in flight at once, each under a fresh id. Writes are
//! serialized by a mutex; a reader thread hands each response to the caller
//! waiting on its id. When the connection fails (I/O error, end of stream, a
//! frame that does not decode, or a connection-level refusal sent with id 0)
//! every waiting caller is told at once and the connection is closed for
//! good: the pool opens a new one on next use.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, RecvTimeoutError, Sender};
use fencelock_net::frame::{encode_frame, read_frame, FrameError};
use fencelock_types::client_pb::{ErrorCode, Request, Response};

/// The largest response frame accepted. A list of many long keys is the
/// largest answer a server gives; anything bigger is a broken stream.
pub(crate) const FRAME_BYTES_MAX: usize = 16 << 20;

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
type Delivery = Result<Response, String>;

/// The callers waiting for responses, by request id.
#[derive(Debug, Default)]
struct Waiters {
    state: Mutex<WaitersState>,
}

#[derive(Debug, Default)]
struct WaitersState {
    pending: HashMap<u64, Sender<Delivery>>,
    /// Set once the connection failed; no caller is registered after that.
    closed: Option<String>,
}

impl Waiters {
    fn lock(&self) -> MutexGuard<'_, WaitersState> {
        // The state is a map and a flag, each update complete under the
        // lock, so a panic elsewhere cannot leave it half-changed.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn register(&self, id: u64, sender: Sender<Delivery>) -> Result<(), String> {
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
            let _ = sender.send(Ok(response));
        }
    }

    /// Fails every waiting caller with `outcome` and refuses new ones.
    fn close(&self, reason: &str, outcome: &Delivery) {
        let mut state = self.lock();
        if state.closed.is_none() {
            state.closed = Some(reason.to_owned());
        }
        for (_, sender) in state.pending.drain() {
            let _ = sender.send(outcome.clone());
        }
    }

    fn is_closed(&self) -> bool {
        self.lock().closed.is_some()
    }
}

/// A connection to one node, shared by every caller using that node.
#[derive(Debug)]
pub(crate) struct Connection {
    writer: Mutex<TcpStream>,
    waiters: Arc<Waiters>,
    next_id: AtomicU64,
}

impl Connection {
    /// Connects to `addr` (`host:port`, every resolved address tried in
    /// turn, within `timeout` each) and starts the reader thread.
    pub(crate) fn open(
        addr: &str,
        timeout: Duration,
        write_timeout: Duration,
    ) -> Result<Arc<Connection>, String> {
        let stream = connect(addr, timeout)?;
        // Requests are small and latency-bound; batching them in the kernel
        // would only delay them.
        stream.set_nodelay(true).map_err(|err| format!("cannot set TCP_NODELAY: {err}"))?;
        // A write that cannot finish means a stuck peer; the write error then
        // fails the connection instead of blocking callers forever.
        stream
            .set_write_timeout(Some(write_timeout.max(Duration::from_millis(1))))
            .map_err(|err| err.to_string())?;
        let read_half = stream.try_clone().map_err(|err| format!("cannot split the connection: {err}"))?;
        let waiters = Arc::new(Waiters::default());
        let reader_waiters = Arc::clone(&waiters);
        std::thread::Builder::new()
            .name("fencelock-client-conn".into())
            .spawn(move || read_responses(read_half, &reader_waiters))
            .map_err(|err| format!("cannot start a connection reader: {err}"))?;
        Ok(Arc::new(Connection { writer: Mutex::new(stream), waiters, next_id: AtomicU64::new(1) }))
    }

    /// False once the connection failed; it is then replaced on next use.
    pub(crate) fn is_closed(&self) -> bool {
        self.waiters.is_closed()
    }

    /// Sends `request` under a fresh id and waits up to `timeout` for its
    /// response.
    pub(crate) fn call(&self, mut request: Request, timeout: Duration) -> Result<Response, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        request.id = id;
        let (sender, receiver) = bounded(1);
        self.waiters.register(id, sender).map_err(CallError::Closed)?;
        let mut frame = Vec::new();
        encode_frame(&request, &mut frame);
        let written = {
            let mut writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
            writer.write_all(&frame)
        };
        if let Err(err) = written {
            // A partial write leaves the stream mid-frame; nothing more can
            // be sent on it.
            let reason = format!("write failed: {err}");
            self.fail(&reason);
            return Err(CallError::Closed(reason));
        }
        match receiver.recv_timeout(timeout) {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(reason)) => Err(CallError::Closed(reason)),
            Err(RecvTimeoutError::Timeout) => {
                self.waiters.forget(id);
                Err(CallError::TimedOut)
            }
            Err(RecvTimeoutError::Disconnected) => Err(CallError::Closed("connection closed".to_owned())),
        }
    }

    fn fail(&self, reason: &str) {
        self.waiters.close(reason, &Err(reason.to_owned()));
        self.shutdown();
    }

    fn shutdown(&self) {
        let writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        // Wakes the reader thread, which then ends.
        let _ = writer.shutdown(Shutdown::Both);
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // The reader thread is blocked in a read; this ends it.
        self.shutdown();
    }
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

fn read_responses(stream: TcpStream, waiters: &Waiters) {
    let mut reader = BufReader::new(stream);
    let reason = loop {
        match read_frame::<Response>(&mut reader, FRAME_BYTES_MAX) {
            Ok(response) if response.id == 0 => {
                let refusal = response.error.as_ref().filter(|error| error.code != ErrorCode::OK).cloned();
                let Some(error) = refusal else {
                    break "the server sent a response with id 0 and no error".to_owned();
                };
                // The server refused the whole connection (too many
                // connections, a frame too large): every caller gets that
                // answer, so each can act on its code.
                let reason = format!("connection refused by the server: {}", error.message);
                waiters.close(&reason, &Ok(response));
                break reason;
            }
            Ok(response) => waiters.deliver(response),
            Err(FrameError::Closed) => break "connection closed by the server".to_owned(),
            Err(err) => break err.to_string(),
        }
    };
    waiters.close(&reason, &Err(reason.clone()));
    let _ = reader.get_ref().shutdown(Shutdown::Both);
}
