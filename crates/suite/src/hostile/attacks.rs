//! The attacks, one function each. Every attack runs until its deadline,
//! holds what it opened until then, looks at what the server did to it,
//! and closes everything before it returns. What the server must do is
//! in docs/limits.md; each attack's outcome says what it saw, and its
//! failures are the suite's.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fencelock_types::client_pb::{ErrorCode, PeerHello};
use serde::Serialize;
use serde_json::json;

use super::raw::{self, Tally};
use super::watch::{good_client, millis, GoodConfig};
use crate::rng::SplitMix64;

/// The attacks, in the order the suite runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Attack {
    WaitersFlood,
    PartialFrames,
    NonReader,
    IdleConnections,
    PeerGarbage,
    DecodeBomb,
    TableFlood,
    LogFlood,
}

impl Attack {
    pub const ALL: [Attack; 8] = [
        Attack::WaitersFlood,
        Attack::PartialFrames,
        Attack::NonReader,
        Attack::IdleConnections,
        Attack::PeerGarbage,
        Attack::DecodeBomb,
        Attack::TableFlood,
        Attack::LogFlood,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Attack::WaitersFlood => "waiters-flood",
            Attack::PartialFrames => "partial-frames",
            Attack::NonReader => "non-reader",
            Attack::IdleConnections => "idle-connections",
            Attack::PeerGarbage => "peer-garbage",
            Attack::DecodeBomb => "decode-bomb",
            Attack::TableFlood => "table-flood",
            Attack::LogFlood => "log-flood",
        }
    }
}

/// The limits the cluster runs with (passed as flags, so that these are
/// the values the attacks meet).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Limits {
    pub max_in_flight: usize,
    pub max_waiters_per_key: usize,
    pub max_connections_per_address: usize,
    pub max_input_bytes: usize,
    pub max_output_bytes: usize,
    pub max_locks: usize,
    pub max_locks_per_owner: usize,
}

/// Where the attacks aim, taken when each starts.
#[derive(Clone, Debug)]
pub struct Target {
    /// The leader's client address, and its process.
    pub leader: SocketAddr,
    pub leader_pid: Option<u32>,
    /// The client and peer addresses of every running node, and its
    /// process.
    pub clients: Vec<SocketAddr>,
    pub pids: Vec<Option<u32>>,
    pub peers: Vec<SocketAddr>,
    /// Every node's client address, for a fresh well-behaved client.
    pub endpoints: Vec<String>,
    pub good: GoodConfig,
    pub limits: Limits,
}

/// What one attack saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Outcome {
    /// One line for the summary.
    pub summary: String,
    pub figures: serde_json::Value,
    /// Each a broken expectation: the suite fails.
    pub failures: Vec<String>,
}

/// The keys the waiters flood queues on; the suite holds them for the
/// whole run with another owner.
pub fn held_key(index: usize) -> String {
    format!("hostile/held-{index}")
}
pub const HELD_KEYS: usize = 4;

const WAITER_CONNECTIONS: usize = 16;
const WAITERS_PER_CONNECTION: u64 = 4_096;
const WAITER_WAIT_MS: u64 = 60_000;

const PARTIAL_CONNECTIONS: usize = 400;
const PARTIAL_THREADS: usize = 8;
/// The length each partial frame claims (under the 1 MiB frame limit, so
/// that the server waits for the rest), and how much of it is sent.
const PARTIAL_CLAIM_BYTES: u32 = 1_000_000;
const PARTIAL_SENT_BYTES: usize = 900_000;
/// What a node may hold over `--max-input-bytes` when it is looked at:
/// it reads up to 64 KiB before it sheds, and a connection it closes
/// between our two looks still counts; two frames' worth.
const PARTIAL_SLACK_BYTES: usize = 2 * PARTIAL_SENT_BYTES;

const LISTS_PER_WRITE: u64 = 1_000;
/// A write the server does not take within this is taken as the server
/// having stopped reading.
const BLOCKED_AFTER: Duration = Duration::from_millis(300);

