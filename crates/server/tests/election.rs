//! Leader election with real processes: `fencelock elect` candidates against
//! a 3-node cluster whose raft leader is killed (kill -9) and restarted, and
//! whose leading candidate is killed too; `fencelock observe` following it.
//!
//! Each candidate's command writes a line when it starts and when it stops
//! (on the SIGTERM `elect` sends when the lead is lost), with its fencing
//! token and the time. The check: exactly one command runs at the end, and
//! by their tokens the commands never overlapped: each one started after
//! every command with a smaller token had stopped.

// Test code: unwrapping is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{cli_binary, Cluster, DEADLINE};

/// A `fencelock elect` process, killed (SIGKILL) when dropped.
struct Candidate {
    name: String,
    child: Child,
}

impl Drop for Candidate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts candidate `name` in election `svc/leader`; its command logs to
/// `log` and runs until it is stopped.
fn candidate(cluster: &Cluster, name: &str, log: &Path) -> Candidate {
    let script = format!(
        "echo \"start $FENCELOCK_TOKEN {name} $(date +%s%N)\" >> {log}; \
         trap 'echo \"end $FENCELOCK_TOKEN {name} $(date +%s%N)\" >> {log}; exit 0' TERM; \
         while :; do sleep 0.05; done",
        log = log.display()
    );
    let child = Command::new(cli_binary())
        .arg("--endpoints")
        .arg(cluster.endpoints().join(","))
        .args(["elect", "svc/leader", "--value", name, "--ttl", "2s", "--grace", "1s", "--", "sh", "-c"])
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log.with_file_name(format!("{name}.err"))).unwrap())
        .spawn()
        .unwrap();
    Candidate { name: name.to_owned(), child }
}

/// One command's run: its token, candidate, start and (if it stopped) end,
/// in nanoseconds of the wall clock.
#[derive(Debug)]
struct Run {
    name: String,
    start: u128,
    end: Option<u128>,
}

fn runs(log: &Path) -> BTreeMap<u64, Run> {
    let mut runs = BTreeMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [what, token, name, time] = fields.as_slice() else { panic!("a bad log line: {line:?}") };
        let (token, time): (u64, u128) = (token.parse().unwrap(), time.parse().unwrap());
        match *what {
            "start" => {
                let earlier = runs.insert(token, Run { name: (*name).to_owned(), start: time, end: None });
                assert!(earlier.is_none(), "token {token} started two commands");
            }
            "end" => runs.get_mut(&token).expect("an end without a start").end = Some(time),
            other => panic!("a bad log line: {other}"),
        }
    }
    runs
}

