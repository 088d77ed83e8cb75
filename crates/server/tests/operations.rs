//! docs/operations.md's membership and maintenance workflows, run over TLS
//! as an operator runs them: real `fencelockd` processes started from their
//! TOML files, and from the start command `fencelock member add` prints;
//! the real `fencelock` CLI as the admin `ops`; certificates from `fencelock
//! cert`, each node's machine holding only `ca.crt` and its own pair.
//!
//! One cluster goes through, in order: grow 3 → 5 ("Grow the cluster"),
//! shrink 5 → 3 ("Shrink the cluster"), replace a dead node by one with a
//! new id and replace a dead node's disk keeping its id ("Replace a node"),
//! a rolling restart and a rolling upgrade ("Rolling upgrade"). Membership is
//! checked with `fencelock --json member list` between the steps.
//!
//! Throughout, two workers of the user `alice` (a rule gives her `jobs/`)
//! take turns on three keys, and each step is crossed by a lock taken
//! before it. At the end: tokens increase in real time across every client
//! and step, no two grants of one key overlap, and every lock held across a
//! step is still held.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{cli_binary, free_port, DEADLINE};
use fencelock_client::{Client, ClientConfig, ClientError, TlsConfig};
use serde_json::Value;

/// What every node's file holds: the timings (fast, so that elections are
/// quick), the admins and the rules. `[[rules]]` last: the keys of each
/// node's own come before it.
const SHARED: &str = r#"tick_ms = 20
election_ms = 200
heartbeat_ms = 40
lease_min_ms = 1000
snapshot_interval_entries = 50
admins = ["ops"]

[[rules]]
users = ["alice"]
prefixes = ["jobs/"]
rights = ["lock", "read"]
"#;

/// The lease of the workers' locks, and how long they wait in a key's queue.
const WORKER_LEASE: Duration = Duration::from_secs(3);
const WORKER_WAIT: Duration = Duration::from_secs(2);
/// The lease of a lock held across a step: longer than the whole test.
const HELD_LEASE: Duration = Duration::from_secs(600);

/// One node's machine: its addresses, files and process.
struct Node {
    id: u64,
    peer: String,
    client: String,
    metrics: String,
    /// The node's certificates directory: `ca.crt` and its own pair only.
    certs: PathBuf,
    data: PathBuf,
    config: PathBuf,
    log: PathBuf,
    /// The command line after `fencelockd`, as the operator runs it.
    args: Vec<String>,
    child: Option<Child>,
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The operator's view: the certificates (`ca.key` included) on their own
/// machine, the installed binary, and every node.
struct Ops {
    dir: tempfile::TempDir,
    /// Where `fencelockd` is installed, as `/usr/local/bin/fencelockd`.
    bin: PathBuf,
    /// The operator's certificates directory: the CA, every node's pair,
    /// `ops` and `alice`.
    certs: PathBuf,
    nodes: BTreeMap<u64, Node>,
    /// The members as the operator knows them: their client addresses are
    /// the CLI's endpoints.
    members: Vec<u64>,
}

impl Ops {
    /// Installs the binary, makes the CA and the users' certificates, and
    /// lays out nodes 1 to `ids` (addresses, directories), none started.
    fn new(ids: u64) -> Ops {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let bin = dir.path().join("bin").join("fencelockd");
        let certs = dir.path().join("certs");
        let mut ops = Ops { dir, bin, certs, nodes: BTreeMap::new(), members: Vec::new() };
        ops.install();
        let certs = ops.certs.display().to_string();
        ops.cli_ok(&["cert", "create-ca", "--certs-dir", &certs, "--cluster", "prod"]);
        for user in ["ops", "alice"] {
            ops.cli_ok(&["cert", "create-client", "--certs-dir", &certs, user]);
        }
        for id in 1..=ids {
            let machine = ops.dir.path().join(format!("machine-{id}"));
            let addr = || format!("127.0.0.1:{}", free_port());
            let node = Node {
                id,
                peer: addr(),
                client: addr(),
                metrics: addr(),
                certs: machine.join("certs"),
                data: machine.join("data"),
                config: machine.join(format!("node-{id}.toml")),
                log: ops.dir.path().join(format!("node-{id}.log")),
                args: Vec::new(),
                child: None,
            };
            ops.nodes.insert(id, node);
        }
        ops
    }

    fn node(&self, id: u64) -> &Node {
        self.nodes.get(&id).unwrap_or_else(|| panic!("no node {id} in the layout"))
    }

    fn node_mut(&mut self, id: u64) -> &mut Node {
        self.nodes.get_mut(&id).unwrap_or_else(|| panic!("no node {id} in the layout"))
    }

