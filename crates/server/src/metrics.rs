//! The optional metrics port (`--metrics-addr`), on a thread of its own:
//!
//! - `GET /metrics`: Prometheus metrics in the text exposition format. It
//!   asks the node loop for the node's status and counters on each scrape
//!   (one channel message and a wake-up), and adds raft-engine's own
//!   metrics (its write and fsync latency histograms), which raft-engine
//!   keeps in the default registry.
//! - `GET /health`: `200 ok` while the process serves, that is while its
//!   node loop answers that same round trip in time; else 503.
//! - `GET /ready`: 200 when this node can serve clients now (see
//!   [`readiness`]); else 503 with one line saying why.
//!
//! HTTP is hyper's (HTTP/1, on a tokio runtime of the thread's own).
//! Connections are served side by side, each bounded in size and time: its
//! request head must come within [`HEAD_WITHIN`], the whole exchange end
//! within [`EXCHANGE_WITHIN`], and at most [`CONNECTIONS_MAX`] are open at
//! once. A scraper or prober that stalls or speaks nonsense gets an error
//! or a closed socket, never reaches the node loop, and never holds up
//! another: `/health` answers while a thousand connections trickle bytes.

use std::convert::Infallible;
use std::fmt;
use std::net::TcpListener;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use crossbeam_channel::{bounded, Sender};
use fencelock_net::LoopWaker;
use fencelock_raft::gate::Refusal;
use fencelock_raft::shell::Request;
use fencelock_raft::{NodeStatus, Role, Stats};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};
use slog::{debug, warn, Logger};

/// The longest request head read (hyper's smallest buffer).
const REQUEST_BYTES_MAX: usize = 8 * 1024;
/// How long a client may take to send its request head.
const HEAD_WITHIN: Duration = Duration::from_secs(2);
/// How long one connection may last, its answer written.
const EXCHANGE_WITHIN: Duration = Duration::from_secs(5);
/// Connections open at once; one more is closed as soon as it is taken.
const CONNECTIONS_MAX: usize = 2_048;
/// Threads that make answers (each may wait for the node loop).
const BLOCKING_THREADS: usize = 4;
/// How long a scrape or probe waits for the node loop. A loop that takes
/// longer does not serve: `/health` and `/ready` answer 503.
const LOOP_ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// Serves the metrics port on `listener` from a thread named
/// `fencelock-metrics`.
pub fn spawn(
    listener: TcpListener,
    node_id: u64,
    requests: Sender<Request>,
    waker: LoopWaker,
    logger: Logger,
) -> Result<()> {
    let metrics = Mutex::new(Metrics::new(node_id).context("cannot register the metrics")?);
    // Run on tokio's blocking threads: the node loop may take up to
    // LOOP_ANSWER_WITHIN to answer.
    let serve: Serve = Arc::new(move |path| {
        let node = ask_node(&requests, || waker.wake());
        match path {
            Path::Metrics => {
                let mut metrics = metrics.lock().unwrap_or_else(PoisonError::into_inner);
                Reply::exposition(metrics.scrape(node.as_ref()))
            }
            Path::Health => health(node.as_ref().map(|(status, _)| status)),
            Path::Ready => ready(node.as_ref().map(|(status, _)| status)),
        }
    });
    listener.set_nonblocking(true).context("cannot make the metrics listener non-blocking")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // The answers that ask the node loop wait for it in turn on these:
        // a flood of requests queues for them, it does not start a
        // thread each.
        .max_blocking_threads(BLOCKING_THREADS)
        .thread_name("fencelock-metrics-blocking")
        .build()
        .context("cannot start the metrics runtime")?;
    std::thread::Builder::new()
        .name("fencelock-metrics".into())
        .spawn(move || runtime.block_on(serve_on(listener, serve, logger)))
        .context("cannot start the metrics thread")?;
    Ok(())
}

/// What a path is answered with; blocking (it may ask the node loop).
type Serve = Arc<dyn Fn(Path) -> Reply + Send + Sync>;