/// The candidate whose command runs now, once exactly one runs.
fn running(log: &Path) -> (u64, String) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let runs = runs(log);
        let open: Vec<_> = runs.iter().filter(|(_, run)| run.end.is_none()).collect();
        if let [(token, run)] = open.as_slice() {
            return (**token, run.name.clone());
        }
        assert!(open.len() <= 1, "two commands run at once: {runs:?}");
        assert!(Instant::now() < deadline, "no command runs: {runs:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn fencelock_elect_keeps_exactly_one_command_running_while_leaders_are_killed() {
    let mut cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);
    let log: PathBuf = cluster.dir.path().join("runs.log");
    let observed = cluster.dir.path().join("observe.jsonl");
    let mut observer = Command::new(cli_binary())
        .arg("--endpoints")
        .arg(cluster.endpoints().join(","))
        .args(["--json", "observe", "svc/leader"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&observed).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    let mut candidates: Vec<Candidate> =
        ["c1", "c2", "c3"].iter().map(|name| candidate(&cluster, name, &log)).collect();
    let mut next_name = 4;
    let mut tokens_seen = Vec::new();
    for round in 0..4 {
        let (token, leading) = running(&log);
        tokens_seen.push(token);
        if round % 2 == 0 {
            // kill -9 the raft leader, and bring it back: the lead survives
            // (its renewals go to the new raft leader).
            let leader = cluster.leader(&client);
            cluster.kill(leader);
            std::thread::sleep(Duration::from_millis(1_500));
            cluster.launch(leader);
            cluster.leader(&client);
        } else {
            // kill -9 the leading candidate: its watchdog stops its command,
            // the lease runs out, and the next candidate leads. A new
            // candidate takes its place.
            let at = candidates.iter().position(|candidate| candidate.name == leading).unwrap();
            drop(candidates.remove(at));
            let deadline = Instant::now() + DEADLINE;
            while running_token(&log) == Some(token) || running_token(&log).is_none() {
                assert!(
                    Instant::now() < deadline,
                    "no new leader after {leading} was killed: {:?}\n{}",
                    runs(&log),
                    stderr_of(&log)
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            candidates.push(candidate(&cluster, &format!("c{next_name}"), &log));
            next_name += 1;
        }
    }
    let (last_token, _) = running(&log);
    // Let the observer catch up with the last leader, then stop it.
    let deadline = Instant::now() + DEADLINE;
    while !std::fs::read_to_string(&observed).unwrap().contains(&format!("\"token\":{last_token}")) {
        assert!(Instant::now() < deadline, "the observer never saw token {last_token}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = observer.kill();
    let _ = observer.wait();
    drop(candidates);

    // No overlap, by tokens: each command started after the one before it
    // (by token) had stopped; and there were handoffs to check.
    let runs = runs(&log);
    assert!(runs.len() >= 3, "two leader kills should have made at least three leaders: {runs:?}");
    let ordered: Vec<_> = runs.iter().collect();
    for pair in ordered.windows(2) {
        let ((earlier_token, earlier), (later_token, later)) = (pair[0], pair[1]);
        let ended = earlier.end.unwrap_or_else(|| panic!("token {earlier_token} never stopped: {runs:?}"));
        assert!(
            ended <= later.start,
            "token {later_token} ({}) started {} µs before token {earlier_token} ({}) stopped",
            later.name,
            (ended - later.start) / 1_000,
            earlier.name
        );
    }

    // The observer told leaders in token order, each a command that ran,
    // and it ended on the last one.
    let told: Vec<u64> = std::fs::read_to_string(&observed)
        .unwrap()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|change| change["leader"]["token"].as_u64())
        .collect();
    assert!(told.windows(2).all(|pair| pair[0] <= pair[1]), "leaders told out of order: {told:?}");
    assert!(
        told.iter().all(|token| runs.contains_key(token)),
        "a leader told that never ran: {told:?} {runs:?}"
    );
    assert_eq!(told.last(), Some(&last_token));
    // Every leader seen during the rounds was told.
    assert!(tokens_seen.iter().all(|token| told.contains(token)), "{tokens_seen:?} not all in {told:?}");
}

/// What the candidates said on stderr, for a failure's message.
fn stderr_of(log: &Path) -> String {
    let dir = log.parent().unwrap();
    let mut said = String::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.path().extension().is_some_and(|ext| ext == "err") {
            said += &format!(
                "{}: {}\n",
                entry.path().display(),
                std::fs::read_to_string(entry.path()).unwrap_or_default()
            );
        }
    }
    said
}

fn running_token(log: &Path) -> Option<u64> {
    let runs = runs(log);
    let open: Vec<u64> = runs.iter().filter(|(_, run)| run.end.is_none()).map(|(token, _)| *token).collect();
    assert!(open.len() <= 1, "two commands run at once: {runs:?}");
    open.first().copied()
}

#[test]
fn a_leader_proclaims_and_observers_see_it_and_a_second_candidate_waits_its_turn() {
    let cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);
    let first = client.campaign("svc/db", "10.0.0.1:5432", Duration::from_secs(5), Duration::ZERO).unwrap();
    let mut observer = client.observe("svc/db");
    let now = observer.next(Duration::from_secs(1)).unwrap().unwrap();
    assert_eq!(
        now.leader.as_ref().map(|leader| (leader.token, leader.value.clone())),
        Some((first.token(), b"10.0.0.1:5432".to_vec()))
    );
    // A second candidate does not lead while the first does.
    assert!(matches!(
        client.campaign("svc/db", "10.0.0.2:5432", Duration::from_secs(5), Duration::ZERO),
        Err(fencelock_client::ClientError::Held { .. })
    ));
    assert!(first.proclaim("10.0.0.1:6432").unwrap());
    let proclaimed = observer.next(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(proclaimed.leader.unwrap().value, b"10.0.0.1:6432");
    assert!(proclaimed.index > now.index);
    // The CLI shows the value, and observe --once names the leader.
    let once = Command::new(cli_binary())
        .arg("--endpoints")
        .arg(cluster.endpoints().join(","))
        .args(["--json", "observe", "svc/db", "--once"])
        .output()
        .unwrap();
    assert_eq!(once.status.code(), Some(0), "{once:?}");
    let said: serde_json::Value = serde_json::from_slice(&once.stdout).unwrap();
    assert_eq!(said["leader"]["value"], "10.0.0.1:6432");
    assert_eq!(said["leader"]["token"], first.token());
    let stale = first.token();
    // Resigning hands the lead to a waiting candidate, with a greater token.
    let waiting = std::thread::spawn({
        let client = client.clone();
        move || client.campaign("svc/db", "10.0.0.2:5432", Duration::from_secs(5), DEADLINE).unwrap()
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(first.release().unwrap());
    let second = waiting.join().unwrap();
    assert!(second.token() > stale);
    let mut leaders = Vec::new();
    while let Some(change) = observer.next(Duration::from_secs(2)).unwrap() {
        leaders.push(change.leader.map(|leader| leader.token));
        if leaders.last() == Some(&Some(second.token())) {
            break;
        }
    }
    assert_eq!(leaders.last(), Some(&Some(second.token())), "{leaders:?}");
    // The old leader's token proclaims nothing.
    let outcome = client.proclaim("svc/db", stale, "10.0.0.9:1").unwrap();
    assert!(!outcome.released);
    assert_eq!(outcome.holder_token, Some(second.token()));
    // A value over 4 KiB is refused, and the node serves on.
    assert!(matches!(
        client.campaign("svc/big", vec![b'v'; 4_097], Duration::from_secs(5), Duration::ZERO),
        Err(fencelock_client::ClientError::InvalidArgument(_))
    ));
    assert!(client.check("svc/db", second.token()).unwrap());
}

#[test]
fn a_lock_granted_after_a_wait_longer_than_its_lease_can_be_counted_on() {
    // The client can prove only the send time of its acquire: without a
    // fresh renewal, a grant after a 3 s wait for a 2 s lease was lost on
    // arrival (and `fencelock lock --wait` stopped its job at once).
    let cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);
    let mut config = fencelock_client::ClientConfig::new(cluster.endpoints());
    config.owner = Some("patient".into());
    config.retry_for = DEADLINE;
    let patient = fencelock_client::Client::connect(config).unwrap();
    let held = client.acquire("jobs/slow", Duration::from_secs(2), Duration::ZERO).unwrap();
    let waiting = std::thread::spawn(move || {
        let guard = patient.acquire("jobs/slow", Duration::from_secs(2), DEADLINE).unwrap();
        (guard.is_lost(), guard.time_left(), guard.token())
    });
    std::thread::sleep(Duration::from_secs(3));
    let first = held.token();
    assert!(held.release().unwrap());
    let (lost, left, token) = waiting.join().unwrap();
    assert!(token > first);
    assert!(!lost, "a lock granted after a long wait was lost on arrival");
    assert!(left > Duration::from_millis(1_000), "only {left:?} left of a fresh 2 s lease");
}