    /// `install -m 0755 fencelockd /usr/local/bin/fencelockd`: the build,
    /// copied beside and renamed into place, so that running nodes keep the
    /// file they run.
    fn install(&self) {
        let bin_dir = self.bin.parent().expect("the binary's directory");
        std::fs::create_dir_all(bin_dir).expect("create the bin directory");
        let staged = bin_dir.join(".fencelockd.new");
        std::fs::copy(env!("CARGO_BIN_EXE_fencelockd"), &staged).expect("copy fencelockd");
        std::fs::set_permissions(&staged, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod fencelockd");
        std::fs::rename(&staged, &self.bin).expect("install fencelockd");
    }

    /// The `fencelock` CLI with `args`, none of the operator's environment.
    fn cli(&self, args: &[&str]) -> Output {
        Command::new(cli_binary())
            .args(args)
            .env_remove("FENCELOCK_ENDPOINTS")
            .env_remove("FENCELOCK_CERTS_DIR")
            .env_remove("FENCELOCK_USER")
            .env_remove("FENCELOCK_OWNER")
            .stdin(Stdio::null())
            .output()
            .expect("run fencelock")
    }

    fn cli_ok(&self, args: &[&str]) -> Output {
        let out = self.cli(args);
        assert!(out.status.success(), "fencelock {args:?} failed: {}", shown(&out));
        out
    }

    /// The members' client addresses: `FENCELOCK_ENDPOINTS`.
    fn endpoints(&self) -> String {
        self.members.iter().map(|id| self.node(*id).client.clone()).collect::<Vec<_>>().join(",")
    }

    /// `fencelock` as the admin `ops`, at the members.
    fn admin(&self, args: &[&str]) -> Output {
        let (endpoints, certs) = (self.endpoints(), self.certs.display().to_string());
        let base = ["--endpoints", &endpoints, "--certs-dir", &certs, "--user", "ops"];
        self.cli(&[&base[..], args].concat())
    }

    /// The last lines of every node's log, for a failure message.
    fn logs(&self) -> String {
        let mut text = String::from("server logs:");
        for node in self.nodes.values() {
            let log = std::fs::read_to_string(&node.log).unwrap_or_default();
            if log.is_empty() {
                continue;
            }
            let lines: Vec<&str> = log.lines().collect();
            text.push_str(&format!("\n--- node {} ({})", node.id, node.log.display()));
            for line in &lines[lines.len().saturating_sub(20)..] {
                text.push_str("\n  ");
                text.push_str(line);
            }
        }
        text
    }

    fn log(&self, id: u64) -> String {
        std::fs::read_to_string(&self.node(id).log).unwrap_or_default()
    }

    /// Polls `probe` until it answers, up to [`DEADLINE`]; fails with its
    /// last complaint and the logs.
    fn wait_until<T>(&self, what: &str, mut probe: impl FnMut() -> Result<T, String>) -> T {
        let deadline = Instant::now() + DEADLINE;
        loop {
            match probe() {
                Ok(value) => return value,
                Err(last) => {
                    assert!(Instant::now() < deadline, "{what}: never; last: {last}\n{}", self.logs())
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Copies to node `id`'s machine `ca.crt`, `node-N.crt` and `node-N.key`
    /// (README's secure section, docs/operations.md "TLS"): no `ca.key`, no
    /// user's key.
    fn copy_node_certs(&self, id: u64) {
        let to = &self.node(id).certs;
        std::fs::create_dir_all(to).expect("create the node's certificates directory");
        for file in ["ca.crt".to_owned(), format!("node-{id}.crt"), format!("node-{id}.key")] {
            std::fs::copy(self.certs.join(&file), to.join(&file))
                .unwrap_or_else(|err| panic!("copy {file} to node {id}: {err}"));
        }
    }

    fn create_node_cert(&self, id: u64) {
        let certs = self.certs.display().to_string();
        let id = id.to_string();
        self.cli_ok(&["cert", "create-node", "--certs-dir", &certs, "--id", &id, "127.0.0.1", "localhost"]);
    }

    /// A founder's whole file, as "Configure" has it (everything in it, the
    /// command line just `--config`).
    fn write_founder_config(&self, id: u64, founders: &[u64], state: &str) {
        let node = self.node(id);
        let peers: Vec<String> =
            founders.iter().map(|founder| format!("{founder}={}", self.node(*founder).peer)).collect();
        let text = format!(
            "id = {id}\npeers = \"{}\"\nclient_addr = \"{}\"\nmetrics_addr = \"{}\"\ndata_dir = \"{}\"\n\
             certs_dir = \"{}\"\ninitial_cluster_state = \"{state}\"\n{SHARED}",
            peers.join(","),
            node.client,
            node.metrics,
            node.data.display(),
            node.certs.display(),
        );
        std::fs::write(&node.config, text).expect("write a founder's file");
    }

    /// Starts node `id`'s process with its command line, stdout and stderr
    /// appended to its log.
    fn start(&mut self, id: u64) {
        let bin = self.bin.clone();
        let node = self.node_mut(id);
        assert!(node.child.is_none(), "node {id} runs already");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .unwrap_or_else(|err| panic!("open {}: {err}", node.log.display()));
        let out = log.try_clone().expect("clone the log's handle");
        let child = Command::new(bin)
            .args(&node.args)
            // --join calls as FENCELOCK_USER when set: the node must call
            // as itself.
            .env_remove("FENCELOCK_USER")
            .env_remove("FENCELOCK_CERTS_DIR")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| panic!("start node {id}: {err}"));
        node.child = Some(child);
    }

    /// Waits for node `id`'s process to exit on its own, and reaps it.
    fn wait_exit(&mut self, id: u64, why: &str) -> ExitStatus {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let node = self.node_mut(id);
            let child = node.child.as_mut().unwrap_or_else(|| panic!("node {id} is not running"));
            if let Some(status) = child.try_wait().unwrap_or_else(|err| panic!("wait for node {id}: {err}")) {
                node.child = None;
                return status;
            }
            assert!(Instant::now() < deadline, "node {id} did not exit ({why})\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, as `systemctl stop`.
    fn terminate(&self, id: u64) {
        let child = self.node(id).child.as_ref().unwrap_or_else(|| panic!("node {id} is not running"));
        let pid = i32::try_from(child.id()).expect("a process id fits an i32");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM)
            .unwrap_or_else(|err| panic!("SIGTERM to node {id}: {err}"));
    }

    /// The machine dies: kill -9.
    fn kill(&mut self, id: u64) {
        let mut child = self.node_mut(id).child.take().unwrap_or_else(|| panic!("node {id} is not running"));
        child.kill().unwrap_or_else(|err| panic!("kill node {id}: {err}"));
        child.wait().unwrap_or_else(|err| panic!("reap node {id}: {err}"));
    }

    /// `fencelock --json member list`: (id, role) of each member.
    fn member_list(&self) -> Result<Vec<(u64, String)>, String> {
        let out = self.admin(&["--json", "member", "list"]);
        if !out.status.success() {
            return Err(shown(&out));
        }
        let json: Value =
            serde_json::from_slice(&out.stdout).map_err(|err| format!("{err}: {}", shown(&out)))?;
        let members = json["members"].as_array().ok_or_else(|| format!("no members: {json}"))?;
        members
            .iter()
            .map(|member| match (member["id"].as_u64(), member["role"].as_str()) {
                (Some(id), Some(role)) => Ok((id, role.to_owned())),
                _ => Err(format!("a member without id or role: {json}")),
            })
            .collect()
    }

    /// Waits until the members are exactly `voters`, every one a voter.
    fn wait_for_voters(&self, step: &str, voters: &[u64]) {
        let expected: Vec<(u64, String)> = voters.iter().map(|id| (*id, "voter".to_owned())).collect();
        self.wait_until(&format!("{step}: members {voters:?}, all voters"), || {
            let listed = self.member_list()?;
            if listed == expected {
                Ok(())
            } else {
                Err(format!("{listed:?}"))
            }
        });
    }

    /// `fencelock --json status` at the members: exits 0 (a leader and a
    /// quorum), every member reachable, and every one answers with that
    /// leader, not starting nor rejoining, applied = commit. The leader.
    fn whole(&self) -> Result<u64, String> {
        let out = self.admin(&["--json", "status"]);
        if !out.status.success() {
            return Err(shown(&out));
        }
        let json: Value =
            serde_json::from_slice(&out.stdout).map_err(|err| format!("{err}: {}", shown(&out)))?;
        let summary = &json["summary"];
        let leader = summary["leader"].as_u64().ok_or_else(|| format!("no leader: {json}"))?;
        let count = Some(self.members.len() as u64);
        if summary["quorum"] != true
            || summary["reachable"].as_u64() != count
            || summary["members"].as_u64() != count
        {
            return Err(format!("not whole: {summary}"));
        }
        for node in json["nodes"].as_array().ok_or_else(|| format!("no nodes: {json}"))? {
            let caught_up = node["applied_index"].as_u64().is_some()
                && node["applied_index"] == node["commit_index"]
                && node["leader_id"].as_u64() == Some(leader)
                && node["rejoining"] == false
                && node["starting"] == false;
            if !caught_up {
                return Err(format!("a node is not caught up with leader {leader}: {node}"));
            }
        }
        Ok(leader)
    }

    /// `curl -fsS http://METRICS/ready`.
    fn ready(&self, id: u64) -> Result<(), String> {
        let answer = http_get(&self.node(id).metrics, "/ready")?;
        if answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200") {
            Ok(())
        } else {
            Err(answer)
        }
    }

    /// A new node's machine, made ready as "Grow the cluster" says: its
    /// certificate made on the operator's machine, `ca.crt` and its pair
    /// copied over, and the cluster's file with its own id, peers and
    /// addresses.
    fn prepare(&self, id: u64) {
        self.create_node_cert(id);
        self.copy_node_certs(id);
        let node = self.node(id);
        let text = format!(
            "id = {id}\npeers = \"{id}={}\"\nclient_addr = \"{}\"\nmetrics_addr = \"{}\"\n\
             initial_cluster_state = \"existing\"\n{SHARED}",
            node.peer, node.client, node.metrics
        );
        std::fs::write(&node.config, text).expect("write the joining node's file");
    }

    /// What the operator adds to a printed start command on node `id`'s
    /// machine: `--data-dir`, `--certs-dir` and `--config`.
    fn machine_flags(&self, id: u64) -> Vec<String> {
        let node = self.node(id);
        [("--data-dir", &node.data), ("--certs-dir", &node.certs), ("--config", &node.config)]
            .into_iter()
            .flat_map(|(flag, value)| [flag.to_owned(), value.display().to_string()])
            .collect()
    }

    /// "Grow the cluster", once node `id`'s machine is prepared: `member
    /// add` on the operator's machine, then on node `id`'s the printed
    /// start command with `--data-dir`, `--certs-dir` and `--config`. With
    /// `json`, the command is taken from `member add --json`'s
    /// `start.command`.
    fn grow(&mut self, id: u64, json: bool) {
        let voters: Vec<String> =
            self.members.iter().map(|member| self.node(*member).client.clone()).collect();
        let (peer, client) = (self.node(id).peer.clone(), self.node(id).client.clone());
        let id_text = id.to_string();
        let mut args = vec!["member", "add", &id_text, &peer, &client];
        if json {
            args.insert(0, "--json");
        }
        let added = self.admin(&args);
        assert!(added.status.success(), "member add {id}: {}\n{}", shown(&added), self.logs());
        let stdout = String::from_utf8_lossy(&added.stdout).into_owned();
        let command = if json {
            let answer: Value = serde_json::from_str(&stdout)
                .unwrap_or_else(|err| panic!("member add --json: {err}: {stdout}"));
            let start = &answer["start"];
            assert_eq!(start["id"].as_u64(), Some(id), "{answer}");
            let join: Vec<&str> = start["join"]
                .as_array()
                .unwrap_or_else(|| panic!("no start.join: {answer}"))
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let command = start["command"].as_str().unwrap_or_else(|| panic!("no start.command: {answer}"));
            assert!(command.ends_with(&format!("--join {}", join.join(","))), "{answer}");
            command.to_owned()
        } else {
            let tls_line = format!("--certs-dir holding ca.crt, node-{id}.crt and node-{id}.key");
            assert!(
                stdout.contains(&tls_line),
                "member add does not say what the node needs under TLS:\n{stdout}"
            );
            assert!(stdout.contains("--config"), "member add does not name the config file:\n{stdout}");
            stdout
                .lines()
                .map(str::trim)
                .find(|line| line.starts_with("fencelockd "))
                .unwrap_or_else(|| panic!("member add printed no start command:\n{stdout}"))
                .to_owned()
        };
        let words: Vec<String> = command.split_whitespace().map(str::to_owned).collect();
        assert_eq!(words.first().map(String::as_str), Some("fencelockd"), "{command}");
        assert!(command.contains(&format!("--peers {id}={peer}")), "{command}");
        assert!(command.contains(&format!("--client-addr {client}")), "{command}");
        let join_at =
            words.iter().position(|word| word == "--join").unwrap_or_else(|| panic!("no --join: {command}"));
        let join = words.get(join_at + 1).unwrap_or_else(|| panic!("--join without endpoints: {command}"));
        for voter in &voters {
            assert!(
                join.split(',').any(|endpoint| endpoint == voter),
                "--join misses voter {voter}: {command}"
            );
        }

        let mut run = words[1..].to_vec();
        run.extend(self.machine_flags(id));
        self.node_mut(id).args = run;
        self.start(id);
        self.members.push(id);
    }

    /// "Shrink the cluster": `member remove`, the removed node exits 3 and
    /// says why, its data directory is deleted; then `fencelock status`
    /// shows a quorum.
    fn shrink(&mut self, id: u64) {
        let removed = self.admin(&["member", "remove", &id.to_string()]);
        assert!(removed.status.success(), "member remove {id}: {}\n{}", shown(&removed), self.logs());
        self.members.retain(|member| *member != id);
        let status = self.wait_exit(id, "removed from the cluster");
        assert_eq!(status.code(), Some(3), "removed node {id} exited with {status}\n{}", self.logs());
        let log = self.log(id);
        assert!(log.contains("this node was removed from the cluster"), "node {id}'s log:\n{log}");
        // "Started again on its data directory, it stops the same way."
        self.start(id);
        let again = self.wait_exit(id, "started again after its removal");
        assert_eq!(
            again.code(),
            Some(3),
            "removed node {id} started again exited with {again}\n{}",
            self.logs()
        );
        std::fs::remove_dir_all(&self.node(id).data).expect("delete the removed node's data directory");
        self.wait_until(&format!("status with a quorum after removing node {id}"), || self.whole());
    }

    /// A rolling restart ("Rolling upgrade"): one node at a time, followers
    /// first and the leader last; before each, `fencelock status` whole;
    /// SIGTERM, exit 0 (a leader hands over first); with `upgrade`, the
    /// binary installed again; started; `/ready` on its metrics port, then
    /// `fencelock status` whole again.
    fn rolling(&mut self, step: &str, upgrade: bool, locker: &Locker) -> Vec<u64> {
        let mut left = self.members.clone();
        let mut order = Vec::new();
        while !left.is_empty() {
            let leader =
                self.wait_until(&format!("{step}: the cluster whole before the next node"), || self.whole());
            let id = left.iter().copied().find(|id| *id != leader).unwrap_or(leader);
            left.retain(|other| *other != id);
            order.push(id);
            let handed_over = self.log(id).matches("leadership handed over").count();
            self.terminate(id);
            let status = self.wait_exit(id, "SIGTERM");
            assert!(status.success(), "{step}: node {id} exited with {status} on SIGTERM\n{}", self.logs());
            if id == leader {
                let log = self.log(id);
                assert!(
                    log.matches("leadership handed over").count() > handed_over,
                    "{step}: leader {id} did not hand over on SIGTERM:\n{log}"
                );
            }
            if upgrade {
                self.install();
            }
            self.start(id);
            self.wait_until(&format!("{step}: node {id} /ready"), || self.ready(id));
            self.wait_until(&format!("{step}: the cluster whole after node {id}"), || self.whole());
            locker.wait_for(5, self);
        }
        order
    }
}

/// Stdout and stderr of a CLI run, for a message.
fn shown(out: &Output) -> String {
    format!(
        "exit {:?}, stdout: {} stderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

/// The whole answer to `GET path` on a plain HTTP port.
fn http_get(addr: &str, path: &str) -> Result<String, String> {
    let mut stream = std::net::TcpStream::connect(addr).map_err(|err| format!("connect to {addr}: {err}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(|err| err.to_string())?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: fencelock\r\n\r\n").as_bytes())
        .map_err(|err| format!("send to {addr}: {err}"))?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(|err| format!("read from {addr}: {err}"))?;
    Ok(answer)
}

/// An acknowledged grant, as its client saw it.
#[derive(Clone, Debug)]
struct Grant {
    who: String,
    key: String,
    token: u64,
    /// The acquire answered that this owner held the key already (a retry
    /// of an acquire whose answer was lost).
    existing: bool,
    sent: Instant,
    acked: Instant,
    lease: Duration,
    /// When its holder let go: sent the release (whatever the answer: one
    /// lost in a leader change may have applied all the same). `None`: held
    /// until its lease runs out.
    released: Option<Instant>,
    /// What the release was answered, for a failure message.
    release_answer: String,
}

impl Grant {
    /// For a failure message.
    fn show(&self) -> String {
        format!(
            "{} on {}: token {}{}, acknowledged {:?} after it was asked for, release {}",
            self.who,
            self.key,
            self.token,
            if self.existing { " (held already)" } else { "" },
            self.acked.duration_since(self.sent),
            self.release_answer
        )
    }

    /// The last moment its holder may count the lock as held: when it let
    /// go, or the end of the lease from the acquire's send as the client
    /// counts it (`lease × (1 − ρ) / (1 + ρ)`, ρ = 1 %, docs/leases.md),
    /// whichever comes first.
    fn held_until(&self) -> Instant {
        let lease_end = self.sent + self.lease.mul_f64(0.98);
        self.released.map_or(lease_end, |released| released.min(lease_end))
    }
}

/// A TLS client of `alice`'s at every address a member ever has.
fn alice(certs: &Path, endpoints: Vec<String>, owner: &str) -> Client {
    let mut config = ClientConfig::new(endpoints);
    config.request_timeout = Duration::from_secs(2);
    config.retry_for = Duration::from_secs(10);
    config.owner = Some(owner.as_bytes().to_vec());
    config.tls = Some(TlsConfig { certs_dir: certs.to_owned(), user: "alice".into() });
    Client::connect(config).expect("a client for alice")
}

/// Two workers of alice's taking turns on three keys: acquire (waiting in
/// the key's queue), hold briefly, release. Every acknowledged grant is
/// recorded.
struct Locker {
    stop: Arc<AtomicBool>,
    grants: Arc<Mutex<Vec<Grant>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Locker {
    fn start(certs: &Path, endpoints: &[String]) -> Locker {
        let stop = Arc::new(AtomicBool::new(false));
        let grants = Arc::new(Mutex::new(Vec::new()));
        let threads = (1..=2)
            .map(|worker| {
                let (stop, grants) = (Arc::clone(&stop), Arc::clone(&grants));
                let owner = format!("alice/worker-{worker}");
                let client = alice(certs, endpoints.to_vec(), &owner);
                std::thread::spawn(move || {
                    let mut n = worker;
                    while !stop.load(Ordering::SeqCst) {
                        n += 1;
                        let key = format!("jobs/shared/{}", n % 3);
                        let sent = Instant::now();
                        // A refused or failed acquire is tried again later:
                        // only acknowledged grants are promised.
                        if let Ok(grant) =
                            client.acquire_raw(owner.as_bytes(), &key, WORKER_LEASE, WORKER_WAIT)
                        {
                            let acked = Instant::now();
                            std::thread::sleep(Duration::from_millis(10));
                            let release_sent = Instant::now();
                            let answer = client.release(&key, grant.token);
                            let grant = Grant {
                                who: owner.clone(),
                                key,
                                token: grant.token,
                                existing: grant.existing,
                                sent,
                                acked,
                                lease: grant.lease,
                                released: Some(release_sent),
                                release_answer: format!("{answer:?}"),
                            };
                            grants.lock().expect("the grants' lock").push(grant);
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                })
            })
            .collect();
        Locker { stop, grants, threads }
    }

    fn count(&self) -> usize {
        self.grants.lock().expect("the grants' lock").len()
    }

    /// Waits until `more` grants past the current count were acknowledged.
    fn wait_for(&self, more: usize, ops: &Ops) {
        let target = self.count() + more;
        ops.wait_until(&format!("locking goes on ({target} grants)"), || {
            let count = self.count();
            if count >= target {
                Ok(())
            } else {
                Err(format!("{count} grants"))
            }
        });
    }

    fn finish(self) -> Vec<Grant> {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads {
            thread.join().expect("a worker panicked");
        }
        let grants = self.grants.lock().expect("the grants' lock").clone();
        grants
    }
}

/// Tokens increase in real time (a grant acknowledged before another was
/// asked for has the lower token), each worker's in its order; a token is
/// one key's; and no two grants of one key overlap.
fn check_grants(grants: &[Grant]) {
    let fresh: Vec<&Grant> = grants.iter().filter(|grant| !grant.existing).collect();
    let mut by_ack = fresh.clone();
    by_ack.sort_by_key(|grant| grant.acked);
    // The highest token acknowledged up to each position.
    let highest: Vec<u64> = by_ack
        .iter()
        .scan(0, |max, grant| {
            *max = (*max).max(grant.token);
            Some(*max)
        })
        .collect();
    for later in &fresh {
        let before = by_ack.partition_point(|grant| grant.acked < later.sent);
        if before > 0 {
            assert!(
                highest[before - 1] < later.token,
                "token {} ({} on {}) is not above token {} acknowledged before it was asked for",
                later.token,
                later.who,
                later.key,
                highest[before - 1]
            );
        }
    }
    let mut workers: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for grant in &by_ack {
        workers.entry(grant.who.as_str()).or_default().push(grant);
    }
    for (who, own) in &workers {
        for pair in own.windows(2) {
            assert!(
                pair[0].token < pair[1].token,
                "{who}'s tokens went backwards: {:?} then {:?}",
                pair[0],
                pair[1]
            );
        }
    }
    // One grant per token, however often its owner was answered: one key's,
    // one owner's.
    let mut by_token: BTreeMap<u64, Vec<&Grant>> = BTreeMap::new();
    for grant in grants {
        let same = by_token.entry(grant.token).or_default();
        if let Some(first) = same.first() {
            assert!(
                (first.key.as_str(), first.who.as_str()) == (grant.key.as_str(), grant.who.as_str()),
                "token {} was granted twice: {first:?} and {grant:?}",
                grant.token
            );
        }
        same.push(grant);
    }
    // No two grants of one key overlap: in token order (the order of one
    // key's grants), each is acknowledged no sooner than the one before
    // was let go. A token's first acknowledgement and last letting go.
    let span = |same: &[&Grant]| {
        let acked = same.iter().map(|grant| grant.acked).min().expect("a grant per token");
        let until = same.iter().map(|grant| grant.held_until()).max().expect("a grant per token");
        (acked, until)
    };
    let mut by_key: BTreeMap<&str, Vec<&Vec<&Grant>>> = BTreeMap::new();
    for same in by_token.values() {
        by_key.entry(same[0].key.as_str()).or_default().push(same);
    }
    for (key, tokens) in &by_key {
        for pair in tokens.windows(2) {
            let ((_, until), (acked, _)) = (span(pair[0]), span(pair[1]));
            assert!(
                acked >= until,
                "{key}: token {} was granted {:?} before token {}'s holder let go: {:?} then {:?}",
                pair[1][0].token,
                until.duration_since(acked),
                pair[0][0].token,
                pair[0].iter().map(|grant| grant.show()).collect::<Vec<_>>(),
                pair[1].iter().map(|grant| grant.show()).collect::<Vec<_>>(),
            );
        }
    }
}

/// A lock of alice's taken before a step and checked after it.
struct Held {
    key: String,
    token: u64,
}

fn hold(client: &Client, step: &str, grants: &Mutex<Vec<Grant>>) -> Held {
    let key = format!("jobs/held/{step}");
    let sent = Instant::now();
    let grant = client
        .acquire_raw(client.owner(), &key, HELD_LEASE, Duration::ZERO)
        .unwrap_or_else(|err| panic!("before {step}: cannot take {key}: {err}"));
    grants.lock().expect("the grants' lock").push(Grant {
        who: String::from_utf8_lossy(client.owner()).into_owned(),
        key: key.clone(),
        token: grant.token,
        existing: grant.existing,
        sent,
        acked: Instant::now(),
        lease: grant.lease,
        released: None,
        release_answer: "not released".into(),
    });
    Held { key, token: grant.token }
}

fn still_held(client: &Client, held: &Held, after: &str) {
    let holds = client
        .check(&held.key, held.token)
        .unwrap_or_else(|err| panic!("after {after}: cannot check {}: {err}", held.key));
    assert!(holds, "after {after}: {} (token {}) was lost", held.key, held.token);
}

#[test]
fn every_membership_and_maintenance_workflow_of_the_operations_guide_runs_over_tls_under_locking() {
    let started = Instant::now();
    let mut ops = Ops::new(6);
    let founders = [1u64, 2, 3];
    for id in founders {
        ops.create_node_cert(id);
        ops.copy_node_certs(id);
        ops.write_founder_config(id, &founders, "new");
        let config = ops.node(id).config.display().to_string();
        ops.node_mut(id).args = vec!["--config".into(), config];
        ops.start(id);
    }
    ops.members = founders.to_vec();
    ops.wait_until("the founders serve", || ops.whole());
    // "Then set initial_cluster_state = "existing" in every node's file."
    for id in founders {
        ops.write_founder_config(id, &founders, "existing");
    }
    ops.wait_for_voters("founded", &founders);

    // Clients know every address a member will have.
    let every: Vec<String> = ops.nodes.values().map(|node| node.client.clone()).collect();
    let locker = Locker::start(&ops.certs, &every);
    let holder = alice(&ops.certs, every.clone(), "alice/holder");
    let mut held = Vec::new();
    locker.wait_for(10, &ops);

    // 1. Grow 3 → 5: member add (text, then --json), the printed command.
    let step = "grow";
    held.push(hold(&holder, step, &locker.grants));
    ops.prepare(4);
    ops.grow(4, false);
    ops.wait_for_voters(step, &[1, 2, 3, 4]);
    ops.prepare(5);
    ops.grow(5, true);
    ops.wait_for_voters(step, &[1, 2, 3, 4, 5]);
    let joined = ops.log(5);
    assert!(!joined.contains("founding the cluster"), "node 5 founded a cluster:\n{joined}");
    locker.wait_for(10, &ops);
    still_held(&holder, &held[held.len() - 1], step);

    // 2. Shrink 5 → 3, one at a time: node 5, then founder 1 (the leader,
    // perhaps: leadership moves first).
    let step = "shrink";
    held.push(hold(&holder, step, &locker.grants));
    ops.shrink(5);
    ops.wait_for_voters(step, &[1, 2, 3, 4]);
    ops.shrink(1);
    ops.wait_for_voters(step, &[2, 3, 4]);
    locker.wait_for(10, &ops);
    still_held(&holder, &held[held.len() - 1], step);

    // 3. Node 3's machine dies; node 6, on a new machine, replaces it:
    // remove the dead node first, then grow (under TLS the new node's own
    // certificate joins only once an admin added it).
    let step = "replace-new-id";
    held.push(hold(&holder, step, &locker.grants));
    ops.kill(3);
    locker.wait_for(5, &ops);
    let removed = ops.admin(&["member", "remove", "3"]);
    assert!(removed.status.success(), "member remove 3 (dead): {}\n{}", shown(&removed), ops.logs());
    ops.members.retain(|member| *member != 3);
    ops.wait_for_voters(step, &[2, 4]);
    // A new node started with --join before the `member add`: under TLS
    // its own certificate may not add it (docs/security.md, "Joining with
    // a node's certificate"): refused with exit code 4, which systemd does
    // not restart, and told what to run.
    ops.prepare(6);
    let (peer, client) = (ops.node(6).peer.clone(), ops.node(6).client.clone());
    let mut literal: Vec<String> =
        ["--id", "6", "--peers", &format!("6={peer}"), "--client-addr", &client, "--join", &ops.endpoints()]
            .iter()
            .map(|arg| (*arg).to_owned())
            .collect();
    literal.extend(ops.machine_flags(6));
    ops.node_mut(6).args = literal;
    ops.start(6);
    let status = ops.wait_exit(6, "a --join that no admin's member add preceded");
    let log = ops.log(6);
    println!("replace in two commands under TLS: node 6 exited with {status}");
    assert_eq!(
        status.code(),
        Some(4),
        "node 6 joined without an admin's member add, or failed otherwise:\n{log}"
    );
    assert!(log.contains("fencelock member add 6"), "the refusal does not say what to run:\n{log}");
    ops.wait_for_voters(step, &[2, 4]);
    // Then as "Grow the cluster" says, on the same data directory.
    ops.grow(6, true);
    ops.wait_for_voters(step, &[2, 4, 6]);
    locker.wait_for(10, &ops);
    still_held(&holder, &held[held.len() - 1], step);

    // 4. Node 2's disk is replaced: an empty data directory, the same
    // command, its file saying initial_cluster_state = "existing". It
    // rejoins without a membership change.
    let step = "replace-keep-id";
    held.push(hold(&holder, step, &locker.grants));
    // The members with their addresses (`index` is the leader's applied
    // index when listing, and moves with every write).
    let members = |ops: &Ops| {
        let out = ops.admin(&["--json", "member", "list"]);
        let json: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|err| panic!("member list --json: {err}: {}", shown(&out)));
        json["members"].clone()
    };
    let before = members(&ops);
    ops.kill(2);
    let data = ops.node(2).data.clone();
    std::fs::remove_dir_all(&data).expect("the old disk's data goes");
    std::fs::create_dir_all(&data).expect("the new disk's empty directory");
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod");
    locker.wait_for(5, &ops);
    let earlier = ops.log(2).len();
    ops.start(2);
    ops.wait_until(&format!("{step}: node 2 rejoined"), || {
        if ops.log(2)[earlier..].contains("rejoined: caught up, voting again") {
            Ok(())
        } else {
            Err("no `rejoined: caught up, voting again` in node 2's log yet".into())
        }
    });
    let log = ops.log(2).split_off(earlier);
    assert!(log.contains("its data was lost"), "node 2 did not rejoin as a node that lost its data:\n{log}");
    assert!(!log.contains("founding the cluster"), "node 2 founded a cluster:\n{log}");
    ops.wait_until(&format!("{step}: the cluster whole"), || ops.whole());
    ops.wait_for_voters(step, &[2, 4, 6]);
    let after = members(&ops);
    assert_eq!(before, after, "the membership changed");
    locker.wait_for(10, &ops);
    still_held(&holder, &held[held.len() - 1], step);

    // 5. Rolling restart, and 6. rolling upgrade: the same procedure, the
    // second installing the binary before each start.
    let mut orders = Vec::new();
    for (step, upgrade) in [("rolling-restart", false), ("rolling-upgrade", true)] {
        held.push(hold(&holder, step, &locker.grants));
        orders.push(ops.rolling(step, upgrade, &locker));
        ops.wait_for_voters(step, &[2, 4, 6]);
        still_held(&holder, &held[held.len() - 1], step);
    }

    // The rules came with each node's file: the leader, whichever it is
    // now, refuses alice outside jobs/.
    let refused = holder.acquire_raw(holder.owner(), "elsewhere/x", WORKER_LEASE, Duration::ZERO);
    assert!(matches!(refused, Err(ClientError::PermissionDenied(_))), "alice outside her rule: {refused:?}");
    for lock in &held {
        still_held(&holder, lock, "every step");
    }
    // Refused raft messages since each node's last start (docs/operations.md
    // alerts on any increase), for the record.
    let mut refused = Vec::new();
    for id in &ops.members {
        let scrape = http_get(&ops.node(*id).metrics, "/metrics").unwrap_or_else(|err| err);
        refused.extend(
            scrape
                .lines()
                .filter(|line| line.starts_with("fencelock_raft_messages_refused_total{"))
                .filter(|line| !line.ends_with(" 0"))
                .map(str::to_owned),
        );
    }
    let grants = locker.finish();
    let shared = grants.iter().filter(|grant| grant.key.starts_with("jobs/shared/")).count();
    let unconfirmed: Vec<String> = grants
        .iter()
        .filter(|grant| grant.released.is_some() && grant.release_answer != "Ok(true)")
        .map(Grant::show)
        .collect();
    check_grants(&grants);
    println!(
        "{shared} grants of the workers, {} locks held across steps; releases not answered yes: \
         {unconfirmed:?}; restart orders {orders:?}; refused raft messages {refused:?}; {} ms in all",
        held.len(),
        started.elapsed().as_millis()
    );
}
