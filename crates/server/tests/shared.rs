//! Read-write locks and semaphores with real processes: `fencelock lock
//! --permits` jobs against a 3-node cluster whose raft leader is killed
//! (kill -9) while they run, and readers and a writer through the client
//! and the CLI.

// Test code: unwrapping is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{cli_binary, Cluster, DEADLINE};
use fencelock_client::{ClientConfig, ClientError, Share, ShareKind};

/// A `fencelock lock KEY --permits 2` job that logs its start and end.
fn job(cluster: &Cluster, name: &str, log: &Path) -> Child {
    let script = format!(
        "echo \"start $FENCELOCK_TOKEN {name} $(date +%s%N)\" >> {log}; sleep 0.4; \
         echo \"end $FENCELOCK_TOKEN {name} $(date +%s%N)\" >> {log}",
        log = log.display()
    );
    Command::new(cli_binary())
        .arg("--endpoints")
        .arg(cluster.endpoints().join(","))
        .args(["lock", "jobs/pool", "--permits", "2", "--ttl", "2s", "--wait", "60s", "--", "sh", "-c"])
        .arg(script)
        .env("FENCELOCK_OWNER", name)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_semaphore_of_two_never_runs_three_jobs_at_once_while_the_leader_is_killed() {
    let mut cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);
    let log = cluster.dir.path().join("jobs.log");
    // Each job is its own process, hence its own owner.
    let mut jobs: Vec<Child> = (0..6).map(|n| job(&cluster, &format!("job-{n}"), &log)).collect();
    std::thread::sleep(Duration::from_millis(700));
    let leader = cluster.leader(&client);
    cluster.kill(leader);
    std::thread::sleep(Duration::from_millis(500));
    cluster.launch(leader);
    let deadline = Instant::now() + 2 * DEADLINE;
    for job in &mut jobs {
        let status = loop {
            if let Some(status) = job.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "a job never ran");
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(job.stderr.as_mut().unwrap(), &mut stderr).unwrap();
        assert!(status.success(), "{status:?}: {stderr}");
    }
    // Every job ran once, under a token of its own, and at no moment did
    // three run at once.
    let text = std::fs::read_to_string(&log).unwrap();
    let mut edges: Vec<(u128, i32)> = Vec::new();
    let mut tokens = std::collections::BTreeSet::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [what, token, _, time] = fields.as_slice() else { panic!("a bad line {line:?}") };
        let time: u128 = time.parse().unwrap();
        match *what {
            "start" => {
                assert!(tokens.insert(token.to_string()), "token {token} ran two jobs");
                edges.push((time, 1));
            }
            _ => edges.push((time, -1)),
        }
    }
    assert_eq!(tokens.len(), 6, "{text}");
    // Ends before starts at the same instant.
    edges.sort();
    let mut running = 0;
    let mut most = 0;
    for (_, step) in edges {
        running += step;
        most = most.max(running);
    }
    assert!(most <= 2, "{most} jobs ran at once on a semaphore of 2:\n{text}");
    assert_eq!(most, 2, "the jobs never used both permits:\n{text}");
}

