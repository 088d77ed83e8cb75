//! The event-driven generator for the lock workloads: every client
//! connection is driven by one thread, over mio, speaking the client
//! protocol directly (frames of `client.proto`).
//!
//! N clients are still N connections to the leader, each with one request
//! in flight, doing what the thread-per-client generator does (acquire,
//! then release, in a loop; the same keys, owners per connection, timings
//! and grant records). What differs is the generator's own cost: 256
//! blocking threads on a two-core machine take most of a core and queue for
//! it behind the servers, which then measures the scheduler as much as the
//! cluster. `redis-benchmark` and etcd's `benchmark` are built the same way
//! (an event loop, goroutines). The thread-per-client generator, through
//! `fencelock-client`, stays available as `--generator threads`.
//!
//! It follows no redirect and retries nothing but what the thread generator
//! retries: it talks to the leader it was given, and an error answer is
//! counted and its acquire sent again after a pause.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use fencelock_net::frame::{decode_frame, encode_frame};
use fencelock_net::{Got, Wire};
use fencelock_types::client_pb::{
    AcquireOutcome, AcquireRequest, ErrorCode, ReleaseRequest, Request, Request_oneof_kind, Response,
    Response_oneof_kind,
};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::order::GrantRecord;
use crate::tally::{Shared, Tally, ERROR_PAUSE, MEASURE, STOP};

/// The largest response frame taken: lock answers are tiny.
const FRAME_BYTES_MAX: usize = 1 << 20;

/// How long the connections get, once the run stops, to finish their cycle
/// (a waiting acquire may wait `wait` first).
const FINISH_WITHIN: Duration = Duration::from_secs(10);

/// One connection's place in its cycle.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// An acquire is in flight, sent at `sent` in `phase`.
    Acquiring { sent: Instant, phase: u8 },
    /// The release of `token` is in flight.
    Releasing { sent: Instant, phase: u8, granted: Instant, release_sent: Instant, token: u64 },
    /// Paused after an error until `until`; then acquires again.
    Paused { until: Instant },
    /// The run stopped and this connection holds nothing.
    Done,
}

pub struct Connection {
    index: usize,
    wire: Wire,
    key: Vec<u8>,
    owner: Vec<u8>,
    input: Vec<u8>,
    output: Vec<u8>,
    next_id: u64,
    step: Step,
}

/// What the event generator needs of a run.
pub struct EventRun<'a> {
    pub leader: SocketAddr,
    pub clients: usize,
    /// The key of client `index`.
    pub key: &'a (dyn Fn(usize) -> String + Sync),
    pub lease: Duration,
    pub wait: Duration,
    /// Record every grant, for the order checks (hot key).
    pub grants: bool,
    pub owner_prefix: String,
}

/// Connects every client; the loop itself runs in [`drive`].
pub fn connect(run: &EventRun<'_>) -> Result<(Poll, Vec<Connection>)> {
    let poll = Poll::new().context("cannot create a poll")?;
    let mut connections = Vec::with_capacity(run.clients);
    for index in 0..run.clients {
        let stream = std::net::TcpStream::connect_timeout(&run.leader, Duration::from_secs(5))
            .with_context(|| format!("cannot connect client {index} to {}", run.leader))?;
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        let mut stream = TcpStream::from_std(stream);
        poll.registry().register(&mut stream, Token(index), Interest::READABLE | Interest::WRITABLE)?;
        let wire = match crate::tls::rustls_config() {
            None => Wire::plain(stream),
            Some(config) => {
                let name = rustls::pki_types::ServerName::IpAddress(run.leader.ip().into());
                Wire::tls_client(stream, &config, name).context("cannot start TLS")?
            }
        };
        connections.push(Connection {
            index,
            wire,
            key: (run.key)(index).into_bytes(),
            owner: format!("{}/{index}", run.owner_prefix).into_bytes(),
            input: Vec::new(),
            output: Vec::new(),
            next_id: 0,
            step: Step::Done,
        });
    }
    Ok((poll, connections))
}

