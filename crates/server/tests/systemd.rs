//! fencelockd under systemd's `Type=notify` (deploy/systemd): with
//! `$NOTIFY_SOCKET` set, it says `READY=1` once it serves (a leader known,
//! caught up), `STATUS=` lines about what it waits for before that, and
//! `STOPPING=1` on SIGTERM. The socket here is the test's own datagram
//! socket, as systemd's would be.

// Test code: unwrapping is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, DEADLINE};

/// Every datagram received until `until` says true of what came so far, or
/// the deadline.
fn receive_until(socket: &UnixDatagram, until: impl Fn(&[String]) -> bool) -> Vec<String> {
    let mut got = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    let mut buffer = [0u8; 4096];
    while !until(&got) && Instant::now() < deadline {
        if let Ok(n) = socket.recv(&mut buffer) {
            got.push(String::from_utf8_lossy(&buffer[..n]).into_owned());
        }
    }
    got
}

#[test]
fn a_node_tells_systemd_when_it_serves_and_when_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let peer = format!("127.0.0.1:{}", free_port());
    let client = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.path().join("node.log")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fencelockd"))
        .args(["--id", "1", "--peers", &format!("1={peer}"), "--client-addr", &client])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--tick-ms", "20", "--election-ms", "200", "--heartbeat-ms", "40", "--lease-min-ms", "1000"])
        .env("NOTIFY_SOCKET", &path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let got = receive_until(&socket, |got| got.iter().any(|message| message.contains("READY=1")));
    let logs = || std::fs::read_to_string(dir.path().join("node.log")).unwrap_or_default();
    assert!(got.iter().any(|message| message.contains("READY=1")), "never ready: {got:?}\n{}", logs());
    // Alone in its --peers, it listened for a running cluster first, and
    // said so.
    assert!(
        got.iter().any(|message| message.contains("STATUS=not ready: starting")),
        "no status while it waited: {got:?}"
    );
    assert!(got.iter().any(|message| message.contains("STATUS=serving")), "{got:?}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let got = receive_until(&socket, |got| got.iter().any(|message| message.contains("STOPPING=1")));
    assert!(got.iter().any(|message| message.contains("STOPPING=1")), "{got:?}\n{}", logs());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", logs());
}