const IDLE_CONNECTIONS: usize = 4_096;
/// Without a second loopback source address, fewer idle connections, so
/// that the good clients (on 127.0.0.1) are not locked out by the
/// per-address limit.
const IDLE_CONNECTIONS_SAME_ADDRESS: usize = 1_000;
const IDLE_SOURCE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// The listen backlog of fencelockd's client port (mio's, 128): that many
/// connections may be established and not yet accepted.
const ACCEPT_BACKLOG: usize = 129;

const PEER_CONNECTIONS: usize = 50;

/// The table flood's window of unanswered acquires, and its locks' lease:
/// longer than any run, so that the table stays full.
const FLOOD_WINDOW: u64 = 1_024;
pub const LONG_LEASE_MS: u64 = 600_000;

/// Refused connections per second in the log flood, and the frame length
/// each claims (over any frame limit).
const LOG_FLOOD_PER_S: u64 = 400;
const LOG_FLOOD_HEADER: u32 = 0xFFFF_FFF0;

/// Runs `attack` against `target` until `deadline`.
pub fn run(attack: Attack, target: &Target, deadline: Instant, rng: &mut SplitMix64) -> Result<Outcome> {
    match attack {
        Attack::WaitersFlood => waiters_flood(target, deadline),
        Attack::PartialFrames => partial_frames(target, deadline),
        Attack::NonReader => non_reader(target, deadline),
        Attack::IdleConnections => idle_connections(target, deadline),
        Attack::PeerGarbage => peer_garbage(target, deadline, rng),
        Attack::DecodeBomb => decode_bomb(target, deadline),
        Attack::TableFlood => table_flood(target, deadline),
        Attack::LogFlood => log_flood(target, deadline),
    }
}

/// 16 connections to the leader, each pipelining 4,096 acquires that wait
/// a minute on a few held keys: 65,536 waiters asked for, where the server
/// takes 4,096 per key (`--max-waiters-per-key`) and 32,768 acquires in all
/// (`--max-pending-acquires`). The rest must be refused at once, with
/// RESOURCE_EXHAUSTED or UNAVAILABLE; the good clients must not notice.
fn waiters_flood(target: &Target, deadline: Instant) -> Result<Outcome> {
    let leader = target.leader;
    let threads: Vec<_> = (0..WAITER_CONNECTIONS)
        .map(|connection| {
            std::thread::Builder::new().name(format!("waiters-{connection}")).spawn(move || {
                raw::pipeline(leader, WAITERS_PER_CONNECTION, deadline, true, |id| {
                    (id <= WAITERS_PER_CONNECTION).then(|| {
                        let key = held_key((connection + id as usize) % HELD_KEYS);
                        let owner = format!("waiter/{connection}-{id}");
                        raw::acquire(id, key.as_bytes(), owner.as_bytes(), 2_000, WAITER_WAIT_MS)
                    })
                })
            })
        })
        .collect::<std::io::Result<_>>()
        .context("cannot start the waiters")?;
    let mut tally = Tally::default();
    let (mut sent, mut closed, mut errors) = (0, 0, Vec::new());
    for thread in threads {
        match thread.join().map_err(|_| anyhow::anyhow!("a waiter thread panicked"))? {
            Ok(run) => {
                sent += run.sent;
                tally.merge(&run.answers.tally);
                closed += u64::from(run.answers.closed_by_server);
                errors.extend(run.write_error.into_iter().chain(run.answers.error));
            }
            Err(err) => errors.push(format!("{err:#}")),
        }
    }
    let refused = tally.unavailable + tally.resource_exhausted;
    let waiting = sent.saturating_sub(tally.answers);
    let mut failures = Vec::new();
    if tally.granted + tally.not_granted + tally.other_ok + tally.invalid_argument + tally.other_error > 0 {
        failures.push(format!("answers other than a refusal or NOT_LEADER: {tally:?}"));
    }
    let room = (HELD_KEYS * target.limits.max_waiters_per_key) as u64;
    if sent > room && refused == 0 && tally.not_leader == 0 {
        failures.push(format!("{sent} waiters sent, room for {room}, and none refused"));
    }
    if closed > 0 {
        failures.push(format!("{closed} waiter connections closed by the server"));
    }
    Ok(Outcome {
        summary: format!(
            "{sent} waiting acquires sent on {WAITER_CONNECTIONS} connections: {} RESOURCE_EXHAUSTED, {} \
             UNAVAILABLE, {} NOT_LEADER; {waiting} still waiting at the end",
            tally.resource_exhausted, tally.unavailable, tally.not_leader
        ),
        figures: json!({ "sent": sent, "waiting_at_end": waiting, "answers": tally, "errors": errors }),
        failures,
    })
}

