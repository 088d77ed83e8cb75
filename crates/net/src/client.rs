//! The client listener: pipelined request/response over framed TCP.
//!
//! Each connection has a reader thread, which decodes [`Request`]s and hands
//! them to the [`Handler`], and a writer thread, which sends [`Response`]s
//! as they complete, batching what is ready into one write. Limits (frame
//! size, requests in flight per connection, connections) are answered with a
//! clear error; a malformed frame closes that connection only.

use std::io::{BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use fencelock_types::client_pb::{Error, ErrorCode, Request, Response};
use slog::{debug, info, warn, Logger};

use crate::frame::{encode_frame, read_frame, FrameError};

/// Settings of the client listener.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub listen_addr: SocketAddr,
    pub connections_max: usize,
    /// Requests in flight on one connection; more are refused.
    pub in_flight_max: usize,
    pub frame_bytes_max: usize,
}

/// Serves requests. Called on the connection's reader thread: it must not
/// block for long, and answers later through the [`ResponseSink`].
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, request: Request, sink: ResponseSink);
}

/// Where the answer to one request goes.
#[derive(Debug)]
pub struct ResponseSink {
    id: u64,
    connection: Arc<Connection>,
}

impl ResponseSink {
    /// The id of the request this sink answers.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Sends the response (its id is set here). False when the connection
    /// is gone: for an acquire, the grant has no one to go to.
    pub fn send(self, mut response: Response) -> bool {
        response.id = self.id;
        self.connection.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.connection.alive.load(Ordering::SeqCst) && self.connection.responses.try_send(response).is_ok()
    }
}

#[derive(Debug)]
struct Connection {
    alive: AtomicBool,
    in_flight: AtomicUsize,
    responses: Sender<Response>,
}

/// A running client listener.
#[derive(Debug)]
pub struct ClientListener {
    local_addr: SocketAddr,
    stopping: Arc<AtomicBool>,
}

