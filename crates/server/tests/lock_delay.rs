//! Lock-delay against real processes: `fencelockd --lock-delay` holds a key
//! whose lock expired back from everyone for the delay, says so to an
//! acquire (the CLI exits 2 and names the delay) and in `get`, and then
//! grants it again under a greater token. A released lock is not held back.

// Test code: unwrapping is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{fencelock, Cluster, DEADLINE};

#[test]
fn an_expired_lock_is_held_back_for_its_delay_and_a_released_one_is_not() {
    let mut cluster = Cluster::configure(3);
    for node in &mut cluster.nodes {
        node.extra_args = vec!["--lock-delay".into(), "jobs/=3s".into()];
    }
    for id in 1..=3 {
        cluster.launch(id);
    }
    let client = cluster.client();
    cluster.leader(&client);
    let endpoints = cluster.endpoints().join(",");
    let cli = |args: &[&str]| {
        let mut all = vec!["--endpoints", endpoints.as_str()];
        all.extend_from_slice(args);
        fencelock(&all)
    };

    // Held, not renewed: its lease runs out and the delay begins.
    let grant = client.acquire_raw(b"first", "jobs/a", Duration::from_secs(1), Duration::ZERO).unwrap();
    let free = client.acquire_raw(b"first", "other/a", Duration::from_secs(1), Duration::ZERO).unwrap();
    let deadline = Instant::now() + DEADLINE;
    let held_back = loop {
        let info = client.get("jobs/a", true).unwrap().expect("jobs/a was released instead of held back");
        if info.delayed {
            break info;
        }
        assert!(Instant::now() < deadline, "the lease never ran out");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!((held_back.token, held_back.lease_ms), (grant.token, 3_000));
    // The key without a rule is simply free once its own expiry applies
    // (a request of its own, which may come an entry after jobs/a's), and
    // never held back.
    loop {
        match client.get("other/a", true).unwrap() {
            None => break,
            Some(info) => assert!(!info.delayed, "token {} was held back", free.token),
        }
        assert!(Instant::now() < deadline, "other/a never expired");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Nobody gets it meanwhile, its former owner included; the CLI says so
    // and exits 2 (not obtained).
    let refused = client.acquire_raw(b"first", "jobs/a", Duration::from_secs(5), Duration::ZERO);
    match refused {
        Err(fencelock_client::ClientError::Delayed { holder_token, left }) => {
            assert_eq!(holder_token, Some(grant.token));
            assert!(left > Duration::ZERO && left <= Duration::from_secs(3), "{left:?}");
        }
        other => panic!("an acquire during the delay was answered {other:?}"),
    }
    assert!(!client.check("jobs/a", grant.token).unwrap(), "a held-back lock checks as held");
    let output = cli(&["acquire", "jobs/a", "--ttl", "5s"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("held back by lock-delay after token"), "{stderr}");
    let shown = cli(&["get", "jobs/a"]);
    let stdout = String::from_utf8_lossy(&shown.stdout);
    assert!(stdout.starts_with("jobs/a held back by lock-delay after token="), "{stdout}");
    let json = cli(&["get", "jobs/a", "--json"]);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["holder"]["delayed"], serde_json::json!(true));

    // A waiting acquire gets it once the delay is over, with a greater token.
    let waited =
        client.acquire_raw(b"second", "jobs/a", Duration::from_secs(5), Duration::from_secs(20)).unwrap();
    assert!(waited.token > grant.token);
    let info = client.get("jobs/a", true).unwrap().unwrap();
    assert!(!info.delayed && info.token == waited.token);

    // Released rather than expired: free at once.
    assert!(client.release("jobs/a", waited.token).unwrap());
    let again = client.acquire_raw(b"third", "jobs/a", Duration::from_secs(5), Duration::ZERO).unwrap();
    assert!(again.token > waited.token);
}