/// Runs every connection's cycle until the shared phase says stop and each
/// has finished its cycle; returns what they counted.
pub fn drive(
    run: &EventRun<'_>,
    mut poll: Poll,
    mut connections: Vec<Connection>,
    shared: &Shared,
) -> Result<Tally> {
    let mut tally = Tally::default();
    let lease_ms = u64::try_from(run.lease.as_millis()).unwrap_or(u64::MAX);
    let wait_ms = u64::try_from(run.wait.as_millis()).unwrap_or(u64::MAX);
    let now = Instant::now();
    for connection in &mut connections {
        acquire(connection, shared, now, lease_ms, wait_ms)?;
    }
    let mut events = Events::with_capacity(1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut stop_deadline: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if shared.phase() == STOP {
            let deadline = *stop_deadline.get_or_insert(now + FINISH_WITHIN + run.wait);
            for connection in &mut connections {
                if matches!(connection.step, Step::Paused { .. }) {
                    connection.step = Step::Done;
                }
            }
            if connections.iter().all(|connection| matches!(connection.step, Step::Done)) {
                return Ok(tally);
            }
            if now >= deadline {
                tally.count("unfinished at stop".to_owned());
                return Ok(tally);
            }
        }
        // Paused connections go again when their pause is over.
        let mut next_wake = now + Duration::from_millis(50);
        for connection in &mut connections {
            if let Step::Paused { until } = connection.step {
                if until <= now {
                    acquire(connection, shared, now, lease_ms, wait_ms)?;
                } else {
                    next_wake = next_wake.min(until);
                }
            }
        }
        match poll.poll(&mut events, Some(next_wake.saturating_duration_since(now))) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err).context("poll failed"),
        }
        for event in events.iter() {
            let Some(connection) = connections.get_mut(event.token().0) else { continue };
            if event.is_writable() {
                flush(connection)?;
            }
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                read(connection, &mut chunk)?;
                while let Some(response) = next_response(connection)? {
                    answer(connection, response, run, shared, &mut tally, lease_ms, wait_ms)?;
                }
            }
        }
    }
}

/// Sends an acquire on `connection`, unless the run has stopped.
fn acquire(
    connection: &mut Connection,
    shared: &Shared,
    now: Instant,
    lease_ms: u64,
    wait_ms: u64,
) -> Result<()> {
    let phase = shared.phase();
    if phase == STOP {
        connection.step = Step::Done;
        return Ok(());
    }
    let request = Request_oneof_kind::acquire(AcquireRequest {
        key: connection.key.clone(),
        owner: connection.owner.clone(),
        lease_ms,
        wait_ms,
        ..Default::default()
    });
    connection.step = Step::Acquiring { sent: now, phase };
    send(connection, request)
}

fn send(connection: &mut Connection, kind: Request_oneof_kind) -> Result<()> {
    connection.next_id += 1;
    let request = Request { id: connection.next_id, kind: Some(kind), ..Default::default() };
    encode_frame(&request, &mut connection.output);
    flush(connection)
}

fn flush(connection: &mut Connection) -> Result<()> {
    // TLS records (the handshake's too) go first.
    connection.wire.flush().with_context(|| format!("client {}: write failed", connection.index))?;
    while !connection.output.is_empty() {
        match connection.wire.write(&connection.output) {
            Ok(0) => bail!("client {}: the leader closed the connection", connection.index),
            Ok(n) => {
                connection.output.drain(..n);
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => {
                return Err(err).with_context(|| format!("client {}: write failed", connection.index))
            }
        }
    }
    Ok(())
}

fn read(connection: &mut Connection, chunk: &mut [u8]) -> Result<()> {
    loop {
        match connection.wire.read(chunk, &mut connection.input) {
            Ok(Got::Closed) => bail!("client {}: the leader closed the connection", connection.index),
            Ok(Got::Bytes(_)) => {}
            Ok(Got::Nothing) => return Ok(()),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err).with_context(|| format!("client {}: read failed", connection.index)),
        }
    }
}

/// The next whole response in the connection's input.
fn next_response(connection: &mut Connection) -> Result<Option<Response>> {
    let decoded = decode_frame::<Response>(&connection.input, FRAME_BYTES_MAX)
        .with_context(|| format!("client {}: a bad response frame", connection.index))?;
    let Some((response, used)) = decoded else { return Ok(None) };
    connection.input.drain(..used);
    if response.id == 0 {
        return Err(anyhow!(
            "client {}: the leader refused the connection: {:?}",
            connection.index,
            response.error
        ));
    }
    Ok(Some(response))
}

