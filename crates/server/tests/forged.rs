//! Forged raft messages on the peer port of real processes: each message of
//! the security review, sent to a follower and to the leader by a stranger
//! that claims to be a peer (hellos are not authenticated yet). No node may
//! crash, take a term from them (in memory or on disk), or let them touch
//! the table; tokens go on increasing.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{free_port, http, Cluster, DEADLINE};
use fencelock_net::encode_frame;
use fencelock_types::client_pb::PeerHello;
use fencelock_types::{encode_batch, Command, Key, LeaseMs, Owner};
use raft::prelude::{ConfState, Entry, EntryType, Message, MessageType, Snapshot};

/// Far past any term a real cluster of these tests reaches.
const SANE_TERM: u64 = 1_000;

fn message(kind: MessageType, from: u64, to: u64, term: u64) -> Message {
    let mut message = Message::default();
    message.set_msg_type(kind);
    message.from = from;
    message.to = to;
    message.term = term;
    message
}

/// Every forged message, "from" node `from` to node `to`, whose log is at
/// `last_index`, committed to `commit`, in `term`.
fn forgeries(from: u64, to: u64, term: u64, last_index: u64, commit: u64) -> Vec<(&'static str, Message)> {
    let mut forged = Vec::new();
    forged.push(("a heartbeat of term 2^64-1", message(MessageType::MsgHeartbeat, from, to, u64::MAX)));
    forged.push(("a heartbeat of term 0", message(MessageType::MsgHeartbeat, from, to, 0)));
    forged.push(("an empty proposal", message(MessageType::MsgPropose, from, to, 0)));
    let mut steal = message(MessageType::MsgPropose, from, to, 0);
    let commands = [
        Command::Release { key: Key::new(b"vault".to_vec()).unwrap(), token: None, user: None },
        Command::Grant {
            session: None,
            key: Key::new(b"vault".to_vec()).unwrap(),
            lease_ms: LeaseMs::new(30 * 24 * 3_600_000).unwrap(),
            owner: Owner::new(b"attacker".to_vec()).unwrap(),
            value: fencelock_types::Value::none(),
        },
    ];
    steal.set_entries(vec![Entry { data: encode_batch(&commands).into(), ..Default::default() }].into());
    forged.push(("a proposal that steals a lock", steal));
    let mut ack = message(MessageType::MsgAppendResponse, from, to, term);
    ack.index = last_index + 100;
    forged.push(("an acknowledgement past the log", ack));
    let mut snapshot = Snapshot::default();
    snapshot.set_data(fencelock_fsm::LockTable::new().snapshot().into());
    snapshot.mut_metadata().index = commit + 100;
    snapshot.mut_metadata().term = term;
    snapshot.mut_metadata().set_conf_state(ConfState::from((vec![1, 2, 3], vec![])));
    let mut install = message(MessageType::MsgSnapshot, from, to, term);
    install.set_snapshot(snapshot);
    forged.push(("a snapshot of an empty table", install));
    let mut change = message(MessageType::MsgAppend, from, to, term);
    change.index = last_index;
    change.log_term = term;
    let mut entry = Entry { index: last_index + 1, term, ..Default::default() };
    entry.set_entry_type(EntryType::EntryConfChange);
    change.set_entries(vec![entry].into());
    forged.push(("a membership change", change));
    let mut gap = message(MessageType::MsgAppend, from, to, term);
    gap.index = last_index;
    gap.log_term = term;
    gap.set_entries(vec![Entry { index: last_index + 5, term, ..Default::default() }].into());
    forged.push(("an append with a gap", gap));
    let mut no_term = message(MessageType::MsgAppend, from, to, term);
    no_term.index = last_index + 10;
    no_term.commit = last_index + 10;
    forged.push(("an append past the log with log term 0", no_term));
    forged.push(("a forced election", message(MessageType::MsgTimeoutNow, from, to, term + 1)));
    forged
}

