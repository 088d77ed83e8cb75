//! The optional Prometheus endpoint (`--metrics-addr`): `GET /metrics` on a
//! thread of its own, in the text exposition format. It asks the node loop
//! for the node's status and counters on each scrape (one channel message
//! and a wake-up), and adds raft-engine's own metrics (its write and fsync
//! latency histograms), which raft-engine keeps in the default registry.
//!
//! It serves one connection at a time, each bounded in size and time: a
//! scraper that stalls or speaks nonsense gets an error or a closed socket,
//! and never reaches the node loop.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result};
use crossbeam_channel::{bounded, Sender};
use fencelock_net::LoopWaker;
use fencelock_raft::gate::Refusal;
use fencelock_raft::shell::Request;
use fencelock_raft::{NodeStatus, Role, Stats};
use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};
use slog::{debug, warn, Logger};

/// The longest request head read.
const REQUEST_BYTES_MAX: usize = 8 * 1024;
/// How long a scraper may take to send its request or read the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a scrape waits for the node loop.
const LOOP_ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// Serves `/metrics` on `listener` from a thread named `fencelock-metrics`.
pub fn spawn(
    listener: TcpListener,
    node_id: u64,
    requests: Sender<Request>,
    waker: LoopWaker,
    logger: Logger,
) -> Result<()> {
    let mut metrics = Metrics::new(node_id).context("cannot register the metrics")?;
    std::thread::Builder::new()
        .name("fencelock-metrics".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let stream = match stream {
                    Ok(stream) => stream,
                    Err(err) => {
                        warn!(logger, "metrics: accept failed"; "error" => %err);
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                };
                let mut scrape = || metrics.scrape(&requests, &waker);
                if let Err(err) = answer(stream, &mut scrape) {
                    debug!(logger, "metrics: a scrape failed"; "error" => %err);
                }
            }
        })
        .context("cannot start the metrics thread")?;
    Ok(())
}

/// Reads one request from `stream` and answers it: the scrape for
/// `GET /metrics`, an error status for anything else.
fn answer(mut stream: TcpStream, scrape: &mut dyn FnMut() -> Vec<u8>) -> io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|window| window == b"\r\n\r\n") && head.len() < REQUEST_BYTES_MAX {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|byte| *byte == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end().split(' ');
    let (status, body) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("GET"), Some(target), Some(version), None) if version.starts_with("HTTP/1.") => {
            if target.split('?').next() == Some("/metrics") {
                ("200 OK", scrape())
            } else {
                ("404 Not Found", b"only /metrics is served here\n".to_vec())
            }
        }
        (Some(_), Some(_), Some(version), None) if version.starts_with("HTTP/1.") => {
            ("405 Method Not Allowed", b"only GET /metrics is served here\n".to_vec())
        }
        _ => ("400 Bad Request", b"not an HTTP/1 request\n".to_vec()),
    };
    let content_type = if status.starts_with("200") {
        TextEncoder::new().format_type().to_owned()
    } else {
        "text/plain; charset=utf-8".to_owned()
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(&body)?;
    stream.flush()
}

/// The node's metrics, registered once and set on each scrape.
struct Metrics {
    registry: Registry,
    up: IntGauge,
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

    /// Asks the node loop for its status and counters, and encodes them
    /// with raft-engine's metrics.
    fn scrape(&mut self, requests: &Sender<Request>, waker: &LoopWaker) -> Vec<u8> {
        let (tx, rx) = bounded(1);
        let answer = if requests.send(Request::Metrics { reply: tx }).is_ok() {
            waker.wake();
            rx.recv_timeout(LOOP_ANSWER_WITHIN).ok()
        } else {
            None
        };
        match answer {
            Some((status, stats)) => self.set(&status, &stats),
            None => self.up.set(0),
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
        self.up.set(1);
        self.is_leader.set(i64::from(status.role == Role::Leader));
        self.rejoining.set(i64::from(status.rejoining));
        self.term.set(int(status.term));
        self.leader_id.set(int(status.leader.map_or(0, |leader| leader.0)));
        self.commit_index.set(int(status.commit_index));
        self.applied_index.set(int(status.applied_index));
        self.last_index.set(int(status.last_index));
        self.snapshot_index.set(int(status.snapshot_index));
        self.snapshot_bytes.set(int(status.snapshot_bytes));
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
    use super::*;

    /// Runs `answer` on one connection that sends `request` (then ends its
    /// side, with `end`), and returns what came back.
    fn exchange_with(request: &[u8], end: bool) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let request = request.to_vec();
        let client = std::thread::spawn(move || {
            let mut stream = TcpStream::connect(addr).unwrap();
            stream.write_all(&request).unwrap();
            if end {
                stream.shutdown(std::net::Shutdown::Write).unwrap();
            }
            let mut answer = String::new();
            stream.read_to_string(&mut answer).unwrap();
            answer
        });
        let (stream, _) = listener.accept().unwrap();
        answer(stream, &mut || b"fencelock_up 1\n".to_vec()).unwrap();
        client.join().unwrap()
    }

    fn exchange(request: &[u8]) -> String {
        exchange_with(request, true)
    }

    #[test]
    fn only_get_metrics_is_answered_with_the_scrape() {
        let ok = exchange(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("Content-Length: 15\r\n") && ok.ends_with("\r\n\r\nfencelock_up 1\n"), "{ok}");
        assert!(exchange(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 200"));
        assert!(exchange(b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(exchange(b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        for garbage in [&b"\x00\xff\r\n\r\n"[..], b"", b"GET /metrics\r\n\r\n"] {
            assert!(exchange(garbage).starts_with("HTTP/1.1 400"), "{garbage:?}");
        }
        // A head that never ends is cut at 8 KiB and answered, without
        // waiting for the rest.
        assert!(exchange_with(&[b'x'; REQUEST_BYTES_MAX], false).starts_with("HTTP/1.1 400"));
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
            commit_index: 40,
            applied_index: 39,
            last_index: 41,
            snapshot_index: 0,
            snapshot_bytes: 0,
            locks: 5,
            last_token: fencelock_types::FencingToken::new(12),
            pending_requests: 2,
            rejoining: false,
            cluster_id: None,
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
            "fencelock_raft_messages_refused_total{reason=\"bad_term\",node_id=\"3\"} 1",
            "fencelock_raft_messages_refused_total{reason=\"forbidden_type\",node_id=\"3\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
    }
}