/// 400 connections spread over the nodes, each sending a 4-byte length of
/// 1,000,000 and 900,000 bytes of it, never the rest: 360 MB of partial
/// requests, where each node holds at most `--max-input-bytes` (64 MiB)
/// and closes the largest holders past it. What a node holds is counted
/// from both ends: the bytes sent on the connections it has not closed,
/// less those its kernel still has unread (/proc/net/tcp).
fn partial_frames(target: &Target, deadline: Instant) -> Result<Outcome> {
    let nodes = target.clients.clone();
    let threads: Vec<_> = (0..PARTIAL_THREADS)
        .map(|thread| {
            let nodes = nodes.clone();
            std::thread::Builder::new().name(format!("partial-{thread}")).spawn(move || {
                (thread..PARTIAL_CONNECTIONS)
                    .step_by(PARTIAL_THREADS)
                    .map(|index| (index % nodes.len(), partial_frame(nodes[index % nodes.len()], deadline)))
                    .collect::<Vec<_>>()
            })
        })
        .collect::<std::io::Result<_>>()
        .context("cannot start the partial senders")?;
    let mut held = Vec::new();
    for thread in threads {
        held.extend(thread.join().map_err(|_| anyhow::anyhow!("a partial sender panicked"))?);
    }
    sleep_until(deadline);
    let mut per_node = Vec::new();
    let mut failures = Vec::new();
    let mut closed_total = 0;
    for (node, addr) in nodes.iter().enumerate() {
        let mine: Vec<&Partial> =
            held.iter().filter(|(n, _)| *n == node).map(|(_, partial)| partial).collect();
        let sent_in_full = mine.iter().filter(|partial| partial.written == partial_frame_len()).count();
        let mut open_bytes = 0;
        let mut closed = 0;
        for partial in &mine {
            match &partial.stream {
                Some(stream) if !raw::peek_closed(stream).0 => open_bytes += partial.written,
                _ => closed += 1,
            }
        }
        closed_total += closed;
        // What the server holds is what reached it on the connections
        // still open, less what its kernel has not handed it yet.
        let sockets =
            target.pids.get(node).copied().flatten().and_then(|pid| server_sockets(pid, addr.port()));
        let unread: u64 = sockets.iter().flatten().map(|socket| socket.unread).sum();
        let held_by_server = sockets.as_ref().map(|_| (open_bytes as u64).saturating_sub(unread));
        let bound = (target.limits.max_input_bytes + PARTIAL_SLACK_BYTES) as u64;
        match held_by_server {
            Some(bytes) if bytes > bound => failures.push(format!(
                "{addr} held {bytes} bytes of partial requests; --max-input-bytes is {}",
                target.limits.max_input_bytes
            )),
            None => failures.push(format!("{addr}: cannot read the node's sockets in /proc")),
            _ => {}
        }
        per_node.push(json!({
            "addr": addr.to_string(), "connections": mine.len(), "sent_in_full": sent_in_full,
            "closed_by_server": closed, "bytes_on_open_connections": open_bytes, "unread_by_server": unread,
            "held_by_server": held_by_server,
        }));
    }
    let held_text: Vec<String> = per_node
        .iter()
        .map(|node| {
            let held = node["held_by_server"].as_u64().map_or_else(
                || "?".to_owned(),
                |bytes| format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20)),
            );
            format!("{} closed, {held} held", node["closed_by_server"])
        })
        .collect();
    Ok(Outcome {
        summary: format!(
            "{PARTIAL_CONNECTIONS} partial frames of {PARTIAL_SENT_BYTES}/{PARTIAL_CLAIM_BYTES} bytes over {} nodes: \
             {closed_total} connections closed by the servers; per node {}",
            nodes.len(),
            held_text.join(", ")
        ),
        figures: json!({ "per_node": per_node }),
        failures,
    })
}

