//! A rolling restart of a real 3-node cluster by SIGTERM, the leader each
//! time (the worst case): a stopping leader hands leadership to the most
//! caught-up voter before it exits, so that the cluster does not wait an
//! election timeout for a leader; every node exits 0; a client locking
//! throughout sees tokens only increase, and every lock it was told it
//! holds is still held at the end.
//!
//! It prints the longest time no acquire succeeded around each restart:
//! the figures docs/benchmarks.md quotes ("Rolling restart").

// Test code: unwrapping is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Cluster, DEADLINE};
use fencelock_launch::Stopped;

/// Acquires distinct keys one after another until stopped, recording each
/// acknowledged (key, token) and when it was acknowledged.
struct Locker {
    stop: Arc<AtomicBool>,
    taken: Arc<Mutex<Vec<(String, u64, Instant)>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Locker {
    fn start(cluster: &Cluster) -> Locker {
        let client = cluster.client();
        let stop = Arc::new(AtomicBool::new(false));
        let taken = Arc::new(Mutex::new(Vec::new()));
        let (flag, record) = (Arc::clone(&stop), Arc::clone(&taken));
        let thread = std::thread::spawn(move || {
            let mut n = 0;
            while !flag.load(Ordering::SeqCst) {
                n += 1;
                let key = format!("rolling/{n}");
                if let Ok(guard) = client.acquire(&key, Duration::from_secs(120), Duration::ZERO) {
                    record.lock().unwrap().push((key, guard.token(), Instant::now()));
                    std::mem::forget(guard);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Locker { stop, taken, thread }
    }

    fn count(&self) -> usize {
        self.taken.lock().unwrap().len()
    }

    fn wait_for(&self, more: usize, cluster: &Cluster) {
        let target = self.count() + more;
        let deadline = Instant::now() + DEADLINE;
        while self.count() < target {
            assert!(Instant::now() < deadline, "locking stalled at {}: {}", self.count(), cluster.logs());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The longest time between two acknowledgements from the last one
    /// before `from` to `to`.
    fn longest_gap(&self, from: Instant, to: Instant) -> Duration {
        let taken = self.taken.lock().unwrap();
        let first = taken.iter().rposition(|(_, _, at)| *at < from).unwrap_or(0);
        let times: Vec<Instant> =
            taken[first..].iter().map(|(_, _, at)| *at).filter(|at| *at <= to).collect();
        times.windows(2).map(|pair| pair[1] - pair[0]).max().unwrap_or_default()
    }
}

#[test]
fn a_rolling_restart_of_the_leader_hands_leadership_over_and_loses_no_lock() {
    let mut cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);
    let locker = Locker::start(&cluster);
    locker.wait_for(20, &cluster);
    let mut gaps = Vec::new();
    for round in 0..3 {
        let leader = cluster.leader(&client);
        let before = Instant::now();
        let process = cluster.nodes[(leader - 1) as usize].child.take().unwrap();
        let stopped = process.stop(DEADLINE).unwrap();
        assert!(
            matches!(stopped, Stopped::Exited(status) if status.success()),
            "round {round}: node {leader} did not exit cleanly: {stopped:?}\n{}",
            cluster.logs()
        );
        let log = cluster.log(leader);
        assert!(
            log.contains("leadership handed over"),
            "round {round}: node {leader} did not hand over:\n{log}"
        );
        // The others lead and grant without it.
        locker.wait_for(10, &cluster);
        cluster.launch(leader);
        locker.wait_for(10, &cluster);
        gaps.push(locker.longest_gap(before, Instant::now()));
    }
    locker.stop.store(true, Ordering::SeqCst);
    locker.thread.join().unwrap();
    let taken = locker.taken.lock().unwrap().clone();
    for pair in taken.windows(2) {
        assert!(pair[0].1 < pair[1].1, "tokens went backwards or repeated: {:?} then {:?}", pair[0], pair[1]);
    }
    for (key, token, _) in &taken {
        assert!(client.check(key, *token).unwrap(), "acknowledged lock {key} (token {token}) was lost");
    }
    let shown: Vec<String> = gaps.iter().map(|gap| format!("{} ms", gap.as_millis())).collect();
    println!(
        "rolling restart, longest time without an acquire around each leader stop: {}",
        shown.join(", ")
    );
}
