//! Real `fencelockd` processes on 127.0.0.1: the client and the CLI against
//! them, kill -9 of the leader, garbage on both ports, and `fencelock lock`
//! stopping its child when the lock is lost.
//!
//! The CLI tests run the `fencelock` binary from the same target directory;
//! `cargo xtask ci` builds every binary before it runs the tests.

// Test code: unwrapping is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{cli_binary, free_port, http, sample, Cluster, DEADLINE};
use fencelock_client::ClientError;

fn cli(cluster: &Cluster, args: &[&str]) -> std::process::Output {
    Command::new(cli_binary())
        .arg("--endpoints")
        .arg(cluster.endpoints().join(","))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn the_client_and_the_cli_acquire_and_release() {
    let cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);

    let guard = client.acquire(b"jobs/a", Duration::from_secs(5), Duration::ZERO).unwrap();
    let token = guard.token();
    assert!(client.check(b"jobs/a", token).unwrap());
    assert!(guard.release().unwrap());
    assert!(!client.check(b"jobs/a", token).unwrap());

    let acquired = cli(&cluster, &["acquire", "jobs/b", "--ttl", "5s"]);
    assert!(acquired.status.success(), "{acquired:?}");
    let cli_token: u64 = String::from_utf8_lossy(&acquired.stdout).trim().parse().unwrap();
    assert!(cli_token > token);
    let json = cli(&cluster, &["--json", "get", "jobs/b"]);
    assert!(json.status.success(), "{json:?}");
    assert!(String::from_utf8_lossy(&json.stdout).contains(&cli_token.to_string()));
    // Held by the CLI's owner: another owner is turned away with exit code 2.
    let held = cli(&cluster, &["acquire", "jobs/b", "--ttl", "5s", "--owner", "someone-else"]);
    assert_eq!(held.status.code(), Some(2), "{held:?}");
    let released = cli(&cluster, &["release", "jobs/b", "--token", &cli_token.to_string()]);
    assert!(released.status.success(), "{released:?}");
    let again = cli(&cluster, &["release", "jobs/b", "--token", &cli_token.to_string()]);
    assert_eq!(again.status.code(), Some(2), "{again:?}");

    // An owner acquiring what it holds (a retry whose answer was lost) gets
    // its grant back, marked existing, not a second token.
    let first =
        client.acquire_raw(b"retrying-owner", "jobs/c", Duration::from_secs(5), Duration::ZERO).unwrap();
    assert!(!first.existing);
    let retried =
        client.acquire_raw(b"retrying-owner", "jobs/c", Duration::from_secs(5), Duration::ZERO).unwrap();
    assert!(retried.existing, "{retried:?}");
    assert_eq!(retried.token, first.token);
    let json = cli(&cluster, &["--json", "acquire", "jobs/c", "--ttl", "5s", "--owner", "retrying-owner"]);
    assert!(json.status.success(), "{json:?}");
    let printed: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(printed["existing"], serde_json::json!(true), "{printed}");
    assert_eq!(printed["token"], serde_json::json!(first.token), "{printed}");

    // A wait past the server's maximum (5 minutes by default) is refused,
    // and names the bound.
    let err =
        client.acquire_raw(b"o", "jobs/d", Duration::from_secs(5), Duration::from_secs(3_600)).unwrap_err();
    assert!(matches!(&err, ClientError::InvalidArgument(message) if message.contains("300000")), "{err:?}");
    assert!(client.acquire_raw(b"o", "jobs/d", Duration::from_secs(5), Duration::from_secs(300)).is_ok());
}

