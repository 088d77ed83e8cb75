//! How a cluster starts, and how it names itself: real `fencelockd`
//! processes started with host names in `--peers`, advertised client
//! addresses, and `--initial-cluster-state`.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, DEADLINE};
use fencelock_client::{Client, ClientConfig};
use fencelock_launch::probe;

/// A `fencelockd` started here, killed when dropped; its log in a file.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One node's addresses: where it listens for clients, what it tells them,
/// and its entry in `--peers`.
struct Addrs {
    client: SocketAddr,
    advertised: String,
    peer: String,
}

fn start(dir: &Path, id: u64, peers: &str, addrs: &Addrs, extra: &[&str]) -> Daemon {
    let log = std::fs::File::create(dir.join(format!("node-{id}.log"))).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_fencelockd"))
        .args(["--id", &id.to_string(), "--peers", peers])
        .args(["--client-addr", &addrs.client.to_string()])
        .args(["--advertise-client-addr", &addrs.advertised])
        .arg("--data-dir")
        .arg(dir.join(format!("data-{id}")))
        .args(["--tick-ms", "20", "--election-ms", "200", "--heartbeat-ms", "40", "--lease-min-ms", "1000"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Daemon(child)
}

fn logs(dir: &Path) -> String {
    (1..=3)
        .filter_map(|id| std::fs::read_to_string(dir.join(format!("node-{id}.log"))).ok())
        .map(|log| log.lines().rev().take(15).collect::<Vec<_>>().join("\n"))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// A host name for node `id` that resolves to a loopback address: one of
/// `fencelock-node-N` if /etc/hosts has them (`.ci/run` adds them), else
/// `localhost`.
fn host_name(id: u64) -> String {
    let name = format!("fencelock-node-{id}");
    let loopback =
        (name.as_str(), 0).to_socket_addrs().is_ok_and(|mut found| found.any(|addr| addr.ip().is_loopback()));
    if loopback {
        name
    } else {
        "localhost".to_owned()
    }
}

fn client(endpoints: Vec<String>) -> Client {
    let mut config = ClientConfig::new(endpoints);
    config.request_timeout = Duration::from_secs(2);
    config.retry_for = DEADLINE;
    Client::connect(config).unwrap()
}

/// Three nodes' addresses: peers named by host name, clients bound to an
/// IP and told a host name.
fn named_addrs() -> (String, Vec<Addrs>) {
    let nodes: Vec<Addrs> = (1..=3)
        .map(|id| {
            let name = host_name(id);
            let client_port = free_port();
            let client = (name.as_str(), client_port).to_socket_addrs().unwrap().next().unwrap();
            Addrs {
                client,
                advertised: format!("{name}:{client_port}"),
                peer: format!("{name}:{}", free_port()),
            }
        })
        .collect();
    let peers =
        nodes.iter().enumerate().map(|(at, node)| format!("{}={}", at + 1, node.peer)).collect::<Vec<_>>();
    (peers.join(","), nodes)
}

#[test]
fn a_cluster_named_by_host_names_serves_and_points_clients_at_the_advertised_leader() {
    let dir = tempfile::tempdir().unwrap();
    let (peers, nodes) = named_addrs();
    let _daemons: Vec<Daemon> = nodes
        .iter()
        .enumerate()
        .map(|(at, addrs)| start(dir.path(), at as u64 + 1, &peers, addrs, &[]))
        .collect();
    let clients: Vec<SocketAddr> = nodes.iter().map(|addrs| addrs.client).collect();
    let leader = probe::wait_for_leader(&clients, DEADLINE)
        .unwrap_or_else(|err| panic!("{err}: {}", logs(dir.path())));
    let leader_addrs = &nodes[(leader - 1) as usize];
    for (at, addrs) in nodes.iter().enumerate() {
        let status = probe::status(addrs.client, Duration::from_secs(5)).unwrap();
        assert_eq!(status.leader_addr, leader_addrs.advertised, "node {}'s leader hint", at + 1);
        assert!(status.quorum || status.leader_id != at as u64 + 1, "the leader has no quorum: {status:?}");
        let own = status.members.iter().find(|member| member.id == at as u64 + 1).unwrap();
        assert_eq!(own.client_addr, addrs.advertised);
    }
    // A client given only a follower follows its hint, a host name, to
    // the leader.
    let follower = nodes.iter().enumerate().find(|(at, _)| *at as u64 + 1 != leader).unwrap().1;
    let client = client(vec![follower.advertised.clone()]);
    let guard = client.acquire("named/job", Duration::from_secs(10), Duration::ZERO).unwrap();
    assert!(guard.token() > 0);
}

#[test]
fn two_of_three_nodes_of_a_new_cluster_elect_a_leader_and_the_third_joins_later() {
    let dir = tempfile::tempdir().unwrap();
    let (peers, nodes) = named_addrs();
    let mut daemons: Vec<Daemon> =
        (0..2).map(|at| start(dir.path(), at + 1, &peers, &nodes[at as usize], &[])).collect();
    let two: Vec<SocketAddr> = nodes[..2].iter().map(|addrs| addrs.client).collect();
    probe::wait_for_leader(&two, DEADLINE).unwrap_or_else(|err| panic!("{err}: {}", logs(dir.path())));
    let endpoints: Vec<String> = nodes.iter().map(|addrs| addrs.advertised.clone()).collect();
    let client = client(endpoints);
    let first = client.acquire("majority/first", Duration::from_secs(10), Duration::ZERO).unwrap();
    // The third node, blank, finds a running cluster that does not know
    // it: every peer answered, so it joins as a member and catches up.
    daemons.push(start(dir.path(), 3, &peers, &nodes[2], &[]));
    let deadline = Instant::now() + DEADLINE;
    loop {
        let status = probe::status(nodes[2].client, Duration::from_secs(2));
        if let Ok(status) = &status {
            if status.leader_id != 0 && !status.starting && status.locks >= 1 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "node 3 never caught up: {status:?}: {}", logs(dir.path()));
        std::thread::sleep(Duration::from_millis(50));
    }
    let second = client.acquire("majority/second", Duration::from_secs(10), Duration::ZERO).unwrap();
    assert!(second.token() > first.token());
}

#[test]
fn a_node_of_an_existing_cluster_waits_for_every_peer_and_says_whom() {
    let dir = tempfile::tempdir().unwrap();
    let (peers, nodes) = named_addrs();
    let existing = ["--initial-cluster-state", "existing"];
    let mut daemons: Vec<Daemon> =
        (0..2).map(|at| start(dir.path(), at + 1, &peers, &nodes[at as usize], &existing)).collect();
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        match probe::status(nodes[0].client, Duration::from_secs(2)) {
            Ok(status) if status.starting && status.waiting_for == [3] => break status,
            other => {
                assert!(Instant::now() < deadline, "{other:?}: {}", logs(dir.path()));
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    assert_eq!(status.leader_id, 0);
    // Well past a few election timeouts: still nothing founded.
    std::thread::sleep(Duration::from_secs(1));
    let status = probe::status(nodes[1].client, Duration::from_secs(2)).unwrap();
    assert!(status.starting && status.leader_id == 0, "{status:?}");
    // Every peer answers now, all blank: founding, which `existing` never
    // does, however long it waits.
    daemons.push(start(dir.path(), 3, &peers, &nodes[2], &existing));
    let deadline = Instant::now() + DEADLINE;
    loop {
        let status = probe::status(nodes[2].client, Duration::from_secs(2));
        if status.as_ref().is_ok_and(|status| status.starting && status.waiting_for.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "{status:?}: {}", logs(dir.path()));
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(1));
    for addrs in &nodes {
        let status = probe::status(addrs.client, Duration::from_secs(2)).unwrap();
        assert!(status.starting && status.leader_id == 0, "founded with `existing`: {status:?}");
    }
    // The operator means a new cluster: started again with `new`, it is.
    drop(daemons);
    let daemons: Vec<Daemon> =
        (0..3).map(|at| start(dir.path(), at + 1, &peers, &nodes[at as usize], &[])).collect();
    let clients: Vec<SocketAddr> = nodes.iter().map(|addrs| addrs.client).collect();
    probe::wait_for_leader(&clients, DEADLINE).unwrap_or_else(|err| panic!("{err}: {}", logs(dir.path())));
    drop(daemons);
}
