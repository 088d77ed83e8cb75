//! A follower that was down while the leader's log was compacted catches up
//! from a snapshot, whatever the table's size: the snapshot travels in
//! parts, is encoded and decoded off the nodes' loops, and the follower ends
//! with the leader's table. The test states the snapshot's size.
//!
//! CI runs it on 20,000 locks with the longest keys (1,024 bytes) and
//! owners (256 bytes): a snapshot of about 26 MB, several parts. The full
//! size, a million such locks (about 1.3 GB), is a release run by hand:
//!
//! ```text
//! FENCELOCK_CATCH_UP_LOCKS=1000000 cargo test --release -p fencelock-server --test catch_up -- --nocapture
//! ```

// Test code: unwrapping is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::Cluster;

/// Locks in the table: `FENCELOCK_CATCH_UP_LOCKS`, or 20,000.
fn locks_wanted() -> usize {
    std::env::var("FENCELOCK_CATCH_UP_LOCKS").ok().and_then(|value| value.parse().ok()).unwrap_or(20_000)
}

/// A key of exactly 1,024 bytes and an owner of exactly 256, both unique
/// to `n`; owners spread over 64 identities, under the per-owner quota.
fn key_and_owner(n: usize) -> (String, String) {
    let key = format!("{n:0>1024}");
    let owner = format!("id{:02}-{n:0>251}", n % 64);
    assert_eq!((key.len(), owner.len()), (1_024, 256));
    (key, owner)
}

#[test]
fn a_follower_that_was_down_catches_up_from_a_snapshot_of_a_large_table() {
    let wanted = locks_wanted();
    let mut cluster = Cluster::configure(3);
    // A few snapshots while the table fills, each of it all.
    let interval = (wanted / 20).max(500);
    for node in &mut cluster.nodes {
        node.extra_args = vec!["--snapshot-interval-entries".into(), interval.to_string()];
    }
    for id in 1..=3 {
        cluster.launch(id);
    }
    let client = cluster.client();
    let leader = cluster.leader(&client);
    let lagging = leader % 3 + 1;
    cluster.kill(lagging);

    // Fill the table from 64 threads (one connection, pipelined).
    let started = Instant::now();
    let threads = 64;
    let workers: Vec<_> = (0..threads)
        .map(|thread| {
            let client = client.clone();
            std::thread::spawn(move || {
                for n in (thread..wanted).step_by(threads) {
                    let (key, owner) = key_and_owner(n);
                    client
                        .acquire_raw(owner.as_bytes(), key, Duration::from_secs(3_600), Duration::ZERO)
                        .unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let filled = started.elapsed();
    let status = client.status(cluster.client_addr(leader)).unwrap();
    assert_eq!(status.locks, wanted as u64);
    // A little churn until the leader's snapshot holds the whole table:
    // renewals, which add no lock (a full table refuses new ones).
    let filled_at = status.applied_index;
    let (first_key, _) = key_and_owner(0);
    let first = client.get(first_key.as_bytes(), true).unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    let leader_status = loop {
        let status = client.status(cluster.client_addr(leader)).unwrap();
        if status.snapshot_index >= filled_at {
            break status;
        }
        assert!(Instant::now() < deadline, "the leader took no snapshot of the whole table: {status:?}");
        let renewed = client
            .renew(&[(first_key.clone().into_bytes(), first.token)], Duration::from_secs(3_600))
            .unwrap();
        assert!(renewed[0].2, "the renewal found the lock gone");
    };
    // The follower comes back: its log ends long before the leader's first
    // entry, so only a snapshot can bring it up to date.
    let restarted = Instant::now();
    let caught_up_started = restarted;
    cluster.launch(lagging);
    let deadline = Instant::now() + Duration::from_secs(if wanted > 100_000 { 600 } else { 120 });
    loop {
        let status = client.status(cluster.client_addr(lagging));
        if status.as_ref().is_ok_and(|status| {
            status.locks == wanted as u64 && status.applied_index >= leader_status.snapshot_index
        }) {
            break;
        }
        assert!(Instant::now() < deadline, "the follower did not catch up: {status:?}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    let caught_up = restarted.elapsed();
    assert!(cluster.log(lagging).contains("installing snapshot"), "caught up without a snapshot");
    // Its table is the leader's: a lock chosen at random holds the same token on both.
    let (key, _) = key_and_owner(wanted / 2);
    let on_leader = client.get(key.as_bytes(), true).unwrap().unwrap();
    assert!(client.check(key.as_bytes(), on_leader.token).unwrap());
    // How often a leader lost its quorum's answers for an election timeout
    // (a node's loop or disk held up): reported, not a failure.
    let step_downs = cluster.logs_all().matches("since quorum is not active").count();
    // Each node's peak resident memory (the lagging one since its restart).
    let peaks: Vec<String> = cluster
        .nodes
        .iter()
        .filter_map(|node| node.child.as_ref().map(|child| (node.id, child.id())))
        .map(|(id, pid)| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let peak =
                status.lines().find_map(|line| line.strip_prefix("VmHWM:")).unwrap_or("?").trim().to_owned();
            format!("node {id} {peak}")
        })
        .collect();
    println!("peak RSS: {}", peaks.join(", "));
    println!(
        "fill: {filled:.1?}, then {:.1?} until a snapshot of the whole table",
        caught_up_started.duration_since(started) - filled
    );
    println!(
        "catch-up: {wanted} locks of 1,024-byte keys and 256-byte owners; filled in {filled:.1?}; snapshot of {} bytes \
         ({:.1} MiB) at index {}; the follower caught up in {caught_up:.1?}; leaders stepped down {step_downs} times",
        leader_status.snapshot_bytes,
        leader_status.snapshot_bytes as f64 / (1 << 20) as f64,
        leader_status.snapshot_index
    );
}