/// One partial frame: how much of it went out, and its connection while
/// the server has not closed it.
#[derive(Debug)]
struct Partial {
    written: usize,
    stream: Option<TcpStream>,
}

fn partial_frame_len() -> usize {
    4 + PARTIAL_SENT_BYTES
}

fn partial_frame(addr: SocketAddr, deadline: Instant) -> Partial {
    let Some(timeout) = connect_timeout(deadline) else { return Partial { written: 0, stream: None } };
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return Partial { written: 0, stream: None };
    };
    let mut bytes = PARTIAL_CLAIM_BYTES.to_be_bytes().to_vec();
    bytes.resize(partial_frame_len(), b'x');
    let mut written = 0;
    while written < bytes.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_write_timeout(Some(left)).is_err() {
            break;
        }
        match stream.write(&bytes[written..]) {
            Ok(0) => return Partial { written, stream: None },
            Ok(n) => written += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) if raw::is_closed(&err) => return Partial { written, stream: None },
            // Timed out: the server stopped reading.
            Err(_) => break,
        }
    }
    Partial { written, stream: Some(stream) }
}

/// One connection to the leader that sends `list` requests (every lock:
/// the table holds thousands of the longest) and never reads an answer.
/// The server answers one list at a time, stops reading a connection whose
/// unsent answers pass 256 KiB, and closes the worst non-reader once all
/// unsent answers pass `--max-output-bytes`: either way our writes must
/// stop going through, or the connection must close.
fn non_reader(target: &Target, deadline: Instant) -> Result<Outcome> {
    let mut stream = TcpStream::connect_timeout(&target.leader, Duration::from_secs(2))
        .with_context(|| format!("cannot connect to {}", target.leader))?;
    stream.set_nodelay(true)?;
    let start = Instant::now();
    let mut sent = 0u64;
    let mut blocked_after = None;
    let mut closed = false;
    let mut buffer = Vec::new();
    while Instant::now() < deadline {
        buffer.clear();
        for id in sent + 1..=sent + LISTS_PER_WRITE {
            fencelock_net::encode_frame(&raw::list_all(id), &mut buffer);
        }
        stream.set_write_timeout(Some(BLOCKED_AFTER))?;
        match stream.write_all(&buffer) {
            Ok(()) => sent += LISTS_PER_WRITE,
            Err(err) if raw::is_closed(&err) => {
                closed = true;
                break;
            }
            Err(_) => {
                blocked_after = Some(start.elapsed());
                break;
            }
        }
    }
    sleep_until(deadline);
    let (closed_at_end, first) = raw::peek_closed(&stream);
    let closed = closed || closed_at_end;
    let mut failures = Vec::new();
    if blocked_after.is_none() && !closed {
        failures.push(format!(
            "the leader took {sent} list requests ({} bytes) from a client that reads nothing, and kept the \
             connection open",
            sent * 8
        ));
    }
    let outcome = match (closed, blocked_after) {
        (true, _) => "the server closed the connection".to_owned(),
        (false, Some(after)) => format!("the server stopped reading after {} ms", millis(after)),
        (false, None) => "the server kept reading".to_owned(),
    };
    Ok(Outcome {
        summary: format!("{sent} list requests sent before writes stopped; {outcome}"),
        figures: json!({
            "lists_sent": sent, "blocked_after_ms": blocked_after.map(millis), "closed": closed,
            "first_bytes_decode": first.map(|response| response.id),
        }),
        failures,
    })
}