#[test]
fn the_cli_keeps_its_owner_across_retries_and_lock_keeps_its_own_exit_codes_and_json_apart() {
    let cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);

    // A retried `acquire` (the script ran again) gets the same token: the
    // default owner is USER@HOST, the same on every run.
    let first = cli(&cluster, &["--json", "acquire", "jobs/retry", "--ttl", "30s"]);
    assert!(first.status.success(), "{first:?}");
    let first: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    let owner = first["owner"].as_str().unwrap().to_owned();
    assert!(owner.contains('@') && !owner.starts_with('@') && !owner.ends_with('@'), "{first}");
    let again = cli(&cluster, &["--json", "acquire", "jobs/retry", "--ttl", "30s"]);
    assert!(again.status.success(), "{again:?}");
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(
        (&again["token"], &again["existing"], &again["owner"]),
        (&first["token"], &true.into(), &first["owner"])
    );
    // A wrong token is told which token holds the key.
    let token = first["token"].as_u64().unwrap();
    let wrong = cli(&cluster, &["release", "jobs/retry", "--token", "1"]);
    assert_eq!(wrong.status.code(), Some(2), "{wrong:?}");
    assert_eq!(String::from_utf8_lossy(&wrong.stdout).trim(), format!("not held (held under token {token})"));
    let wrong = cli(&cluster, &["--json", "renew", "jobs/retry", "--token", "1", "--ttl", "5s"]);
    assert_eq!(wrong.status.code(), Some(2), "{wrong:?}");
    let json: serde_json::Value = serde_json::from_slice(&wrong.stdout).unwrap();
    assert_eq!((&json["renewed"], &json["holder_token"]), (&false.into(), &token.into()), "{json}");
    let free = cli(&cluster, &["release", "jobs/never-held", "--token", "1"]);
    assert_eq!(String::from_utf8_lossy(&free.stdout).trim(), "not held (free)", "{free:?}");
    // `get` shows the time left on the lease, by the leader's clock.
    let got = cli(&cluster, &["--json", "get", "jobs/retry"]);
    let json: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    let remaining = json["holder"]["remaining_ms"].as_u64().unwrap();
    assert!(remaining > 0 && remaining <= 30_000, "{json}");
    let got = cli(&cluster, &["get", "jobs/retry"]);
    assert!(String::from_utf8_lossy(&got.stdout).contains(" lease=30s left="), "{got:?}");

    // FENCELOCK_OWNER names another owner: held, exit code 2.
    let other = Command::new(cli_binary())
        .args(["--endpoints", &cluster.endpoints().join(","), "acquire", "jobs/retry", "--ttl", "30s"])
        .env("FENCELOCK_OWNER", "another-job")
        .output()
        .unwrap();
    assert_eq!(other.status.code(), Some(2), "{other:?}");

    // A malformed endpoint is refused as the arguments are parsed, before
    // any connection (so not after --retry-for), and says which one.
    let typo = Command::new(cli_binary())
        .args(["--endpoints", &format!("{},127.0.0.1:71o1", cluster.endpoints()[0]), "status"])
        .output()
        .unwrap();
    assert_eq!(typo.status.code(), Some(1), "{typo:?}");
    let stderr = String::from_utf8_lossy(&typo.stderr);
    assert!(stderr.contains("`127.0.0.1:71o1` is not HOST:PORT"), "{stderr}");
    assert!(typo.stdout.is_empty(), "{typo:?}");

    // A cluster that does not answer: the CLI says after about a second
    // that it is still trying, and why, before it gives up.
    let nobody = format!("127.0.0.1:{}", free_port());
    let waiting = Command::new(cli_binary())
        .args(["--endpoints", &nobody, "--retry-for", "3s", "get", "jobs/retry"])
        .output()
        .unwrap();
    assert_eq!(waiting.status.code(), Some(1), "{waiting:?}");
    let stderr = String::from_utf8_lossy(&waiting.stderr);
    let notice =
        format!("no answer yet after 1s, still trying for 2s (--retry-for): {nobody}: cannot connect");
    assert!(stderr.lines().next().is_some_and(|line| line.contains(&notice)), "{stderr}");

    // `lock` on a key held by another owner: --conflict-exit-code, and the
    // JSON on stderr, stdout left to CMD (which never ran).
    let held = cli(
        &cluster,
        &["--json", "lock", "jobs/retry", "--wait", "0s", "--conflict-exit-code", "75", "--", "echo", "ran"],
    );
    assert_eq!(held.status.code(), Some(75), "{held:?}");
    assert!(held.stdout.is_empty(), "{held:?}");
    let stderr = String::from_utf8_lossy(&held.stderr);
    let json_line = stderr.lines().find(|line| line.starts_with('{')).unwrap();
    let json: serde_json::Value = serde_json::from_str(json_line).unwrap();
    assert_eq!((&json["kind"], &json["exit_code"]), (&"held".into(), &75.into()), "{json}");

    // A job that writes to stdout and exits 2: its stdout and its code are
    // its own, and the result goes to --json-file.
    let result = cluster.dir.path().join("lock.json");
    let result_arg = result.to_str().unwrap();
    let done = cli(
        &cluster,
        &["--json", "lock", "jobs/free", "--json-file", result_arg, "--", "sh", "-c", "echo out; exit 2"],
    );
    assert_eq!(done.status.code(), Some(2), "{done:?}");
    assert_eq!(String::from_utf8_lossy(&done.stdout), "out\n");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    assert_eq!((&json["exit_code"], &json["lost"]), (&2.into(), &false.into()), "{json}");
    assert!(json["token"].as_u64().unwrap() > first["token"].as_u64().unwrap(), "{json}");
}