/// Accepts connections on `listener` (non-blocking) for ever, each served
/// on a task of its own.
async fn serve_on(listener: TcpListener, serve: Serve, logger: Logger) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(err) => {
            warn!(logger, "metrics: cannot serve the listener"; "error" => %err);
            return;
        }
    };
    let places = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                warn!(logger, "metrics: accept failed"; "error" => %err);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // The place goes back when the task ends, however it ends.
        let Ok(place) = Arc::clone(&places).try_acquire_owned() else {
            debug!(logger, "metrics: too many connections, one closed");
            continue;
        };
        let (serve, logger) = (Arc::clone(&serve), logger.clone());
        tokio::spawn(async move {
            if let Err(err) = connection(stream, serve).await {
                debug!(logger, "metrics: a connection failed"; "error" => %err);
            }
            drop(place);
        });
    }
}

/// Serves one connection: one request, within [`HEAD_WITHIN`] for its
/// head and [`EXCHANGE_WITHIN`] in all.
async fn connection(stream: tokio::net::TcpStream, serve: Serve) -> Result<(), String> {
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let serve = Arc::clone(&serve);
        async move { Ok::<_, Infallible>(respond(&request, serve).await) }
    });
    let exchange = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_WITHIN)
        .max_buf_size(REQUEST_BYTES_MAX)
        .title_case_headers(true)
        // A client may end its side once it has asked (`curl` does not,
        // `printf ... | nc` does): it is answered all the same.
        .half_close(true)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(EXCHANGE_WITHIN, exchange).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err(format!("not done within {}s", EXCHANGE_WITHIN.as_secs())),
    }
}

/// The answer to one request: `serve`'s for a `GET` of a path served here,
/// an error status for anything else.
async fn respond(request: &hyper::Request<Incoming>, serve: Serve) -> hyper::Response<Full<Bytes>> {
    let reply = if request.method() != Method::GET {
        Reply::text(StatusCode::METHOD_NOT_ALLOWED, "only GET is served here\n")
    } else {
        match Path::of(request.uri().path()) {
            Some(path) => tokio::task::spawn_blocking(move || serve(path)).await.unwrap_or_else(|_| {
                Reply::text(StatusCode::INTERNAL_SERVER_ERROR, "the answer could not be made\n")
            }),
            None => Reply::text(StatusCode::NOT_FOUND, "only /metrics, /health and /ready are served here\n"),
        }
    };
    let mut response = hyper::Response::new(Full::new(Bytes::from(reply.body)));
    *response.status_mut() = reply.status;
    if let Ok(content_type) = HeaderValue::from_str(&reply.content_type) {
        response.headers_mut().insert(CONTENT_TYPE, content_type);
    }
    response
}

/// Whether a node with `status` can serve clients now: it has started, is
/// not rejoining, knows a leader, and has applied what it knows committed;
/// a leader also reaches a quorum of voters and has applied an entry of
/// its own term (until then it answers no reads).
pub fn readiness(status: &NodeStatus) -> Result<(), NotReady> {
    if status.starting {
        return Err(NotReady::Starting { waiting_for: status.conf.waiting_for.clone() });
    }
    if status.rejoining {
        return Err(NotReady::Rejoining);
    }
    if status.leader.is_none() {
        return Err(NotReady::NoLeader);
    }
    if status.role == Role::Leader {
        if !status.has_quorum() {
            // Name the half of the configuration that lacks its majority
            // (while it changes, there are two).
            let reached =
                |voters: &[u64]| voters.iter().filter(|voter| status.conf.reachable.contains(voter)).count();
            let incoming = reached(&status.conf.voters);
            return Err(if incoming > status.conf.voters.len() / 2 {
                NotReady::NoQuorum {
                    reached: reached(&status.conf.voters_outgoing),
                    voters: status.conf.voters_outgoing.len(),
                    outgoing: true,
                }
            } else {
                NotReady::NoQuorum { reached: incoming, voters: status.conf.voters.len(), outgoing: false }
            });
        }
        if !status.leader_ready {
            return Err(NotReady::LeaderWarmingUp);
        }
    }
    if status.log.applied_index < status.log.commit_index {
        return Err(NotReady::Behind {
            applied_index: status.log.applied_index,
            commit_index: status.log.commit_index,
        });
    }
    Ok(())
}