/// 4,096 connections to the leader that send nothing, from 127.0.0.2, so
/// that the per-address limit (1,024) refuses the rest with UNAVAILABLE
/// "too many connections from this address" while clients on 127.0.0.1
/// still connect; then a fresh well-behaved client must connect and take a
/// lock. The connects are all started at once, without waiting: a SYN
/// that finds the server's accept queue full is dropped and sent again by
/// the kernel a second later, and a blocking connector would spend the
/// slice waiting for those.
fn idle_connections(target: &Target, deadline: Instant) -> Result<Outcome> {
    let leader = target.leader;
    let (source, count, note) = match raw::connect_from(IDLE_SOURCE, leader, Duration::from_secs(1)) {
        Ok(stream) => {
            drop(stream);
            (IDLE_SOURCE, IDLE_CONNECTIONS, format!("from {IDLE_SOURCE}"))
        }
        Err(err) => (
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IDLE_CONNECTIONS_SAME_ADDRESS,
            format!("from 127.0.0.1 (cannot bind {IDLE_SOURCE}: {err:#})"),
        ),
    };
    let one_address = source != IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut streams = Vec::new();
    let mut failed = 0;
    let mut first_error = None;
    for _ in 0..count {
        match raw::start_connect_from(source, leader) {
            Ok(stream) => streams.push(stream),
            Err(err) => {
                failed += 1;
                first_error.get_or_insert_with(|| format!("{err:#}"));
            }
        }
    }
    let mut failures = Vec::new();
    let fresh = fresh_client(target);
    if let Err(err) = &fresh {
        failures.push(format!("a new client on 127.0.0.1 could not take a lock: {err:#}"));
    }
    // Looked at when the slice ends, a little before, so that the count
    // of the leader's sockets fits in the slice.
    sleep_until(deadline - Duration::from_millis(100));
    let (mut open, mut refused, mut closed, mut connecting) = (0, 0, 0, 0);
    let mut refusal = None;
    for stream in &streams {
        if stream.peer_addr().is_err() {
            // The handshake never finished: every SYN dropped so far.
            connecting += 1;
            continue;
        }
        match raw::peek_closed(stream) {
            (false, _) => open += 1,
            (true, Some(answer)) if answer.get_error().get_code() == ErrorCode::UNAVAILABLE => {
                refused += 1;
                refusal.get_or_insert_with(|| answer.get_error().get_message().to_owned());
            }
            (true, _) => closed += 1,
        }
    }
    // A client's connect can finish while the server's accept queue is
    // full (the last ACK of the handshake is dropped, the client does not
    // know): what the client sees open is not what the server holds. So
    // count the server's own sockets from that address.
    let sockets = target.leader_pid.and_then(|pid| server_sockets(pid, leader.port()));
    let mut states = BTreeMap::new();
    for socket in sockets.iter().flatten().filter(|socket| IpAddr::V4(socket.peer) == source) {
        *states.entry(format!("{:02X}", socket.state)).or_insert(0usize) += 1;
    }
    let held = sockets.as_ref().map(|_| states.values().sum::<usize>());
    drop(streams);
    let cap = target.limits.max_connections_per_address;
    match held {
        Some(held) if one_address && held > cap => {
            failures.push(format!("the leader holds {held} connections from {source}; the limit is {cap}"))
        }
        None if one_address => failures.push("cannot count the leader's sockets in /proc".to_owned()),
        _ => {}
    }
    if one_address && open + refused + closed > cap + ACCEPT_BACKLOG && refused == 0 {
        failures.push(format!("{} connections from one address and none refused", open + refused + closed));
    }
    Ok(Outcome {
        summary: format!(
            "{count} idle connections {note}: the leader holds {}; the clients see {open} open, {refused} refused \
             ({}), {closed} closed, {connecting} still connecting, {failed} not started; a new client {}",
            held.map_or_else(|| "?".to_owned(), |held| held.to_string()),
            refusal.as_deref().unwrap_or("no refusal"),
            match &fresh {
                Ok(ms) => format!("took a lock in {ms} ms"),
                Err(_) => "could not take a lock".to_owned(),
            }
        ),
        figures: json!({
            "asked": count, "source": source.to_string(), "held_by_leader": held,
            "held_by_state": states, "open": open, "refused": refused, "closed": closed,
            "still_connecting": connecting, "not_started": failed, "first_error": first_error,
            "refusal": refusal, "fresh_client_ms": fresh.as_ref().ok(),
        }),
        failures,
    })
}