/// The raft messages node `metrics_addr`'s gate has refused so far, over
/// every reason.
fn refused(metrics_addr: &str) -> f64 {
    let scrape = http(metrics_addr, b"GET /metrics HTTP/1.0\r\n\r\n");
    scrape
        .lines()
        .filter(|line| line.starts_with("fencelock_raft_messages_refused_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Opens a peer connection to `addr` claiming to be node `claim`, sends
/// `message`, and waits until the node's gate has refused it.
fn send_as(addr: &str, metrics_addr: &str, claim: u64, message: &Message, what: &str) {
    let before = refused(metrics_addr);
    let mut bytes = Vec::new();
    encode_frame(&PeerHello { node_id: claim, ..Default::default() }, &mut bytes);
    encode_frame(message, &mut bytes);
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(&bytes).unwrap();
    let deadline = Instant::now() + DEADLINE;
    while refused(metrics_addr) <= before {
        assert!(Instant::now() < deadline, "{what} was never refused by the gate at {addr}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Three nodes, each with a metrics endpoint (where the gate's refusals
/// are counted), started; and those endpoints.
fn cluster_with_metrics() -> (Cluster, Vec<String>) {
    let mut cluster = Cluster::configure(3);
    let metrics: Vec<String> = (1..=3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    for (node, addr) in cluster.nodes.iter_mut().zip(&metrics) {
        node.extra_args = vec!["--metrics-addr".into(), addr.clone()];
    }
    for id in 1..=3 {
        cluster.launch(id);
    }
    (cluster, metrics)
}

#[test]
fn forged_raft_messages_to_a_follower_and_to_the_leader_are_dropped_and_the_cluster_serves_on() {
    let (mut cluster, metrics) = cluster_with_metrics();
    let client = cluster.client();
    let leader = cluster.leader(&client);
    let vault = client.acquire(b"vault", Duration::from_secs(60), Duration::ZERO).unwrap();
    let first = vault.token();

    let follower = leader % 3 + 1;
    let other = follower % 3 + 1;
    for (to, claim) in [(follower, leader), (leader, other)] {
        let status = client.status(cluster.client_addr(to)).unwrap();
        for (what, forged) in forgeries(claim, to, status.term, status.last_index, status.commit_index) {
            send_as(cluster.peer_addr(to), &metrics[(to - 1) as usize], claim, &forged, what);
            for id in 1..=3 {
                let status = client.status(cluster.client_addr(id));
                let status = status.unwrap_or_else(|err| {
                    panic!("node {id} after {what} to {to}: {err}\n{}", cluster.logs())
                });
                assert!(status.term < SANE_TERM, "node {id} took a term from {what}: {}", status.term);
            }
        }
    }
    let log = cluster.log(follower);
    assert!(log.contains("fails the gate"), "no refusal was logged:\n{log}");

    // The lock is still the client's; no one else holds it.
    assert!(client.check(b"vault", first).unwrap(), "the forged proposal took the lock");
    let holder = client.get(b"vault", true).unwrap().unwrap();
    assert_eq!((holder.token, holder.owner.as_slice()), (first, client.owner()));

    // No forged term reached a disk: a follower restarted from its own
    // store comes back in a sane term and catches up.
    cluster.kill(follower);
    cluster.launch(follower);
    let next = client.acquire(b"after", Duration::from_secs(60), Duration::ZERO).unwrap();
    assert!(next.token() > first, "tokens went backwards: {} after {first}", next.token());
    let deadline = Instant::now() + DEADLINE;
    loop {
        let status = client.status(cluster.client_addr(follower));
        if let Ok(status) = &status {
            assert!(status.term < SANE_TERM, "node {follower} persisted a forged term: {}", status.term);
            if status.last_token >= next.token() {
                break;
            }
        }
        assert!(Instant::now() < deadline, "node {follower} did not catch up: {status:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A forged heartbeat far past the cluster's term used to be taken, and
/// the cluster's next campaign (its term plus one) refused by every gate:
/// at 2^48 every node stayed pre-candidate for ever; at 2^48 - 1 it waited
/// for the next leader loss. Each is refused now, and the cluster elects
/// and grants after two leader kills.
#[test]
fn a_forged_term_far_past_the_cluster_s_leaves_a_cluster_that_elects_after_two_leader_kills() {
    let (mut cluster, metrics) = cluster_with_metrics();
    let client = cluster.client();
    let mut leader = cluster.leader(&client);
    let mut last = client.acquire(b"before", Duration::from_secs(60), Duration::ZERO).unwrap().token();
    for term in [(1u64 << 48) - 1, 1 << 48, u64::MAX] {
        for to in (1..=3).filter(|id| *id != leader) {
            let heartbeat = message(MessageType::MsgHeartbeat, leader, to, term);
            let what = format!("a heartbeat of term {term} from the leader's id");
            send_as(cluster.peer_addr(to), &metrics[(to - 1) as usize], leader, &heartbeat, &what);
        }
    }
    for round in 0..2 {
        cluster.kill(leader);
        let was = leader;
        // The two others elect without the old leader.
        let deadline = Instant::now() + DEADLINE;
        loop {
            let running: Vec<u64> = (1..=3).filter(|id| *id != was).collect();
            let statuses: Vec<_> =
                running.iter().filter_map(|id| client.status(cluster.client_addr(*id)).ok()).collect();
            if let Some(status) =
                statuses.iter().find(|status| status.leader_id != 0 && status.leader_id != was)
            {
                leader = status.leader_id;
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: no leader after killing {was}\n{}",
                cluster.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let key = format!("after-{round}");
        let token = client.acquire(key.as_bytes(), Duration::from_secs(60), Duration::ZERO).unwrap().token();
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        for id in (1..=3).filter(|id| *id != was) {
            let status = client.status(cluster.client_addr(id)).unwrap();
            assert!(status.term < SANE_TERM, "node {id} took a forged term: {}", status.term);
        }
        cluster.launch(was);
    }
}