/// Why [`readiness`] said no (or the node loop did not answer): the body
/// of `/ready`'s 503, after `not ready: `.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotReady {
    /// The node loop did not answer within [`LOOP_ANSWER_WITHIN`], or has
    /// stopped.
    NoAnswer,
    /// A blank node waiting for its peers' hellos: those not heard yet.
    Starting {
        waiting_for: Vec<u64>,
    },
    Rejoining,
    NoLeader,
    /// A leader that heard from `reached` of its `voters` (the outgoing
    /// ones, while the configuration changes, if those lack a majority)
    /// within an election timeout, itself included: it cannot commit.
    NoQuorum {
        reached: usize,
        voters: usize,
        outgoing: bool,
    },
    /// A leader that has not applied an entry of its term yet.
    LeaderWarmingUp,
    Behind {
        applied_index: u64,
        commit_index: u64,
    },
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::NoAnswer => {
                write!(f, "the node loop did not answer within {}ms", LOOP_ANSWER_WITHIN.as_millis())
            }
            NotReady::Starting { waiting_for } if waiting_for.is_empty() => write!(f, "starting"),
            NotReady::Starting { waiting_for } => {
                let peers: Vec<String> = waiting_for.iter().map(u64::to_string).collect();
                write!(f, "starting, waiting for peers {}", peers.join(", "))
            }
            NotReady::Rejoining => write!(f, "rejoining: it lost its data and catches up without a vote"),
            NotReady::NoLeader => write!(f, "no leader known"),
            NotReady::NoQuorum { reached, voters, outgoing } => {
                let which = if *outgoing { "outgoing voters" } else { "voters" };
                write!(f, "leader without a quorum: it hears from {reached} of {voters} {which}")
            }
            NotReady::LeaderWarmingUp => write!(f, "leader has not applied an entry of its term yet"),
            NotReady::Behind { applied_index, commit_index } => {
                write!(f, "applied index {applied_index} is behind commit index {commit_index}")
            }
        }
    }
}

/// The paths served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Metrics,
    Health,
    Ready,
}

impl Path {
    /// The path a request's URI path names (hyper leaves the query out).
    fn of(path: &str) -> Option<Path> {
        match path {
            "/metrics" => Some(Path::Metrics),
            "/health" => Some(Path::Health),
            "/ready" => Some(Path::Ready),
            _ => None,
        }
    }
}

/// One HTTP answer.
#[derive(Debug, PartialEq, Eq)]
struct Reply {
    status: StatusCode,
    content_type: String,
    body: Vec<u8>,
}

const OK: StatusCode = StatusCode::OK;
const UNAVAILABLE: StatusCode = StatusCode::SERVICE_UNAVAILABLE;

impl Reply {
    fn text(status: StatusCode, body: impl Into<String>) -> Reply {
        Reply { status, content_type: "text/plain; charset=utf-8".to_owned(), body: body.into().into_bytes() }
    }

    fn exposition(body: Vec<u8>) -> Reply {
        Reply { status: OK, content_type: TextEncoder::new().format_type().to_owned(), body }
    }
}

/// `/health`: the process serves when its node loop answered in time.
fn health(status: Option<&NodeStatus>) -> Reply {
    match status {
        Some(_) => Reply::text(OK, "ok\n"),
        None => Reply::text(UNAVAILABLE, format!("unavailable: {}\n", NotReady::NoAnswer)),
    }
}

/// `/ready`: [`readiness`] of the node's status, or no answer.
fn ready(status: Option<&NodeStatus>) -> Reply {
    match status.map_or(Err(NotReady::NoAnswer), readiness) {
        Ok(()) => Reply::text(OK, "ready\n"),
        Err(why) => Reply::text(UNAVAILABLE, format!("not ready: {why}\n")),
    }
}

/// Asks the node loop for its status and counters; `None` when it does not
/// answer within [`LOOP_ANSWER_WITHIN`] or has stopped.
fn ask_node(requests: &Sender<Request>, wake: impl FnOnce()) -> Option<(NodeStatus, Stats)> {
    let (tx, rx) = bounded(1);
    requests.send(Request::Metrics { reply: tx }).ok()?;
    wake();
    rx.recv_timeout(LOOP_ANSWER_WITHIN).ok()
}