#[test]
fn two_guards_in_one_process_never_share_a_lock() {
    let cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);
    let first = client.acquire(b"jobs/shared", Duration::from_secs(30), Duration::ZERO).unwrap();
    // The same client (one owner) again: the server would answer with the
    // first guard's token; the client refuses instead, or waits.
    let again = client.acquire(b"jobs/shared", Duration::from_secs(30), Duration::ZERO).unwrap_err();
    assert!(
        matches!(again, ClientError::Held { holder_token: Some(token) } if token == first.token()),
        "{again:?}"
    );
    let waited =
        client.acquire(b"jobs/shared", Duration::from_secs(30), Duration::from_millis(200)).unwrap_err();
    assert!(matches!(waited, ClientError::WaitTimedOut { .. }), "{waited:?}");
    // Another thread waits for the first guard, and gets a lock of its own
    // once it is released: a new token, held alone.
    let second = {
        let client = client.clone();
        std::thread::spawn(move || client.acquire(b"jobs/shared", Duration::from_secs(30), DEADLINE))
    };
    std::thread::sleep(Duration::from_millis(300));
    let first_token = first.token();
    assert!(client.check(b"jobs/shared", first_token).unwrap(), "the waiting thread took the lock");
    assert!(first.release().unwrap());
    let second = second.join().unwrap().unwrap();
    assert!(second.token() > first_token, "{} after {first_token}", second.token());
    assert!(client.check(b"jobs/shared", second.token()).unwrap());
    assert!(!client.check(b"jobs/shared", first_token).unwrap());
    drop(second);
    // Dropping a guard lets the key go too.
    let third = client.acquire(b"jobs/shared", Duration::from_secs(30), DEADLINE).unwrap();
    assert!(client.check(b"jobs/shared", third.token()).unwrap());
}