/// One TCP socket of a server process, from /proc/net/tcp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ServerSocket {
    peer: Ipv4Addr,
    /// The kernel's state number (1 established, 8 close-wait, ...).
    state: u8,
    /// Bytes received and not yet read by the process.
    unread: u64,
}

/// The TCP sockets process `pid` holds on its local `port`: its sockets
/// in /proc/<pid>/fd, looked up in /proc/net/tcp.
fn server_sockets(pid: u32, port: u16) -> Option<Vec<ServerSocket>> {
    let mut inodes = std::collections::HashSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        let Ok(link) = std::fs::read_link(entry.path()) else { continue };
        let link = link.to_string_lossy();
        if let Some(inode) = link.strip_prefix("socket:[").and_then(|rest| rest.strip_suffix(']')) {
            inodes.insert(inode.to_owned());
        }
    }
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    Some(table.lines().skip(1).filter_map(|line| parse_tcp_line(line, port, &inodes)).collect())
}

/// One line of /proc/net/tcp, if it is a socket of `inodes` on `port`.
fn parse_tcp_line(line: &str, port: u16, inodes: &std::collections::HashSet<String>) -> Option<ServerSocket> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (local, peer, state, queues, inode) =
        (fields.get(1)?, fields.get(2)?, fields.get(3)?, fields.get(4)?, fields.get(9)?);
    if !inodes.contains(*inode) || u16::from_str_radix(local.split(':').nth(1)?, 16).ok()? != port {
        return None;
    }
    // The address is the kernel's u32 in host order, in hex.
    let peer = u32::from_str_radix(peer.split(':').next()?, 16).ok()?;
    Some(ServerSocket {
        peer: Ipv4Addr::from(peer.to_ne_bytes()),
        state: u8::from_str_radix(state, 16).ok()?,
        unread: u64::from_str_radix(queues.split(':').nth(1)?, 16).ok()?,
    })
}

/// A new client, its own connection, takes a lock and gives it back: how
/// long that took.
fn fresh_client(target: &Target) -> Result<u64> {
    let start = Instant::now();
    let client = good_client(&target.good, &target.endpoints, "good/fresh")?;
    let grant = client.acquire_raw(b"good/fresh", "good/fresh/0", target.good.lease, Duration::ZERO)?;
    client.release("good/fresh/0", grant.token)?;
    Ok(millis(start.elapsed()))
}

/// 50 connections to the nodes' peer ports: a third send nothing, a third
/// half a hello, a third random bytes. Each node keeps 8 places for
/// connections that have not said their hello and evicts the oldest; the
/// peers' own connections have said theirs. The leader must stay (the
/// caller checks).
fn peer_garbage(target: &Target, deadline: Instant, rng: &mut SplitMix64) -> Result<Outcome> {
    let hello = {
        let mut frame = Vec::new();
        let hello =
            PeerHello { node_id: 1, client_addr: "127.0.0.1:1".into(), term: 1, ..Default::default() };
        fencelock_net::encode_frame(&hello, &mut frame);
        frame
    };
    let mut streams = Vec::new();
    let mut failed = 0;
    for index in 0..PEER_CONNECTIONS {
        let addr = target.peers[index % target.peers.len()];
        let Some(timeout) = connect_timeout(deadline) else { break };
        let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
            failed += 1;
            continue;
        };
        let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
        let bytes: Vec<u8> = match index % 3 {
            0 => Vec::new(),
            1 => hello[..hello.len() / 2].to_vec(),
            _ => {
                let len = rng.between(1, 4_096) as usize;
                (0..len).map(|_| rng.next_u64() as u8).collect()
            }
        };
        let _ = stream.write_all(&bytes);
        streams.push(stream);
    }
    sleep_until(deadline);
    let closed = streams.iter().filter(|stream| raw::peek_closed(stream).0).count();
    let opened = streams.len();
    Ok(Outcome {
        summary: format!(
            "{opened} connections to {} peer ports (nothing, half a hello, random bytes): {closed} closed by the \
             nodes, {failed} could not connect",
            target.peers.len()
        ),
        figures: json!({ "connections": opened, "closed": closed, "connect_failed": failed }),
        failures: Vec::new(),
    })
}