/// The node's metrics, registered once and set on each scrape.
struct Metrics {
    registry: Registry,
    up: IntGauge,
    ready: IntGauge,
    quorum: IntGauge,
    is_leader: IntGauge,
    rejoining: IntGauge,
    term: IntGauge,
    leader_id: IntGauge,
    commit_index: IntGauge,
    applied_index: IntGauge,
    last_index: IntGauge,
    snapshot_index: IntGauge,
    snapshot_bytes: IntGauge,
    locks: IntGauge,
    last_token: IntGauge,
    pending_requests: IntGauge,
    counters: Vec<(IntCounter, ReadStat)>,
    refused: IntCounterVec,
}

/// Reads one counter of the node's.
type ReadStat = fn(&Stats) -> u64;

/// The counters: name, help, and where each comes from.
const COUNTERS: [(&str, &str, ReadStat); 13] = [
    ("fencelock_requests_proposed_total", "Requests this node proposed as leader.", |s| s.requests_proposed),
    ("fencelock_commands_proposed_total", "Commands this node proposed as leader.", |s| s.commands_proposed),
    ("fencelock_entries_proposed_total", "Log entries this node proposed as leader.", |s| s.entries_proposed),
    ("fencelock_store_writes_total", "Writes to the raft store.", |s| s.writes),
    ("fencelock_store_syncs_total", "Syncs of the raft store (each covers a group of writes).", |s| s.syncs),
    ("fencelock_readies_total", "Raft Ready rounds handled.", |s| s.readies),
    ("fencelock_entries_applied_total", "Log entries applied to the lock table.", |s| s.entries_applied),
    ("fencelock_snapshots_taken_total", "Snapshots of the lock table taken to compact the log.", |s| {
        s.snapshots_taken
    }),
    ("fencelock_snapshots_installed_total", "Snapshots received from a leader and installed.", |s| {
        s.snapshots_installed
    }),
    ("fencelock_grants_total", "Grants applied to the lock table.", |s| s.grants_applied),
    ("fencelock_renewals_total", "Lease renewals applied to the lock table.", |s| s.renewals_applied),
    ("fencelock_releases_total", "Releases applied to the lock table.", |s| s.releases_applied),
    ("fencelock_expiries_total", "Lease expiries applied to the lock table.", |s| s.expiries_applied),
];

impl Metrics {
    fn new(node_id: u64) -> prometheus::Result<Metrics> {
        let registry =
            Registry::new_custom(None, Some([("node_id".to_owned(), node_id.to_string())].into()))?;
        let gauge = |name: &str, help: &str| -> prometheus::Result<IntGauge> {
            let gauge = IntGauge::new(name, help)?;
            registry.register(Box::new(gauge.clone()))?;
            Ok(gauge)
        };
        let mut counters = Vec::new();
        for (name, help, read) in COUNTERS {
            let counter = IntCounter::new(name, help)?;
            registry.register(Box::new(counter.clone()))?;
            counters.push((counter, read));
        }
        let refused = IntCounterVec::new(
            Opts::new(
                "fencelock_raft_messages_refused_total",
                "Raft messages from peers that the gate dropped before raft saw them, by reason.",
            ),
            &["reason"],
        )?;
        registry.register(Box::new(refused.clone()))?;
        for reason in Refusal::ALL {
            // Every reason shows, at 0 until it happens.
            refused.with_label_values(&[reason.name()]);
        }
        Ok(Metrics {
            refused,
            up: gauge(
                "fencelock_up",
                "1 when the node's replica answered this scrape, 0 while it starts or stops.",
            )?,
            ready: gauge(
                "fencelock_ready",
                "1 when this node can serve clients now, as GET /ready answers 200; 0 otherwise.",
            )?,
            quorum: gauge(
                "fencelock_quorum",
                "1 when the voters this node heard from within an election timeout, itself \
                 included, are a majority: on the leader, whether it can commit (a follower \
                 hears only from its leader).",
            )?,
            is_leader: gauge("fencelock_is_leader", "1 on the leader.")?,
            rejoining: gauge(
                "fencelock_rejoining",
                "1 while this node, having lost its data, rejoins without a vote.",
            )?,
            term: gauge("fencelock_term", "The raft term.")?,
            leader_id: gauge("fencelock_leader_id", "The leader this node knows of, 0 for none.")?,
            commit_index: gauge("fencelock_commit_index", "The raft commit index.")?,
            applied_index: gauge("fencelock_applied_index", "The index the lock table has applied.")?,
            last_index: gauge("fencelock_last_index", "The last index of this node's raft log.")?,
            snapshot_index: gauge("fencelock_snapshot_index", "The index of this node's last snapshot.")?,
            snapshot_bytes: gauge(
                "fencelock_snapshot_bytes",
                "The size of this node's last snapshot, in bytes.",
            )?,
            locks: gauge("fencelock_locks", "Locks held in this node's applied table.")?,
            last_token: gauge(
                "fencelock_last_token",
                "The last fencing token issued, as this node has applied.",
            )?,
            pending_requests: gauge(
                "fencelock_pending_requests",
                "Requests accepted by this node and not yet answered.",
            )?,
            counters,
            registry,
        })
    }

