//! Quotas on real `fencelockd` processes: the lock table's size and each
//! owner identity's locks, refused with `RESOURCE_EXHAUSTED` through the
//! Rust client and the CLI, and freed places taken again; the waiters of
//! one key are bounded the same way.

// Test code: unwrapping is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{cli_binary, free_port, http, sample, Cluster};
use fencelock_client::ClientError;

#[test]
fn quotas_refuse_new_locks_with_resource_exhausted_and_free_places_are_taken_again() {
    let mut cluster = Cluster::configure(1);
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    cluster.nodes[0].extra_args =
        ["--max-locks", "6", "--max-locks-per-owner", "3", "--max-waiters-per-key", "2", "--metrics-addr"]
            .iter()
            .map(|arg| arg.to_string())
            .chain([metrics_addr.clone()])
            .collect();
    cluster.launch(1);
    let client = cluster.client();
    cluster.leader(&client);
    let lease = Duration::from_secs(30);

    // One identity: `alice` and `alice/...` count together.
    let mut alice = Vec::new();
    for (n, owner) in ["alice", "alice/w1", "alice/w2"].iter().enumerate() {
        alice.push(client.acquire_raw(owner.as_bytes(), format!("a{n}"), lease, Duration::ZERO).unwrap());
    }
    let err = client.acquire_raw(b"alice/w3", "a3", lease, Duration::ZERO).unwrap_err();
    assert!(
        matches!(&err, ClientError::ResourceExhausted(message) if message.contains("\"alice\"") && message.contains('3')),
        "{err:?}"
    );
    assert_eq!(err.code(), "resource_exhausted");
    // A retry of a held lock is no new lock.
    assert!(client.acquire_raw(b"alice", "a0", lease, Duration::ZERO).unwrap().existing);

    // The table: three more locks fill it.
    for n in 0..3 {
        client.acquire_raw(format!("other-{n}").as_bytes(), format!("b{n}"), lease, Duration::ZERO).unwrap();
    }
    let cli = std::process::Command::new(cli_binary())
        .args(["--endpoints", &cluster.endpoints().join(","), "--json", "acquire", "c", "--ttl", "10s"])
        .output()
        .unwrap();
    assert_eq!(cli.status.code(), Some(1), "{cli:?}");
    let printed: serde_json::Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(printed["kind"], serde_json::json!("resource_exhausted"), "{printed}");
    assert!(printed["error"].as_str().unwrap().contains("full"), "{printed}");

    // Two waiters on one key are all it takes.
    let waiting: Vec<_> = (0..2)
        .map(|n| {
            let client = client.clone();
            std::thread::spawn(move || {
                client.acquire_raw(format!("waiter-{n}").as_bytes(), "b0", lease, Duration::from_secs(20))
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let pending = || {
        let scrape = http(&metrics_addr, b"GET /metrics HTTP/1.0\r\n\r\n");
        sample(&scrape, "fencelock_pending_requests{node_id=\"1\"}")
    };
    while pending() != Some(2.0) {
        assert!(std::time::Instant::now() < deadline, "the two waiters did not queue: {:?}", pending());
        std::thread::sleep(Duration::from_millis(20));
    }
    let third = match client.acquire_raw(b"waiter-3", "b0", lease, Duration::from_secs(20)) {
        Err(ClientError::ResourceExhausted(message)) => message,
        other => panic!("a third waiter was queued: {other:?}"),
    };
    assert!(third.contains("acquires already wait for key b0"), "{third}");

    // Releasing frees places: the first waiter gets b0 (same total); alice
    // releases one and may take another.
    let b0 = client.get(b"b0", true).unwrap().unwrap();
    assert!(client.release("b0", b0.token).unwrap());
    assert!(client.release("a1", alice[1].token).unwrap());
    client.acquire_raw(b"alice/w3", "a3", lease, Duration::ZERO).unwrap();
    // The first waiter's lock is released in turn: the second gets b0.
    let first = loop {
        match client.get(b"b0", true).unwrap() {
            Some(lock) => break lock,
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    assert!(first.token > b0.token);
    assert!(client.release("b0", first.token).unwrap());
    let mut tokens: Vec<u64> =
        waiting.into_iter().map(|waiter| waiter.join().unwrap().unwrap().token).collect();
    tokens.sort();
    assert_eq!(tokens[0], first.token);
    assert!(tokens[1] > first.token);
}
