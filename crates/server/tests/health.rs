//! `/health`, `/ready` and `fencelock status` against real `fencelockd`
//! processes: a serving cluster, a survivor of two kill -9s, and a blank
//! node of an existing cluster waiting for its peers.
//!
//! The CLI runs from the same target directory as `fencelockd`: build it
//! first (`cargo build --bins`; `cargo xtask ci` does).

// Test code: unwrapping is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::{fencelock, free_port, http, sample, Cluster, DEADLINE};

/// A cluster of `size` whose every node serves its metrics port; the
/// ports, by node.
fn with_metrics(size: u64) -> (Cluster, Vec<String>) {
    let mut cluster = Cluster::configure(size);
    let mut metrics = Vec::new();
    for node in &mut cluster.nodes {
        let addr = format!("127.0.0.1:{}", free_port());
        node.extra_args = vec!["--metrics-addr".into(), addr.clone()];
        metrics.push(addr);
    }
    (cluster, metrics)
}

fn get(addr: &str, path: &str) -> String {
    http(addr, format!("GET {path} HTTP/1.1\r\nHost: fencelock\r\n\r\n").as_bytes())
}

/// The answer's body, after its head.
fn body(answer: &str) -> &str {
    answer.split_once("\r\n\r\n").map_or("", |(_, body)| body)
}

fn status(endpoints: &[&str], json: bool) -> Output {
    let endpoints = endpoints.join(",");
    let mut args = vec!["--endpoints", &endpoints, "--timeout", "2s"];
    if json {
        args.push("--json");
    }
    args.push("status");
    fencelock(&args)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Polls `probe` until it returns `Some`, or fails the test at the
/// deadline with what `describe` says.
fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>, describe: impl Fn() -> String) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(Instant::now() < deadline, "{what}: {}", describe());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_serving_cluster_is_healthy_ready_and_has_a_quorum() {
    let (mut cluster, metrics) = with_metrics(3);
    for id in 1..=3 {
        cluster.launch(id);
    }
    let leader = cluster.leader(&cluster.client());
    for (at, addr) in metrics.iter().enumerate() {
        let health = get(addr, "/health");
        assert!(health.starts_with("HTTP/1.1 200 OK\r\n") && body(&health) == "ok\n", "{health}");
        // A follower is ready once it has heard from the leader and applied
        // what it knows committed.
        wait_for(
            &format!("node {} never became ready", at + 1),
            || get(addr, "/ready").starts_with("HTTP/1.1 200 OK\r\n").then_some(()),
            || format!("{}\n{}", get(addr, "/ready"), cluster.logs()),
        );
        let scrape = get(addr, "/metrics");
        assert_eq!(
            sample(&scrape, &format!("fencelock_ready{{node_id=\"{}\"}}", at + 1)),
            Some(1.0),
            "{scrape}"
        );
    }
    let scrape = get(&metrics[(leader - 1) as usize], "/metrics");
    assert_eq!(sample(&scrape, &format!("fencelock_quorum{{node_id=\"{leader}\"}}")), Some(1.0), "{scrape}");

    // Every endpoint: the summary comes first, from the leader. The leader
    // hears from each follower within an election timeout, but a slow
    // machine may have it miss one for a moment: poll.
    let endpoints = cluster.endpoints();
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    let summary =
        format!("leader: {leader} ({})  reachable: 3/3 members  quorum: yes", cluster.client_addr(leader));
    let out = wait_for(
        "fencelock status never saw the whole cluster",
        || Some(status(&endpoints, false)).filter(|out| stdout(out).lines().next() == Some(summary.as_str())),
        || format!("{:?}", status(&endpoints, false)),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    // The lines printed before the summary are all still there.
    for endpoint in &endpoints {
        assert!(text.lines().any(|line| line.starts_with(&format!("{endpoint}  id="))), "{text}");
    }
    assert!(text.contains("\nmembers:\n"), "{text}");
    assert!(!text.contains("unreachable") && !text.contains("starting"), "{text}");

    let json = status(&endpoints, true);
    assert_eq!(json.status.code(), Some(0), "{json:?}");
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["summary"]["leader"], serde_json::json!(leader), "{value}");
    assert_eq!(value["summary"]["quorum"], serde_json::json!(true), "{value}");
    assert_eq!(value["summary"]["members"], serde_json::json!(3), "{value}");
    assert_eq!(value["nodes"].as_array().unwrap().len(), 3, "{value}");
    assert_eq!(value["nodes"][0]["endpoint"], serde_json::json!(endpoints[0]), "{value}");

    // Given only a follower, the CLI asks the leader it names.
    let follower = leader % 3 + 1;
    let out = status(&[cluster.client_addr(follower)], false);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let first = stdout(&out).lines().next().unwrap_or_default().to_owned();
    assert!(first.starts_with(&format!("leader: {leader} ({})", cluster.client_addr(leader))), "{out:?}");
    assert_eq!(stdout(&out).lines().filter(|line| line.contains("  id=")).count(), 1, "{out:?}");
}