/// The decode bombs of issue 31: on each running node's real peer port, a
/// peer's hello (in the name of another member: plain TCP authenticates
/// nothing), then a raft message of nothing but empty entries, two bytes
/// each: 16 MiB in one frame, and on a second connection 40 MiB in 8 MiB
/// parts. Decoded, the first would be eight million entries (1.4 GB measured
/// before the fix), the second twenty million. The node must close both
/// connections without decoding them; its memory is the suite's check.
fn decode_bomb(target: &Target, deadline: Instant) -> Result<Outcome> {
    const EMPTY_ENTRY: [u8; 2] = [0x3a, 0x00];
    let one_frame = 16 << 20;
    let in_parts = 40 << 20;
    let part = fencelock_net::PART_BYTES;
    let body = |len: usize| -> Vec<u8> { EMPTY_ENTRY.iter().copied().cycle().take(len).collect() };
    let mut sent = 0;
    let mut closed = 0;
    let mut failures = Vec::new();
    let nodes = target.peers.len() as u64;
    for (index, addr) in target.peers.iter().enumerate() {
        for (bytes, parts) in [(one_frame, false), (in_parts, true)] {
            let Some(timeout) = connect_timeout(deadline) else { break };
            let Ok(mut stream) = TcpStream::connect_timeout(addr, timeout) else { continue };
            let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
            // Another member's id: node ids run from 1.
            let from = (index as u64 + 1) % nodes + 1;
            let mut frames = Vec::new();
            let hello = PeerHello { node_id: from, client_addr: "127.0.0.1:1".into(), ..Default::default() };
            fencelock_net::encode_frame(&hello, &mut frames);
            let bomb = body(bytes);
            let chunks: Vec<&[u8]> = if parts { bomb.chunks(part).collect() } else { vec![&bomb[..]] };
            for (at, chunk) in chunks.iter().enumerate() {
                let more = at + 1 < chunks.len();
                let header = chunk.len() as u32 | if more { fencelock_net::PART_FLAG } else { 0 };
                frames.extend_from_slice(&header.to_be_bytes());
                frames.extend_from_slice(chunk);
            }
            // The node may close the connection before it has read it all.
            let _ = stream.write_all(&frames);
            sent += 1;
            // Closed by the node soon after it has the whole message: read
            // (its hello, if it sent one) to the end, or to the deadline.
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let mut answered = Vec::new();
            let was_closed = match std::io::Read::read_to_end(&mut stream, &mut answered) {
                Ok(_) => true,
                Err(err) => raw::is_closed(&err),
            };
            if was_closed {
                closed += 1;
            } else {
                failures.push(format!("node at {addr} kept a connection after a {} MiB bomb", bytes >> 20));
            }
        }
    }
    Ok(Outcome {
        summary: format!(
            "{sent} decode bombs (16 MiB of empty entries in one frame, 40 MiB in parts) on {} peer ports: {closed} \
             connections closed by the nodes",
            target.peers.len()
        ),
        figures: json!({ "bombs": sent, "closed": closed }),
        failures,
    })
}