impl ClientListener {
    pub fn start(
        config: ClientConfig,
        handler: Arc<dyn Handler>,
        logger: &Logger,
    ) -> std::io::Result<ClientListener> {
        let listener = TcpListener::bind(config.listen_addr)?;
        let local_addr = listener.local_addr()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicUsize::new(0));
        let logger = logger.clone();
        info!(logger, "client listener ready"; "addr" => %local_addr);
        let accept_stopping = Arc::clone(&stopping);
        std::thread::Builder::new().name("fencelock-client-accept".into()).spawn(move || {
            for stream in listener.incoming() {
                if accept_stopping.load(Ordering::SeqCst) {
                    return;
                }
                match stream {
                    Ok(stream) => serve(stream, &config, &handler, &connections, &logger),
                    Err(err) => warn!(logger, "accepting a client failed"; "error" => %err),
                }
            }
        })?;
        Ok(ClientListener { local_addr, stopping })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting new connections; open ones carry on.
    pub fn stop_accepting(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.local_addr, Duration::from_millis(200));
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

fn serve(
    stream: TcpStream,
    config: &ClientConfig,
    handler: &Arc<dyn Handler>,
    connections: &Arc<AtomicUsize>,
    logger: &Logger,
) {
    let remote = stream.peer_addr().map(|addr| addr.to_string()).unwrap_or_default();
    let _ = stream.set_nodelay(true);
    if connections.fetch_add(1, Ordering::SeqCst) >= config.connections_max {
        connections.fetch_sub(1, Ordering::SeqCst);
        warn!(logger, "refusing client: too many connections"; "remote" => &remote, "max" => config.connections_max);
        let mut buffer = Vec::new();
        encode_frame(&error_response(0, ErrorCode::UNAVAILABLE, "too many connections"), &mut buffer);
        let mut stream = stream;
        let _ = stream.write_all(&buffer);
        return;
    }
    let write_half = match stream.try_clone() {
        Ok(write_half) => write_half,
        Err(err) => {
            connections.fetch_sub(1, Ordering::SeqCst);
            warn!(logger, "cannot split a client connection"; "error" => %err);
            return;
        }
    };
    // Room for every request in flight plus the reader's own refusals.
    let (responses_tx, responses_rx) = bounded(config.in_flight_max * 2 + 16);
    let connection = Arc::new(Connection {
        alive: AtomicBool::new(true),
        in_flight: AtomicUsize::new(0),
        responses: responses_tx,
    });
    let logger = logger.new(slog::o!("remote" => remote));
    let writer_connection = Arc::clone(&connection);
    let writer_logger = logger.clone();
    let writer = std::thread::Builder::new()
        .name("fencelock-client-out".into())
        .spawn(move || write_responses(write_half, responses_rx, &writer_connection, &writer_logger));
    if let Err(err) = writer {
        connections.fetch_sub(1, Ordering::SeqCst);
        warn!(logger, "cannot start a client writer"; "error" => %err);
        return;
    }
    let reader = ConnectionReader {
        connection,
        handler: Arc::clone(handler),
        in_flight_max: config.in_flight_max,
        frame_bytes_max: config.frame_bytes_max,
        connections: Arc::clone(connections),
        logger: logger.clone(),
    };
    if let Err(err) =
        std::thread::Builder::new().name("fencelock-client-in".into()).spawn(move || reader.run(stream))
    {
        warn!(logger, "cannot start a client reader"; "error" => %err);
    }
}

struct ConnectionReader {
    connection: Arc<Connection>,
    handler: Arc<dyn Handler>,
    in_flight_max: usize,
    frame_bytes_max: usize,
    connections: Arc<AtomicUsize>,
    logger: Logger,
}

impl ConnectionReader {
    fn run(self, stream: TcpStream) {
        let mut reader = BufReader::new(stream);
        loop {
            match read_frame::<Request>(&mut reader, self.frame_bytes_max) {
                Ok(request) => {
                    if !self.dispatch(request) {
                        break;
                    }
                }
                Err(FrameError::Closed) => {
                    debug!(self.logger, "client closed the connection");
                    break;
                }
                Err(err @ FrameError::TooLarge { .. }) => {
                    // Tell the client why before closing: it may be a
                    // well-meaning client with a huge request.
                    let _ = self.connection.responses.try_send(error_response(
                        0,
                        ErrorCode::INVALID_ARGUMENT,
                        err.to_string(),
                    ));
                    warn!(self.logger, "closing client connection"; "reason" => %err);
                    break;
                }
                Err(err) => {
                    warn!(self.logger, "closing client connection"; "reason" => %err);
                    break;
                }
            }
        }
        self.connection.alive.store(false, Ordering::SeqCst);
        // Lets the writer send what it has and end.
        let _ = reader.get_ref().shutdown(Shutdown::Read);
        self.connections.fetch_sub(1, Ordering::SeqCst);
    }

    /// Hands one request on; false when the connection must close.
    fn dispatch(&self, request: Request) -> bool {
        if self.connection.in_flight.load(Ordering::SeqCst) >= self.in_flight_max {
            let refusal = error_response(
                request.id,
                ErrorCode::UNAVAILABLE,
                format!("more than {} requests in flight on this connection", self.in_flight_max),
            );
            return self.connection.responses.try_send(refusal).is_ok();
        }
        self.connection.in_flight.fetch_add(1, Ordering::SeqCst);
        let sink = ResponseSink { id: request.id, connection: Arc::clone(&self.connection) };
        self.handler.handle(request, sink);
        true
    }
}

fn write_responses(
    mut stream: TcpStream,
    responses: Receiver<Response>,
    connection: &Connection,
    logger: &Logger,
) {
    let mut buffer = Vec::new();
    loop {
        let first = match responses.recv_timeout(Duration::from_millis(100)) {
            Ok(response) => response,
            Err(RecvTimeoutError::Timeout) => {
                if connection.alive.load(Ordering::SeqCst) {
                    continue;
                }
                break;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        buffer.clear();
        encode_frame(&first, &mut buffer);
        for response in responses.try_iter().take(1024) {
            encode_frame(&response, &mut buffer);
        }
        if let Err(err) = stream.write_all(&buffer) {
            debug!(logger, "client write failed"; "error" => %err);
            connection.alive.store(false, Ordering::SeqCst);
            break;
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}