    /// Sets the metrics from the node loop's answer, if it came, and
    /// encodes them with raft-engine's metrics.
    fn scrape(&mut self, node: Option<&(NodeStatus, Stats)>) -> Vec<u8> {
        match node {
            Some((status, stats)) => self.set(status, stats),
            None => {
                self.up.set(0);
                self.ready.set(0);
            }
        }
        let mut families = self.registry.gather();
        families.extend(prometheus::gather());
        let mut out = Vec::new();
        if let Err(err) = TextEncoder::new().encode(&families, &mut out) {
            out = format!("# cannot encode the metrics: {err}\n").into_bytes();
        }
        out
    }

    fn set(&mut self, status: &NodeStatus, stats: &Stats) {
        let int = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        // A starting node's loop answers, but it has no replica yet.
        self.up.set(i64::from(!status.starting));
        self.ready.set(i64::from(readiness(status).is_ok()));
        self.quorum.set(i64::from(status.has_quorum()));
        self.is_leader.set(i64::from(status.role == Role::Leader));
        self.rejoining.set(i64::from(status.rejoining));
        self.term.set(int(status.term));
        self.leader_id.set(int(status.leader.map_or(0, |leader| leader.0)));
        self.commit_index.set(int(status.log.commit_index));
        self.applied_index.set(int(status.log.applied_index));
        self.last_index.set(int(status.log.last_index));
        self.snapshot_index.set(int(status.log.snapshot_index));
        self.snapshot_bytes.set(int(status.log.snapshot_bytes));
        self.locks.set(int(status.locks as u64));
        self.last_token.set(int(status.last_token.map_or(0, |token| token.get())));
        self.pending_requests.set(int(status.pending_requests as u64));
        for (counter, read) in &self.counters {
            // Counters only go up: the node's own counts do too, from the
            // same start as this process.
            counter.inc_by(read(stats).saturating_sub(counter.get()));
        }
        for reason in Refusal::ALL {
            let counter = self.refused.with_label_values(&[reason.name()]);
            counter.inc_by(stats.refused.get(reason).saturating_sub(counter.get()));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::*;

    use fencelock_raft::{ConfView, LogProgress, NodeId};

    /// Serves `serve` on a fresh port, on a thread of its own; its address.
    fn server(serve: Serve) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let logger = Logger::root(slog::Discard, slog::o!());
        std::thread::spawn(move || runtime.block_on(serve_on(listener, serve, logger)));
        addr
    }

    /// The paths answered for a node loop that answered with `node` (or
    /// did not).
    fn serving_as(node: Option<&NodeStatus>) -> Serve {
        let node = node.cloned();
        Arc::new(move |path| match path {
            Path::Metrics => Reply::exposition(b"fencelock_up 1\n".to_vec()),
            Path::Health => health(node.as_ref()),
            Path::Ready => ready(node.as_ref()),
        })
    }

    /// Sends `request` on one connection (then ends its side, with `end`)
    /// to a server for a node loop that answered with `node` (or not), and
    /// returns what came back.
    fn exchange_with(request: &[u8], end: bool, node: Option<&NodeStatus>) -> String {
        let addr = server(serving_as(node));
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        stream.write_all(request).unwrap();
        if end {
            stream.shutdown(std::net::Shutdown::Write).unwrap();
        }
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    }

    fn exchange(request: &[u8]) -> String {
        exchange_with(request, true, Some(&serving()))
    }

    /// A follower of node 1 in a cluster of three, caught up.
    fn serving() -> NodeStatus {
        NodeStatus {
            term: 3,
            leader: Some(NodeId(1)),
            log: LogProgress { commit_index: 10, applied_index: 10, ..LogProgress::default() },
            conf: ConfView { voters: vec![1, 2, 3], reachable: vec![1, 2], ..ConfView::default() },
            ..NodeStatus::blank(NodeId(2))
        }
    }

    #[test]
    fn only_get_of_a_served_path_is_answered() {
        let ok = exchange(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("Content-Type: text/plain; version=0.0.4"), "{ok}");
        assert!(ok.contains("Content-Length: 15\r\n") && ok.ends_with("\r\n\r\nfencelock_up 1\n"), "{ok}");
        // An HTTP/1.0 request is answered in HTTP/1.0.
        assert!(exchange(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 200"));
        let health = exchange(b"GET /health HTTP/1.1\r\n\r\n");
        assert!(health.starts_with("HTTP/1.1 200 OK\r\n") && health.ends_with("\r\n\r\nok\n"), "{health}");
        let ready = exchange(b"GET /ready?verbose HTTP/1.0\r\n\r\n");
        assert!(ready.starts_with("HTTP/1.0 200 OK\r\n") && ready.ends_with("\r\n\r\nready\n"), "{ready}");
        assert!(ready.contains("Content-Type: text/plain; charset=utf-8\r\n"), "{ready}");
        for other in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"GET /healthz HTTP/1.1\r\n\r\n",
            b"GET /ready/ HTTP/1.1\r\n\r\n",
        ] {
            assert!(exchange(other).starts_with("HTTP/1.1 404"), "{other:?}");
        }
        for post in [&b"POST /metrics HTTP/1.1\r\n\r\n"[..], b"HEAD /health HTTP/1.1\r\n\r\n"] {
            assert!(exchange(post).starts_with("HTTP/1.1 405"), "{post:?}");
        }
        for garbage in [&b"\x00\xff\r\n\r\n"[..], b"GET /metrics\r\n\r\n"] {
            assert!(exchange(garbage).starts_with("HTTP/1.1 400"), "{garbage:?}");
        }
        // Nothing asked, nothing answered: the connection is closed.
        assert_eq!(exchange(b""), "");
        // A head that never ends is cut at 8 KiB and answered, without
        // waiting for the rest.
        let long = exchange_with(&[b'x'; REQUEST_BYTES_MAX + 1], false, None);
        assert!(long.starts_with("HTTP/1.1 431") || long.starts_with("HTTP/1.1 400"), "{long}");
    }

    /// Issue 31: a thousand connections that trickle their request a byte
    /// at a time hold up no one: `/health` is answered meanwhile, and each
    /// of them is closed once its head is late.
    #[test]
    fn health_is_answered_while_a_thousand_connections_trickle() {
        raise_open_files();
        let addr = server(serving_as(Some(&serving())));
        let mut slow: Vec<TcpStream> = (0..1_000)
            .map(|_| {
                let mut stream = TcpStream::connect(addr).unwrap();
                stream.write_all(b"GET /hea").unwrap();
                stream
            })
            .collect();
        for stream in &mut slow {
            stream.write_all(b"l").unwrap();
        }
        // Well under the slow ones' head deadline (2 s): they are all
        // still open while it is answered.
        let mut probe = TcpStream::connect(addr).unwrap();
        probe.set_read_timeout(Some(HEAD_WITHIN / 2)).unwrap();
        probe.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut answer = Vec::new();
        probe.read_to_end(&mut answer).expect("no answer while slow connections are open");
        assert!(answer.starts_with(b"HTTP/1.1 200 OK\r\n"), "{}", String::from_utf8_lossy(&answer));
        // Then the slow ones are answered 408 or closed, not kept.
        for mut stream in slow {
            stream.set_read_timeout(Some(EXCHANGE_WITHIN * 2)).unwrap();
            let mut rest = Vec::new();
            let _ = stream.read_to_end(&mut rest);
            assert!(
                rest.is_empty() || rest.starts_with(b"HTTP/1.1 408"),
                "{}",
                String::from_utf8_lossy(&rest)
            );
        }
    }

    /// Two thousand and more sockets in this process: raise the soft limit
    /// of open files to the hard one.
    fn raise_open_files() {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }

    #[test]
    fn health_and_ready_answer_503_when_the_node_loop_does_not_answer() {
        let health = exchange_with(b"GET /health HTTP/1.1\r\n\r\n", true, None);
        assert!(health.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{health}");
        assert!(
            health.ends_with("\r\n\r\nunavailable: the node loop did not answer within 1000ms\n"),
            "{health}"
        );
        let ready = exchange_with(b"GET /ready HTTP/1.1\r\n\r\n", true, None);
        assert!(ready.starts_with("HTTP/1.1 503 "), "{ready}");
        assert!(
            ready.ends_with("\r\n\r\nnot ready: the node loop did not answer within 1000ms\n"),
            "{ready}"
        );
        // A starting node serves (health) but is not ready, and says why in
        // one line.
        let starting = NodeStatus {
            starting: true,
            conf: ConfView { waiting_for: vec![2, 3], ..NodeStatus::blank(NodeId(1)).conf },
            ..NodeStatus::blank(NodeId(1))
        };
        assert!(
            exchange_with(b"GET /health HTTP/1.1\r\n\r\n", true, Some(&starting)).starts_with("HTTP/1.1 200")
        );
        let ready = exchange_with(b"GET /ready HTTP/1.1\r\n\r\n", true, Some(&starting));
        assert!(ready.starts_with("HTTP/1.1 503 "), "{ready}");
        assert!(ready.ends_with("\r\n\r\nnot ready: starting, waiting for peers 2, 3\n"), "{ready}");
    }

    #[test]
    fn the_node_loop_is_asked_with_a_deadline() {
        // A loop that answers.
        let (requests, taken) = crossbeam_channel::bounded::<Request>(1);
        let answering = std::thread::spawn(move || {
            if let Ok(Request::Metrics { reply }) = taken.recv() {
                reply.send((serving(), Stats::default())).unwrap();
            }
        });
        let mut woken = false;
        assert_eq!(ask_node(&requests, || woken = true).map(|(status, _)| status), Some(serving()));
        assert!(woken);
        answering.join().unwrap();
        // A loop that has stopped: no answer, at once.
        assert!(ask_node(&requests, || ()).is_none());
        // A loop that takes the request and never answers: no answer, once
        // the deadline has passed.
        let (requests, taken) = crossbeam_channel::bounded::<Request>(1);
        assert!(ask_node(&requests, || ()).is_none());
        drop(taken);
    }

    #[test]
    fn ready_means_started_led_caught_up_and_on_the_leader_a_quorum() {
        let follower = serving();
        assert_eq!(readiness(&follower), Ok(()));
        let leader = NodeStatus {
            role: Role::Leader,
            leader: Some(NodeId(2)),
            leader_ready: true,
            conf: ConfView { reachable: vec![2, 3], ..follower.conf.clone() },
            ..follower.clone()
        };
        assert_eq!(readiness(&leader), Ok(()));
        let cases = [
            (
                NodeStatus {
                    starting: true,
                    conf: ConfView { waiting_for: vec![2, 3], ..NodeStatus::blank(NodeId(1)).conf },
                    ..NodeStatus::blank(NodeId(1))
                },
                "starting, waiting for peers 2, 3",
            ),
            (NodeStatus { starting: true, ..NodeStatus::blank(NodeId(1)) }, "starting"),
            (
                NodeStatus { rejoining: true, ..follower.clone() },
                "rejoining: it lost its data and catches up without a vote",
            ),
            (NodeStatus { leader: None, ..follower.clone() }, "no leader known"),
            (
                NodeStatus {
                    log: LogProgress { applied_index: 9, ..follower.log.clone() },
                    ..follower.clone()
                },
                "applied index 9 is behind commit index 10",
            ),
            (
                NodeStatus { leader_ready: false, ..leader.clone() },
                "leader has not applied an entry of its term yet",
            ),
            (
                NodeStatus { conf: ConfView { reachable: vec![2], ..leader.conf.clone() }, ..leader.clone() },
                "leader without a quorum: it hears from 1 of 3 voters",
            ),
            // Joint consensus: a majority of the outgoing voters too.
            (
                NodeStatus {
                    conf: ConfView { voters_outgoing: vec![2, 4, 5], ..leader.conf.clone() },
                    ..leader.clone()
                },
                "leader without a quorum: it hears from 1 of 3 outgoing voters",
            ),
        ];
        for (status, why) in cases {
            assert_eq!(readiness(&status).map_err(|not| not.to_string()), Err(why.to_owned()), "{status:?}");
        }
        // A follower hears only from its leader: quorum is the leader's to
        // judge.
        assert_eq!(
            readiness(&NodeStatus {
                conf: ConfView { reachable: vec![2], ..follower.conf.clone() },
                ..follower
            }),
            Ok(())
        );
    }

    #[test]
    fn counters_follow_the_node_and_gauges_its_status() {
        let mut metrics = Metrics::new(3).unwrap();
        let status = NodeStatus {
            id: fencelock_raft::NodeId(3),
            role: Role::Leader,
            term: 7,
            leader: Some(fencelock_raft::NodeId(3)),
            leader_ready: true,
            log: LogProgress {
                commit_index: 40,
                applied_index: 39,
                last_index: 41,
                snapshot_index: 0,
                snapshot_bytes: 0,
            },
            locks: 5,
            last_token: fencelock_types::FencingToken::new(12),
            pending_requests: 2,
            rejoining: false,
            cluster_id: None,
            conf: ConfView { voters: vec![3], ..NodeStatus::blank(fencelock_raft::NodeId(3)).conf },
            ..NodeStatus::blank(fencelock_raft::NodeId(3))
        };
        let mut stats = Stats { grants_applied: 12, syncs: 30, ..Stats::default() };
        stats.refused.count(Refusal::BadTerm);
        metrics.set(&status, &stats);
        stats.grants_applied = 15;
        metrics.set(&status, &stats);
        let mut out = Vec::new();
        TextEncoder::new().encode(&metrics.registry.gather(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        for line in [
            "fencelock_grants_total{node_id=\"3\"} 15",
            "fencelock_store_syncs_total{node_id=\"3\"} 30",
            "fencelock_is_leader{node_id=\"3\"} 1",
            "fencelock_term{node_id=\"3\"} 7",
            "fencelock_last_token{node_id=\"3\"} 12",
            "fencelock_up{node_id=\"3\"} 1",
            "fencelock_ready{node_id=\"3\"} 0",
            "fencelock_quorum{node_id=\"3\"} 1",
            "fencelock_raft_messages_refused_total{reason=\"bad_term\",node_id=\"3\"} 1",
            "fencelock_raft_messages_refused_total{reason=\"forbidden_type\",node_id=\"3\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
        // Caught up: ready. Then a scrape the loop did not answer, and one
        // of a starting node (its loop answers, it has no replica yet).
        let caught_up = NodeStatus { log: LogProgress { applied_index: 40, ..status.log.clone() }, ..status };
        let text = String::from_utf8(metrics.scrape(Some(&(caught_up, stats)))).unwrap();
        assert!(text.lines().any(|l| l == "fencelock_ready{node_id=\"3\"} 1"), "{text}");
        let text = String::from_utf8(metrics.scrape(None)).unwrap();
        for line in ["fencelock_up{node_id=\"3\"} 0", "fencelock_ready{node_id=\"3\"} 0"] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
        let starting = NodeStatus { starting: true, ..NodeStatus::blank(fencelock_raft::NodeId(3)) };
        let text = String::from_utf8(metrics.scrape(Some(&(starting, Stats::default())))).unwrap();
        for line in [
            "fencelock_up{node_id=\"3\"} 0",
            "fencelock_ready{node_id=\"3\"} 0",
            "fencelock_quorum{node_id=\"3\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
    }
}