#[test]
fn the_survivor_of_two_kill_9s_is_healthy_but_not_ready() {
    let (mut cluster, metrics) = with_metrics(3);
    for id in 1..=3 {
        cluster.launch(id);
    }
    let leader = cluster.leader(&cluster.client());
    // The leader is among the nodes killed half the time: whichever
    // survives must stop saying ready.
    let survivor = leader % 3 + 1;
    let addr = &metrics[(survivor - 1) as usize];
    wait_for(
        "the survivor-to-be never became ready",
        || get(addr, "/ready").starts_with("HTTP/1.1 200 OK\r\n").then_some(()),
        || cluster.logs(),
    );
    for id in (1..=3).filter(|id| *id != survivor) {
        cluster.kill(id);
    }
    // Not ready for want of a leader (a follower's, or a leader that
    // stepped down) or of a quorum (a leader that has not yet).
    let ready = wait_for(
        "the survivor stayed ready without its peers",
        || {
            Some(get(addr, "/ready")).filter(|ready| {
                ready.starts_with("HTTP/1.1 503 Service Unavailable\r\n")
                    && [
                        "not ready: no leader known\n",
                        "not ready: leader without a quorum: it hears from 1 of 3 voters\n",
                    ]
                    .contains(&body(ready))
            })
        },
        || format!("{}\n{}", get(addr, "/ready"), cluster.logs()),
    );
    assert!(ready.contains("Content-Type: text/plain"), "{ready}");
    let health = get(addr, "/health");
    assert!(health.starts_with("HTTP/1.1 200 OK\r\n") && body(&health) == "ok\n", "{health}");
    let scrape = get(addr, "/metrics");
    let label = format!("{{node_id=\"{survivor}\"}}");
    assert_eq!(sample(&scrape, &format!("fencelock_up{label}")), Some(1.0), "{scrape}");
    assert_eq!(sample(&scrape, &format!("fencelock_ready{label}")), Some(0.0), "{scrape}");

    // Asked at every endpoint, the survivor alone answers: no leader with
    // a quorum, exit code 2; it, not 1 (no endpoint answered).
    let endpoints = cluster.endpoints();
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    let out = status(&endpoints, false);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let text = stdout(&out);
    let first = text.lines().next().unwrap_or_default();
    assert!(first.starts_with("leader: ") && first.ends_with("  quorum: no"), "{out:?}");
    assert!(first.contains("reachable: 1/3 members"), "{out:?}");
    assert_eq!(text.lines().filter(|line| line.contains("  error: ")).count(), 2, "{out:?}");
    let json = status(&endpoints, true);
    assert_eq!(json.status.code(), Some(2), "{json:?}");
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["summary"]["quorum"], serde_json::json!(false), "{value}");

    // With nothing left to ask, 1.
    cluster.kill(survivor);
    let out = status(&endpoints, false);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no endpoint answered"), "{out:?}");
}

#[test]
fn a_blank_node_of_an_existing_cluster_says_whom_it_waits_for() {
    let (mut cluster, metrics) = with_metrics(3);
    cluster.nodes[0].extra_args.extend(["--initial-cluster-state".into(), "existing".into()]);
    cluster.launch(1);
    let addr = &metrics[0];
    let endpoint = cluster.client_addr(1).to_owned();
    let out = wait_for(
        "node 1 never said it was starting",
        || Some(status(&[&endpoint], false)).filter(|out| stdout(out).contains("  id=1 ")),
        || format!("{:?}\n{}", status(&[&endpoint], false), cluster.logs()),
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let text = stdout(&out);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("leader: none  reachable: 1/3 members  quorum: no"), "{text}");
    let line = lines.next().unwrap_or_default();
    assert!(line.starts_with(&format!("{endpoint}  id=1 role=follower")), "{text}");
    assert!(line.ends_with(" starting (waiting for peers 2, 3)"), "{text}");

    let json = status(&[&endpoint], true);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["nodes"][0]["starting"], serde_json::json!(true), "{value}");
    assert_eq!(value["nodes"][0]["waiting_for"], serde_json::json!([2, 3]), "{value}");
    assert_eq!(value["summary"]["leader"], serde_json::Value::Null, "{value}");

    let ready = get(addr, "/ready");
    assert!(ready.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{ready}");
    assert_eq!(body(&ready), "not ready: starting, waiting for peers 2, 3\n", "{ready}");
    let health = get(addr, "/health");
    assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
    let scrape = get(addr, "/metrics");
    assert_eq!(sample(&scrape, "fencelock_up{node_id=\"1\"}"), Some(0.0), "{scrape}");
    assert_eq!(sample(&scrape, "fencelock_ready{node_id=\"1\"}"), Some(0.0), "{scrape}");
}