/// Moves `connection` on in its cycle with `response`.
fn answer(
    connection: &mut Connection,
    response: Response,
    run: &EventRun<'_>,
    shared: &Shared,
    tally: &mut Tally,
    lease_ms: u64,
    wait_ms: u64,
) -> Result<()> {
    let now = Instant::now();
    if response.id != connection.next_id {
        // An answer to nothing in flight: the protocol says one per request.
        bail!(
            "client {}: an answer to request {} while {} is in flight",
            connection.index,
            response.id,
            connection.next_id
        );
    }
    let error = response.error.as_ref().filter(|error| error.code != ErrorCode::OK).map(|error| error.code);
    match connection.step {
        Step::Acquiring { sent, phase } => {
            if let Some(code) = error {
                tally.count(format!("acquire:{code:?}").to_lowercase());
                connection.step = Step::Paused { until: now + ERROR_PAUSE };
                return Ok(());
            }
            let Some(Response_oneof_kind::acquire(acquired)) = response.kind else {
                bail!("client {}: an acquire answered with {:?}", connection.index, response.kind);
            };
            if acquired.outcome != AcquireOutcome::GRANTED {
                // Held, or the wait ran out: not obtained, try again at once.
                tally.count(format!("acquire:{:?}", acquired.outcome).to_lowercase());
                return acquire(connection, shared, now, lease_ms, wait_ms);
            }
            let release_sent = Instant::now();
            let release = Request_oneof_kind::release(ReleaseRequest {
                key: connection.key.clone(),
                token: acquired.token,
                ..Default::default()
            });
            connection.step =
                Step::Releasing { sent, phase, granted: now, release_sent, token: acquired.token };
            send(connection, release)
        }
        Step::Releasing { sent, phase, granted, release_sent, token } => {
            if run.grants {
                tally.grants.push(GrantRecord {
                    measured: phase == MEASURE,
                    client: connection.index,
                    token,
                    sent_ns: shared.nanos(sent),
                    granted_ns: shared.nanos(granted),
                    release_sent_ns: shared.nanos(release_sent),
                });
            }
            if let Some(code) = error {
                tally.count(format!("release:{code:?}").to_lowercase());
                connection.step = Step::Paused { until: now + ERROR_PAUSE };
                return Ok(());
            }
            let released =
                matches!(&response.kind, Some(Response_oneof_kind::release(release)) if release.released);
            if !released {
                tally.count("release:not_held".to_owned());
            } else if phase == MEASURE {
                tally.cycles += 1;
                tally.time("acquire", granted - sent);
                tally.time("release", now - granted);
            }
            acquire(connection, shared, now, lease_ms, wait_ms)
        }
        Step::Paused { .. } | Step::Done => {
            bail!("client {}: an answer with nothing in flight", connection.index)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::BufReader;
    use std::net::TcpListener;

    use fencelock_net::frame::{read_frame, write_frame};
    use fencelock_types::client_pb::{AcquireResponse, Error, ReleaseResponse};

    use super::*;

    /// A one-connection-per-thread fake leader: grants every acquire a new
    /// token, refuses every `refuse_every`-th acquire with UNAVAILABLE, and
    /// releases what it granted.
    fn fake_leader(refuse_every: u64) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let next_token = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1));
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let next_token = std::sync::Arc::clone(&next_token);
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut writer = stream;
                    let mut acquires = 0;
                    while let Ok(request) = read_frame::<Request>(&mut reader, 1 << 20) {
                        let mut response = Response { id: request.id, ..Default::default() };
                        match request.kind {
                            Some(Request_oneof_kind::acquire(_)) => {
                                acquires += 1;
                                if acquires % refuse_every == 0 {
                                    let error = Error { code: ErrorCode::UNAVAILABLE, ..Default::default() };
                                    response.error = Some(error).into();
                                } else {
                                    let token = next_token.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                    response.kind = Some(Response_oneof_kind::acquire(AcquireResponse {
                                        outcome: AcquireOutcome::GRANTED,
                                        token,
                                        ..Default::default()
                                    }));
                                }
                            }
                            Some(Request_oneof_kind::release(release)) => {
                                response.kind = Some(Response_oneof_kind::release(ReleaseResponse {
                                    released: true,
                                    token: release.token,
                                    ..Default::default()
                                }));
                            }
                            _ => return,
                        }
                        if write_frame(&mut writer, &response).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    #[test]
    fn every_connection_cycles_counts_only_the_measured_window_and_stops_holding_nothing() {
        let key = |index: usize| format!("k/{index}");
        let run = EventRun {
            leader: fake_leader(7),
            clients: 8,
            key: &key,
            lease: Duration::from_secs(30),
            wait: Duration::ZERO,
            grants: true,
            owner_prefix: "o".into(),
        };
        let (poll, connections) = connect(&run).unwrap();
        let shared = Shared::new();
        let tally = std::thread::scope(|scope| {
            let driver = scope.spawn(|| drive(&run, poll, connections, &shared));
            std::thread::sleep(Duration::from_millis(100));
            shared.set_phase(MEASURE);
            std::thread::sleep(Duration::from_millis(300));
            shared.set_phase(STOP);
            driver.join().unwrap()
        })
        .unwrap();
        assert!(tally.cycles > 8, "{} cycles", tally.cycles);
        let measured = tally.grants.iter().filter(|grant| grant.measured).count() as u64;
        assert!(tally.grants.len() as u64 > measured, "warm-up grants are recorded, not counted");
        // Every measured grant was released, the last ones included.
        assert_eq!(tally.cycles, measured);
        // Each connection saw its refusals, paused and went on.
        assert!(
            tally.errors.get("acquire:unavailable").is_some_and(|count| *count >= 8),
            "{:?}",
            tally.errors
        );
        let mut clients: Vec<usize> = tally.grants.iter().map(|grant| grant.client).collect();
        clients.sort_unstable();
        clients.dedup();
        assert_eq!(clients, (0..8).collect::<Vec<_>>());
    }
}