#[test]
fn readers_share_a_key_a_writer_waits_for_them_and_the_cli_shows_every_holder() {
    let cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);
    let second = {
        let mut config = ClientConfig::new(cluster.endpoints());
        config.owner = Some(b"reader-2".to_vec());
        config.retry_for = DEADLINE;
        fencelock_client::Client::connect(config).unwrap()
    };
    let lease = Duration::from_secs(5);
    let r1 = client.acquire_shared("db/schema", Share::Read, lease, Duration::ZERO).unwrap();
    let r2 = second.acquire_shared("db/schema", Share::Read, lease, Duration::ZERO).unwrap();
    assert_ne!(r1.token(), r2.token());
    let readers_max = r1.token().max(r2.token());
    let holders = client.holders("db/schema", true).unwrap();
    assert_eq!(
        holders.iter().map(|info| (info.token, info.share)).collect::<Vec<_>>(),
        [(r1.token(), ShareKind::Read), (r2.token(), ShareKind::Read)]
    );
    let cli = |args: &[&str]| {
        Command::new(cli_binary())
            .arg("--endpoints")
            .arg(cluster.endpoints().join(","))
            .args(args)
            .output()
            .unwrap()
    };
    let shown = cli(&["get", "db/schema"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert_eq!(text.lines().filter(|line| line.contains("share=read")).count(), 2, "{text}");
    // A writer that does not wait is told who holds the key; the CLI exits 2.
    let refused = cli(&["acquire", "db/schema", "--write", "--ttl", "5s", "--owner", "writer"]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    // A writer that waits gets the key once both readers are gone.
    let writer = std::thread::spawn({
        let endpoints = cluster.endpoints();
        move || {
            let mut config = ClientConfig::new(endpoints);
            config.owner = Some(b"writer".to_vec());
            config.retry_for = DEADLINE;
            let client = fencelock_client::Client::connect(config).unwrap();
            let guard = client.acquire_shared("db/schema", Share::Write, lease, DEADLINE).unwrap();
            let holders = client.holders("db/schema", true).unwrap();
            (guard, holders)
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(r1.release().unwrap());
    std::thread::sleep(Duration::from_millis(300));
    assert!(!writer.is_finished(), "the writer got in beside a reader");
    assert!(r2.release().unwrap());
    // The writer keeps its guard (and its key) until the end.
    let (writer_guard, holders) = writer.join().unwrap();
    let token = writer_guard.token();
    assert!(token > readers_max);
    assert_eq!(
        holders.iter().map(|info| (info.token, info.share)).collect::<Vec<_>>(),
        [(token, ShareKind::Write)]
    );
    // Another kind on the key is refused with a clear error, and a
    // semaphore's number of permits is fixed.
    let mismatch = cli(&["acquire", "db/schema", "--permits", "3", "--ttl", "5s"]);
    assert_eq!(mismatch.status.code(), Some(1), "{mismatch:?}");
    assert!(String::from_utf8_lossy(&mismatch.stderr).contains("read-write lock"), "{mismatch:?}");
    let pool = client.acquire_shared("pool", Share::Permit(2), lease, Duration::ZERO).unwrap();
    assert!(matches!(
        second.acquire_shared("pool", Share::Permit(3), lease, Duration::ZERO),
        Err(ClientError::InvalidArgument(message)) if message.contains("semaphore of 2 permits")
    ));
    assert!(matches!(
        client.acquire("pool", lease, Duration::ZERO),
        Err(ClientError::Held { holder_token: Some(token) }) if token == pool.token()
    ));
}

#[test]
fn a_shared_holders_proclaim_is_invalid_argument_and_changes_nothing() {
    let cluster = Cluster::start(1);
    let client = cluster.client();
    cluster.leader(&client);
    let second = {
        let mut config = ClientConfig::new(cluster.endpoints());
        config.owner = Some(b"holder-2".to_vec());
        config.retry_for = DEADLINE;
        fencelock_client::Client::connect(config).unwrap()
    };
    let lease = Duration::from_secs(30);
    let reader = client.acquire_shared("cfg/rw", Share::Read, lease, Duration::ZERO).unwrap();
    let reader_2 = second.acquire_shared("cfg/rw", Share::Read, lease, Duration::ZERO).unwrap();
    let permit = client.acquire_shared("cfg/pool", Share::Permit(2), lease, Duration::ZERO).unwrap();
    let permit_2 = second.acquire_shared("cfg/pool", Share::Permit(2), lease, Duration::ZERO).unwrap();
    // What a key's holders are, leaving out the time left on their leases.
    let holders = |key: &str| {
        client
            .holders(key, true)
            .unwrap()
            .into_iter()
            .map(|info| (info.token, info.owner, info.share, info.permits, info.lease_ms, info.value))
            .collect::<Vec<_>>()
    };
    let (rw_before, pool_before) = (holders("cfg/rw"), holders("cfg/pool"));
    assert_eq!(rw_before.len(), 2);
    assert_eq!(pool_before.len(), 2);

    // A holder, the first or not, through its guard or by token, is told it
    // has no value to proclaim: not that it lost the key.
    let no_value = |result: Result<bool, ClientError>, key: &str, token: u64| match result {
        Err(ClientError::InvalidArgument(message)) => {
            assert!(message.contains(key) && message.contains(&token.to_string()), "{message}");
            assert!(message.contains("carries no value to proclaim"), "{message}");
        }
        other => panic!("a shared holder's proclaim of {key} under {token}: {other:?}"),
    };
    no_value(reader.proclaim("10.0.0.1:80"), "cfg/rw", reader.token());
    no_value(reader_2.proclaim("10.0.0.1:80"), "cfg/rw", reader_2.token());
    no_value(permit_2.proclaim("10.0.0.1:80"), "cfg/pool", permit_2.token());
    no_value(
        client.proclaim("cfg/pool", permit.token(), "x").map(|outcome| outcome.released),
        "cfg/pool",
        permit.token(),
    );
    // The CLI says so and exits 1 (an error), not 2 (not held).
    let cli = |args: &[&str]| {
        Command::new(cli_binary())
            .arg("--endpoints")
            .arg(cluster.endpoints().join(","))
            .args(args)
            .output()
            .unwrap()
    };
    let said = cli(&["--json", "proclaim", "cfg/rw", "--token", &reader_2.token().to_string(), "x"]);
    assert_eq!(said.status.code(), Some(1), "{said:?}");
    let json: serde_json::Value = serde_json::from_slice(&said.stdout).unwrap();
    assert_eq!(json["kind"], "invalid_argument", "{said:?}");
    assert!(String::from_utf8_lossy(&said.stderr).contains("carries no value"), "{said:?}");
    // A token that holds no place on the key is told who holds it, as before.
    let elsewhere = client.proclaim("cfg/rw", permit.token(), "x").unwrap();
    assert!(!elsewhere.released);
    assert_eq!(elsewhere.holder_token, Some(reader.token()));

    // Nothing changed: the same holders, tokens, leases, and no values.
    assert_eq!(holders("cfg/rw"), rw_before);
    assert_eq!(holders("cfg/pool"), pool_before);
    for guard in [&reader, &reader_2, &permit, &permit_2] {
        assert!(client.check(guard.key(), guard.token()).unwrap());
    }
    // A plain lock's holder still proclaims.
    let plain = client.acquire("cfg/leader", lease, Duration::ZERO).unwrap();
    assert!(plain.proclaim("10.0.0.2:80").unwrap());
    assert_eq!(client.get("cfg/leader", true).unwrap().unwrap().value, b"10.0.0.2:80");
    for guard in [reader, reader_2, permit, permit_2, plain] {
        assert!(guard.release().unwrap());
    }
}