#[test]
fn the_client_carries_on_after_kill_9_of_the_leader_and_the_node_catches_up() {
    let mut cluster = Cluster::start(3);
    let client = cluster.client();
    let leader = cluster.leader(&client);
    let mut last = 0;
    for i in 0..20 {
        let guard = client
            .acquire(format!("before/{i}").as_bytes(), Duration::from_secs(30), Duration::ZERO)
            .unwrap();
        assert!(guard.token() > last);
        last = guard.token();
        std::mem::forget(guard);
    }
    cluster.kill(leader);
    for i in 0..20 {
        let guard =
            client.acquire(format!("after/{i}").as_bytes(), Duration::from_secs(30), Duration::ZERO).unwrap();
        assert!(guard.token() > last, "token {} after {last}", guard.token());
        last = guard.token();
        std::mem::forget(guard);
    }
    cluster.launch(leader);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let new_leader = cluster.leader(&client);
        let leader_status = client.status(cluster.client_addr(new_leader)).unwrap();
        let restarted = client.status(cluster.client_addr(leader));
        if restarted
            .as_ref()
            .is_ok_and(|status| status.applied_index >= leader_status.commit_index && status.locks == 40)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted node did not catch up: {restarted:?} vs {leader_status:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `bytes` and reports whether the server closed the connection.
fn closes_after(addr: &str, bytes: &[u8]) -> bool {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(bytes).unwrap();
    let mut sink = Vec::new();
    match stream.read_to_end(&mut sink) {
        Ok(_) => true,
        Err(err) => {
            matches!(err.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe)
        }
    }
}

#[test]
fn garbage_and_huge_frames_close_only_that_connection() {
    let cluster = Cluster::start(3);
    let client = cluster.client();
    let leader = cluster.leader(&client);
    let garbage: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    let mut huge = vec![0xff, 0xff, 0xff, 0xf0];
    huge.extend_from_slice(&[1, 2, 3, 4]);
    let mut malformed = vec![0, 0, 0, 8];
    malformed.extend_from_slice(&[0xff; 8]);
    for id in 1..=3 {
        for bytes in [&garbage, &huge, &malformed] {
            assert!(
                closes_after(cluster.client_addr(id), bytes),
                "client port of node {id} kept the connection"
            );
            assert!(closes_after(cluster.peer_addr(id), bytes), "peer port of node {id} kept the connection");
        }
    }
    // Everything still serves, on the same leader.
    let guard = client.acquire(b"after-garbage", Duration::from_secs(5), Duration::ZERO).unwrap();
    assert!(client.check(b"after-garbage", guard.token()).unwrap());
    assert_eq!(cluster.leader(&client), leader);
}

#[test]
fn fencelock_lock_exports_the_token_and_stops_its_child_when_the_lock_is_lost() {
    let mut cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);
    let out = cluster.dir.path().join("child.out");

    // A child that exits by itself: its exit code passes through.
    let script = format!("echo \"$FENCELOCK_KEY $FENCELOCK_TOKEN\" > {}; exit 7", out.display());
    let done = cli(&cluster, &["lock", "jobs/cron", "--ttl", "2s", "--", "sh", "-c", &script]);
    assert_eq!(done.status.code(), Some(7), "{done:?}");
    let written = std::fs::read_to_string(&out).unwrap();
    let (key, token) = written.trim().split_once(' ').unwrap();
    assert_eq!(key, "jobs/cron");
    let token: u64 = token.parse().unwrap();
    assert!(!client.check(b"jobs/cron", token).unwrap(), "released when the child exited");

    // A child that would run for a minute, and a cluster that goes away.
    let pid_file = cluster.dir.path().join("child.pid");
    let grandchild_file = cluster.dir.path().join("grandchild.pid");
    let result = cluster.dir.path().join("result.json");
    // A shell and its child, as `sh -c` jobs are: the whole job must stop.
    let script =
        format!("echo $$ > {}; sleep 60 & echo $! > {}; wait", pid_file.display(), grandchild_file.display());
    let mut lock = Command::new(cli_binary())
        .arg("--endpoints")
        .arg(cluster.endpoints().join(","))
        .args(["lock", "jobs/long", "--ttl", "2s", "--grace", "1s", "--lost-exit-code", "76"])
        .arg("--json-file")
        .arg(&result)
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + DEADLINE;
    while !pid_file.exists() || std::fs::read_to_string(&pid_file).unwrap().trim().is_empty() {
        assert!(Instant::now() < deadline, "the child never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let child_pid = read_pid(&pid_file);
    let grandchild_pid = read_pid(&grandchild_file);
    for id in 1..=3 {
        cluster.kill(id);
    }
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = lock.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "fencelock lock did not notice the lost lock");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(76));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    assert_eq!((&json["exit_code"], &json["lost"]), (&76.into(), &true.into()), "{json}");
    // The child and its own child are gone.
    assert!(!alive(child_pid), "the child outlived the lock");
    wait_gone(grandchild_pid, "the grandchild outlived the lock");
}

/// The pid a job wrote to `file`, once it has.
fn read_pid(file: &std::path::Path) -> i32 {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Ok(pid) = std::fs::read_to_string(file).unwrap_or_default().trim().parse() {
            return pid;
        }
        assert!(Instant::now() < deadline, "no pid in {}", file.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` runs: it exists and is not a zombie (an orphan
/// that exited is reaped by init, or not at all in some containers).
fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // "PID (COMM) STATE ...": the state follows the last ')'.
    stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
}

fn wait_gone(pid: i32, what: &str) {
    let deadline = Instant::now() + DEADLINE;
    while alive(pid) {
        assert!(Instant::now() < deadline, "{what} (pid {pid})");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_job_is_stopped_whole_when_fencelock_is_killed_and_leaves_nothing_behind_when_it_ends() {
    let cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);

    // `fencelock lock` killed with SIGKILL: its watchdog stops the job,
    // the shell and the shell's child.
    let pid_file = cluster.dir.path().join("job.pid");
    let grandchild_file = cluster.dir.path().join("job-child.pid");
    let script =
        format!("echo $$ > {}; sleep 60 & echo $! > {}; wait", pid_file.display(), grandchild_file.display());
    let mut lock = Command::new(cli_binary())
        .args([
            "--endpoints",
            &cluster.endpoints().join(","),
            "lock",
            "jobs/k9",
            "--ttl",
            "30s",
            "--grace",
            "1s",
        ])
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let job = read_pid(&pid_file);
    let grandchild = read_pid(&grandchild_file);
    assert!(alive(job) && alive(grandchild));
    lock.kill().unwrap();
    lock.wait().unwrap();
    wait_gone(job, "the job outlived fencelock");
    wait_gone(grandchild, "the job's child outlived fencelock");

    // A job that leaves a process behind and exits: what it left is
    // stopped before the release, and its exit code passes on.
    let left_file = cluster.dir.path().join("left.pid");
    let script = format!("sleep 60 & echo $! > {}; exit 4", left_file.display());
    let done = cli(&cluster, &["lock", "jobs/left", "--ttl", "5s", "--", "sh", "-c", &script]);
    assert_eq!(done.status.code(), Some(4), "{done:?}");
    assert!(String::from_utf8_lossy(&done.stderr).contains("left processes in its group"), "{done:?}");
    wait_gone(read_pid(&left_file), "a process the job left outlived the lock");
    assert_eq!(client.get(b"jobs/left", true).unwrap(), None, "the lock was not released");
}

/// The state letter of process `pid` ("R", "S", "T" for stopped...), or
/// None once it is gone.
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next())
}

fn wait_stopped(pid: i32, what: &str) {
    let deadline = Instant::now() + DEADLINE;
    while state(pid) != Some('T') {
        assert!(Instant::now() < deadline, "{what} (pid {pid}) did not stop: {:?}", state(pid));
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).unwrap();
}

#[test]
fn fencelock_lock_stops_with_its_job_and_never_continues_it_without_the_lock() {
    use nix::sys::signal::Signal;
    let cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);
    let lock = |key: &str, ttl: &str, script: &str, json: &std::path::Path| {
        Command::new(cli_binary())
            .args(["--endpoints", &cluster.endpoints().join(","), "lock", key, "--ttl", ttl, "--grace", "1s"])
            .arg("--json-file")
            .arg(json)
            .args(["--", "sh", "-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };

    // SIGTSTP to fencelock (what a shell's `kill -TSTP` or a supervisor
    // sends): the job stops, then fencelock. Continued within the lease,
    // the job goes on under the lock and ends as it would have.
    let pid_file = cluster.dir.path().join("tstp.pid");
    let json = cluster.dir.path().join("tstp.json");
    let mut fencelock =
        lock("jobs/tstp", "30s", &format!("echo $$ > {}; sleep 2; exit 5", pid_file.display()), &json);
    let job = read_pid(&pid_file);
    signal(fencelock.id(), Signal::SIGTSTP);
    wait_stopped(job, "the job");
    wait_stopped(fencelock.id() as i32, "fencelock");
    assert_eq!(state(job), Some('T'), "the job ran on while fencelock was stopped");
    let token = client.get(b"jobs/tstp", true).unwrap().unwrap().token;
    signal(fencelock.id(), Signal::SIGCONT);
    let status = fencelock.wait().unwrap();
    assert_eq!(status.code(), Some(5), "{:?}", fencelock.stderr.take().map(std::io::read_to_string));
    let result: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!((&result["token"], &result["lost"]), (&token.into(), &false.into()), "{result}");
    assert!(!client.check(b"jobs/tstp", token).unwrap(), "released when the job ended");

    // Stopped past the lease: when fencelock is continued, the lock is
    // lost, and the job, still stopped, never runs again.
    let pid_file = cluster.dir.path().join("lapse.pid");
    let after = cluster.dir.path().join("lapse.after");
    let json = cluster.dir.path().join("lapse.json");
    let script = format!("echo $$ > {}; sleep 4; echo ran > {}", pid_file.display(), after.display());
    let mut fencelock = lock("jobs/lapse", "2s", &script, &json);
    let job = read_pid(&pid_file);
    let token = client.get(b"jobs/lapse", true).unwrap().unwrap().token;
    signal(fencelock.id(), Signal::SIGTSTP);
    wait_stopped(job, "the job");
    wait_stopped(fencelock.id() as i32, "fencelock");
    // The lease runs out on the cluster (and before that on fencelock's
    // clock: the client counts on less than the lease, from the send).
    let deadline = Instant::now() + DEADLINE;
    while client.check(b"jobs/lapse", token).unwrap() {
        assert!(Instant::now() < deadline, "the lock outlived its lease");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(state(job), Some('T'));
    signal(fencelock.id(), Signal::SIGCONT);
    let status = fencelock.wait().unwrap();
    let stderr = fencelock.stderr.take().map(std::io::read_to_string).unwrap().unwrap();
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("fencelock with it"), "{stderr}");
    let result: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(result["lost"], serde_json::Value::Bool(true), "{result}");
    wait_gone(job, "the job outlived its lost lock");
    assert!(!after.exists(), "the job ran on after its lock was lost");
}

/// Field `n` (1-based, as in proc(5)) of process `pid`'s stat line.
fn stat_field(pid: i32, n: usize) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(n - 3)?.parse().ok()
}

#[test]
fn in_a_terminal_ctrl_z_stops_the_job_and_fencelock_and_the_terminal_comes_back() {
    use nix::sys::signal::Signal;
    // `script` (util-linux) runs fencelock on a terminal of its own, its
    // stdin typed into it: fencelock hands the terminal to the job.
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: no `script` (util-linux) to make a terminal");
        return;
    }
    let cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);
    let pid_file = cluster.dir.path().join("tty.pid");
    let line = format!(
        "{} --endpoints {} lock jobs/tty --ttl 30s -- sh -c 'echo $$ > {}; sleep 2; exit 5'",
        cli_binary().display(),
        cluster.endpoints().join(","),
        pid_file.display()
    );
    let mut script = Command::new("script")
        .args(["-qfec", &line, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let job = read_pid(&pid_file);
    let fencelock = stat_field(job, 4).unwrap() as i32;
    let own_group = stat_field(fencelock, 5).unwrap();
    // The terminal's foreground group (tpgid) is the job's.
    let deadline = Instant::now() + DEADLINE;
    while stat_field(job, 8) != Some(i64::from(job)) {
        assert!(Instant::now() < deadline, "the job never got the terminal: {:?}", stat_field(job, 8));
        std::thread::sleep(Duration::from_millis(20));
    }
    // Ctrl-Z on the terminal reaches the job's group only.
    script.stdin.as_mut().unwrap().write_all(b"\x1a").unwrap();
    wait_stopped(job, "the job");
    wait_stopped(fencelock, "fencelock");
    assert_eq!(stat_field(fencelock, 8), Some(own_group), "the terminal was not given back");
    let token = client.get(b"jobs/tty", true).unwrap().unwrap().token;
    // `fg`: fencelock's group continued, with the terminal. (`script`
    // stops itself when its child stops, as a terminal's job: it too.)
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(own_group as i32), Signal::SIGCONT).unwrap();
    signal(script.id(), Signal::SIGCONT);
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = script.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the job did not finish once continued: {:?}", state(job));
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(5));
    assert!(!client.check(b"jobs/tty", token).unwrap(), "released when the job ended");
}

#[test]
fn a_node_whose_data_directory_was_lost_rejoins_without_a_vote_and_catches_up() {
    let mut cluster = Cluster::start(3);
    let client = cluster.client();
    let leader = cluster.leader(&client);
    let mut last = 0;
    for i in 0..10 {
        let guard =
            client.acquire(format!("k{i}").as_bytes(), Duration::from_secs(60), Duration::ZERO).unwrap();
        assert!(guard.token() > last);
        last = guard.token();
        std::mem::forget(guard);
    }
    let lost = leader % 3 + 1;
    let other = lost % 3 + 1;
    assert_ne!(other, leader);
    cluster.kill(lost);
    std::fs::remove_dir_all(cluster.data_dir(lost)).unwrap();
    cluster.launch(lost);

    // The peers know it: it rejoins, catches up, and says so.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let leader_status = client.status(cluster.client_addr(leader)).unwrap();
        let status = client.status(cluster.client_addr(lost));
        // The log is written by a thread of its own: the line may come a
        // moment after the status says so.
        let said = cluster.log(lost).contains("rejoined: caught up, voting again");
        if said
            && status.as_ref().is_ok_and(|status| {
                !status.rejoining && status.locks == 10 && status.applied_index >= leader_status.commit_index
            })
        {
            break;
        }
        assert!(Instant::now() < deadline, "the node did not catch up: {status:?}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = cluster.log(lost);
    assert!(log.contains("its data was lost"), "{log}");

    // It votes again: with the leader gone, it and the other node elect
    // one, which has every lock and issues only later tokens.
    cluster.kill(leader);
    for i in 0..10 {
        assert!(client.check(format!("k{i}").as_bytes(), last - 9 + i).unwrap(), "k{i} lost");
    }
    let next = client.acquire(b"after", Duration::from_secs(60), Duration::ZERO).unwrap();
    assert!(next.token() > last, "token {} after {last}", next.token());
    assert!([lost, other].contains(&cluster.leader(&client)));
}

#[test]
fn a_node_whose_data_was_lost_rejoins_an_idle_cluster_with_no_client_writes() {
    // Snapshots every 2 entries: it catches up from one. And it is the
    // leader that loses its data.
    let mut cluster = Cluster::configure(3);
    for node in &mut cluster.nodes {
        node.extra_args = vec!["--snapshot-interval-entries".into(), "2".into()];
    }
    for id in 1..=3 {
        cluster.launch(id);
    }
    let client = cluster.client();
    let leader = cluster.leader(&client);
    // Raw grants: nothing renews them, so no client writes after this.
    for i in 0..5 {
        client.acquire_raw(b"idle-owner", format!("k{i}"), Duration::from_secs(600), Duration::ZERO).unwrap();
    }
    // First the leader loses its data, then a follower.
    let follower = leader % 3 + 1;
    for lost in [leader, follower] {
        cluster.kill(lost);
        std::fs::remove_dir_all(cluster.data_dir(lost)).unwrap();
        cluster.launch(lost);
        let deadline = Instant::now() + DEADLINE;
        loop {
            let status = client.status(cluster.client_addr(lost));
            if status.as_ref().is_ok_and(|status| !status.rejoining && status.locks == 5) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {lost} did not rejoin an idle cluster: {status:?}\n{}",
                cluster.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = cluster.log(lost);
        assert!(log.contains("its data was lost"), "{log}");
        let warnings = log.lines().filter(|line| line.contains("WARN")).count();
        assert!(warnings < 20, "{warnings} warnings while rejoining:\n{log}");
    }
}

#[test]
fn metrics_are_served_over_http_and_follow_the_locks() {
    let mut cluster = Cluster::configure(1);
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    cluster.nodes[0].extra_args = vec!["--metrics-addr".into(), metrics_addr.clone()];
    cluster.launch(1);
    let client = cluster.client();
    cluster.leader(&client);
    let guard = client.acquire(b"metered", Duration::from_secs(30), Duration::ZERO).unwrap();
    let scrape = http(&metrics_addr, b"GET /metrics HTTP/1.1\r\nHost: fencelock\r\n\r\n");
    assert!(scrape.starts_with("HTTP/1.1 200 OK"), "{scrape}");
    let label = "{node_id=\"1\"}";
    assert_eq!(sample(&scrape, &format!("fencelock_up{label}")), Some(1.0), "{scrape}");
    assert_eq!(sample(&scrape, &format!("fencelock_is_leader{label}")), Some(1.0));
    assert_eq!(sample(&scrape, &format!("fencelock_rejoining{label}")), Some(0.0));
    assert_eq!(sample(&scrape, &format!("fencelock_locks{label}")), Some(1.0));
    assert_eq!(sample(&scrape, &format!("fencelock_last_token{label}")), Some(guard.token() as f64));
    assert!(sample(&scrape, &format!("fencelock_grants_total{label}")) >= Some(1.0));
    // raft-engine's own: how long its fsyncs take.
    assert!(sample(&scrape, "raft_engine_sync_log_duration_seconds_count") >= Some(1.0), "{scrape}");

    // Nonsense on the metrics port is answered and changes nothing.
    assert!(http(&metrics_addr, b"\x16\x03\x01 hello\r\n\r\n").starts_with("HTTP/1.1 400"));
    assert!(http(&metrics_addr, b"GET /admin HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    guard.release().unwrap();
    let scrape = http(&metrics_addr, b"GET /metrics HTTP/1.0\r\n\r\n");
    assert_eq!(sample(&scrape, &format!("fencelock_locks{label}")), Some(0.0));
    assert!(sample(&scrape, &format!("fencelock_releases_total{label}")) >= Some(1.0));
}

#[test]
fn sigterm_stops_a_node_cleanly_and_the_rest_serve_on() {
    let mut cluster = Cluster::start(3);
    let client = cluster.client();
    let leader = cluster.leader(&client);
    let guard = client.acquire(b"before-stop", Duration::from_secs(30), Duration::ZERO).unwrap();
    let mut child = cluster.nodes[(leader - 1) as usize].child.take().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "SIGTERM did not stop the node: {}", cluster.logs());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}: {}", cluster.logs());
    assert!(client.check(b"before-stop", guard.token()).unwrap(), "the lock survived its leader's shutdown");
    let next = client.acquire(b"after-stop", Duration::from_secs(30), Duration::ZERO).unwrap();
    assert!(next.token() > guard.token());
    cluster.launch(leader);
}

#[test]
fn a_bad_configuration_is_refused_with_exit_code_1_and_config_check_passes_a_good_one() {
    let run = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_fencelockd")).args(args).output().unwrap();
    let bad = run(&["--peers", "1=not-an-address", "--config-check"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("HOST:PORT"), "{bad:?}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fencelock.toml");
    std::fs::write(&file, "tick_ms = \"fast\"\n").unwrap();
    let garbage = run(&["--config", file.to_str().unwrap(), "--config-check"]);
    assert_eq!(garbage.status.code(), Some(1), "{garbage:?}");
    let good = run(&["--id", "2", "--peers", "1=127.0.0.1:7001,2=127.0.0.1:7002", "--config-check"]);
    assert!(good.status.success(), "{good:?}");
    // It prints the whole configuration, every default included, as a file
    // that --config takes; settings come from the environment too, and
    // durations take units.
    let printed = Command::new(env!("CARGO_BIN_EXE_fencelockd"))
        .args(["--id", "2", "--peers", "1=127.0.0.1:7001,2=127.0.0.1:7002", "--config-check"])
        .env("FENCELOCKD_ELECTION_MS", "250ms")
        .env("FENCELOCKD_MAX_LOCKS", "5000")
        .output()
        .unwrap();
    assert!(printed.status.success(), "{printed:?}");
    let text = String::from_utf8_lossy(&printed.stdout).into_owned();
    assert!(text.starts_with("# configuration ok: node 2 of 2"), "{text}");
    for line in
        ["election_ms = \"250ms\"", "max_locks = 5000", "lease_max_ms = \"24h\"", "max_connections = 4096"]
    {
        assert!(text.lines().any(|printed| printed == line), "{line} missing:\n{text}");
    }
    std::fs::write(&file, &text).unwrap();
    let again = run(&["--config", file.to_str().unwrap(), "--config-check"]);
    assert!(again.status.success(), "{again:?}");
    assert_eq!(String::from_utf8_lossy(&again.stdout), text);
    // A flag wins over the environment.
    let flagged = Command::new(env!("CARGO_BIN_EXE_fencelockd"))
        .args(["--max-locks", "6000", "--config-check"])
        .env("FENCELOCKD_MAX_LOCKS", "5000")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&flagged.stdout).lines().any(|line| line == "max_locks = 6000"),
        "{flagged:?}"
    );
    // --help shows the defaults.
    let help = run(&["--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("[default: 500ms]") && help.contains("[env: FENCELOCKD_PEERS="), "{help}");
    // Plain TCP beyond loopback needs --insecure.
    let exposed = run(&[
        "--client-addr",
        "0.0.0.0:7101",
        "--advertise-client-addr",
        "127.0.0.1:7101",
        "--config-check",
    ]);
    assert_eq!(exposed.status.code(), Some(1), "{exposed:?}");
    assert!(String::from_utf8_lossy(&exposed.stderr).contains("--insecure"), "{exposed:?}");
    // ... and an address to hand out in leader hints, which 0.0.0.0 is not.
    let unadvertised = run(&["--client-addr", "0.0.0.0:7101", "--insecure", "--config-check"]);
    assert_eq!(unadvertised.status.code(), Some(1), "{unadvertised:?}");
    assert!(
        String::from_utf8_lossy(&unadvertised.stderr).contains("--advertise-client-addr"),
        "{unadvertised:?}"
    );
    let insecure = run(&[
        "--client-addr",
        "0.0.0.0:7101",
        "--insecure",
        "--advertise-client-addr",
        "127.0.0.1:7101",
        "--config-check",
    ]);
    assert!(insecure.status.success(), "{insecure:?}");
}

#[test]
fn test_ports_are_never_handed_out_twice_and_lie_outside_the_ephemeral_range() {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let ephemeral: Vec<u16> = range.split_whitespace().filter_map(|number| number.parse().ok()).collect();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let port = free_port();
        assert!(seen.insert(port), "port {port} handed out twice");
        if let [min, max] = ephemeral[..] {
            assert!(!(min..=max).contains(&port), "port {port} lies in the ephemeral range {min}-{max}");
        }
    }
}

#[test]
fn the_open_file_limit_is_raised_for_the_connection_caps_or_the_start_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fencelockd = env!("CARGO_BIN_EXE_fencelockd");
    let start = |limits: &str, max_connections: u32, log: &std::path::Path| {
        let script = format!(
            "{limits} && exec {fencelockd} --max-connections {max_connections} --data-dir {} \
             --client-addr 127.0.0.1:{} --peers 1=127.0.0.1:{}",
            dir.path().join("data").display(),
            free_port(),
            free_port()
        );
        Command::new("bash")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap()
    };
    // A hard limit below what the caps need: refused at start, saying why.
    let log = dir.path().join("refused.log");
    let status = start("ulimit -n 2048", 8_000, &log).wait().unwrap();
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains("hard open-file limit is 2048"), "{said}");

    // A low soft limit under a high enough hard one: raised, and it serves.
    let log = dir.path().join("raised.log");
    let mut child = start("ulimit -Sn 256 && ulimit -Hn 4096", 1_000, &log);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        if said.contains("fencelockd serving") {
            assert!(said.contains("raised the open-file limit"), "{said}");
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "fencelockd stopped: {said}");
        assert!(Instant::now() < deadline, "fencelockd never served: {said}");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}