/// One client creating locks as fast as it can: 1,024-byte keys, 256-byte
/// owners of the identity `flood`, a long lease, a window of 1,024
/// unanswered acquires on one connection to the leader. `--max-locks-per-owner`
/// must stop it with RESOURCE_EXHAUSTED before `--max-locks` is reached,
/// so that the other owners still find room.
fn table_flood(target: &Target, deadline: Instant) -> Result<Outcome> {
    let run = raw::pipeline(target.leader, FLOOD_WINDOW, deadline, false, |id| {
        let key = raw::padded(&format!("flood/{id:010}/"), fencelock_types::KEY_LEN_MAX, b'k');
        let owner = raw::padded(&format!("flood/{id}/"), fencelock_types::OWNER_LEN_MAX, b'o');
        Some(raw::acquire(id, &key, &owner, LONG_LEASE_MS, 0))
    })?;
    let tally = &run.answers.tally;
    let mut failures = Vec::new();
    if tally.granted > target.limits.max_locks_per_owner as u64 {
        failures.push(format!(
            "{} locks granted to one identity; --max-locks-per-owner is {}",
            tally.granted, target.limits.max_locks_per_owner
        ));
    }
    if tally.other_error + tally.invalid_argument + tally.not_granted + tally.other_ok > 0 {
        failures.push(format!("unexpected answers: {tally:?}"));
    }
    let quota = match run.answers.first_exhausted_ms {
        Some(ms) => format!("the quota refused it from {ms} ms on"),
        None => "the quota was not reached in the slice".to_owned(),
    };
    Ok(Outcome {
        summary: format!(
            "{} acquires sent, {} granted, {} RESOURCE_EXHAUSTED, {} UNAVAILABLE; {quota}",
            run.sent, tally.granted, tally.resource_exhausted, tally.unavailable
        ),
        figures: json!({ "run": run, "met_quota": tally.resource_exhausted > 0 }),
        failures,
    })
}

/// Hundreds of connections a second, spread over the nodes, each sending a
/// frame length of 0xFFFFFFF0 and hanging up: each is refused with a
/// warning, and the warnings are throttled to one per 10 s per address and
/// kind. The caller counts the log lines.
fn log_flood(target: &Target, deadline: Instant) -> Result<Outcome> {
    let start = Instant::now();
    let mut opened = 0u64;
    let mut failed = 0u64;
    let mut invalid = 0u64;
    while Instant::now() < deadline {
        let addr = target.clients[opened as usize % target.clients.len()];
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(mut stream) => {
                let _ = stream.write_all(&LOG_FLOOD_HEADER.to_be_bytes());
                // Every tenth waits for the refusal, to see that it comes.
                if opened.is_multiple_of(10) {
                    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
                    if let Ok(response) = fencelock_net::read_frame::<fencelock_types::client_pb::Response>(
                        &mut stream,
                        1 << 20,
                    ) {
                        if response.get_error().get_code() == ErrorCode::INVALID_ARGUMENT {
                            invalid += 1;
                        }
                    }
                }
            }
            Err(_) => failed += 1,
        }
        opened += 1;
        let next = start + Duration::from_micros(opened * 1_000_000 / LOG_FLOOD_PER_S);
        sleep_until(next.min(deadline));
    }
    let rate = opened as f64 / start.elapsed().as_secs_f64().max(0.001);
    Ok(Outcome {
        summary: format!(
            "{opened} connections ({rate:.0}/s) sent a length of {LOG_FLOOD_HEADER:#x} and hung up; {invalid} of \
             {} asked got INVALID_ARGUMENT; {failed} could not connect",
            opened.div_ceil(10)
        ),
        figures: json!({ "opened": opened, "per_s": rate, "invalid_argument_seen": invalid, "connect_failed": failed }),
        failures: Vec::new(),
    })
}

/// A connect's timeout: a second, or what is left of the slice; `None`
/// once it is over. A connect whose SYN a full accept queue dropped waits
/// a second for the kernel to send it again.
fn connect_timeout(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    (left >= Duration::from_millis(10)).then(|| left.min(Duration::from_secs(1)))
}

fn sleep_until(deadline: Instant) {
    let left = deadline.saturating_duration_since(Instant::now());
    if !left.is_zero() {
        std::thread::sleep(left);
    }
}
