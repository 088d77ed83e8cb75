//! deploy/kubernetes: the StatefulSet's start and stop scripts, as the pods
//! run them. The scripts live in deploy/kubernetes/start.sh and stop.sh and,
//! text for text, in the ConfigMap of statefulset.yaml, which is what the
//! pods run: the first test checks the two are the same, so that the rest,
//! which run the files with /bin/sh (dash on Debian), test what is
//! deployed.
//!
//! - start.sh in dry-run mode (FENCELOCK_DRY_RUN=1) prints the fencelockd
//!   command line, one argument per line; the tests compare it whole, for
//!   ordinals 0..4 and a data directory that is blank, holds data, holds
//!   the removed marker or the joined marker.
//! - start.sh for real, with a `getent` and a `fencelockd` of the test's own
//!   first on PATH: it waits for its name to resolve to POD_IP, wipes a
//!   removed node's data (all but lost+found), writes the joined marker,
//!   and execs exactly the command the dry run printed.
//! - stop.sh in dry-run mode (REPLICAS=N) removes the node exactly when its
//!   ordinal is N or more, and for real, with a `curl` and a `fencelock` of
//!   the test's own: how it reads the Kubernetes API's answer, and the
//!   marker around the removal.

// Test code: unwrapping is how a test fails.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The founding members the tests give INITIAL_MEMBERS.
const INITIAL: usize = 3;
/// The domain of the pods' names with POD_NAMESPACE=ns.
const DOMAIN: &str = "fencelock.ns.svc.cluster.local";
/// The data directory markers (start.sh, stop.sh).
const REMOVED: &str = "fencelock-removed";
const JOINED: &str = "fencelock-joined";
/// A script that runs longer than this is stuck (waiting for DNS, say).
const SCRIPT_DEADLINE: Duration = Duration::from_secs(30);

fn kubernetes_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("deploy").join("kubernetes")
}

fn script(name: &str) -> PathBuf {
    kubernetes_dir().join(name)
}

/// The text of the YAML literal block scalar (`KEY: |`, clip chomping) of
/// `key` in the `data:` of the manifest's ConfigMap. Only what the manifest
/// uses: block indentation from the first non-empty line, no indentation
/// indicator, no tabs.
fn configmap_entry(manifest: &str, key: &str) -> String {
    let documents: Vec<&str> =
        manifest.split("\n---\n").filter(|doc| doc.lines().any(|line| line == "kind: ConfigMap")).collect();
    assert_eq!(documents.len(), 1, "statefulset.yaml must hold one ConfigMap");
    let lines: Vec<&str> = documents[0].lines().collect();
    let data = lines.iter().position(|line| *line == "data:").expect("the ConfigMap has no data:");
    let header = format!("  {key}: |");
    let starts: Vec<usize> =
        (data + 1..lines.len()).filter(|&index| lines[index].trim_end() == header).collect();
    assert_eq!(starts.len(), 1, "the ConfigMap's data must hold `{header}` once");
    literal_block(&lines[starts[0] + 1..])
}

fn literal_block(lines: &[&str]) -> String {
    let indent = lines
        .iter()
        .find(|line| !line.trim().is_empty())
        .map(|line| line.len() - line.trim_start_matches(' ').len())
        .expect("an empty block");
    assert!(indent > 2, "the block must be indented past its key");
    let mut text: Vec<&str> = Vec::new();
    for line in lines {
        if line.trim().is_empty() {
            text.push(line.get(indent..).unwrap_or(""));
        } else if line.len() - line.trim_start_matches(' ').len() >= indent {
            text.push(&line[indent..]);
        } else {
            break;
        }
    }
    assert!(!text.iter().any(|line| line.contains('\t')), "a tab in the block");
    while text.last().is_some_and(|line| line.is_empty()) {
        text.pop();
    }
    let mut out = text.join("\n");
    out.push('\n');
    out
}

#[test]
fn the_literal_block_reader_keeps_blank_lines_and_stops_at_the_next_key() {
    let block = ["    a", "", "      b", "    c", "", "", "  next: |", "    d"];
    assert_eq!(literal_block(&block), "a\n\n  b\nc\n");
    let manifest = "kind: Service\n---\nkind: ConfigMap\ndata:\n  x.sh: |\n    one\n    two\n  y.sh: |\n    three\n---\nkind: StatefulSet\n";
    assert_eq!(configmap_entry(manifest, "x.sh"), "one\ntwo\n");
    assert_eq!(configmap_entry(manifest, "y.sh"), "three\n");
}

#[test]
fn the_configmap_holds_the_very_scripts_and_the_pods_run_them() {
    let manifest = fs::read_to_string(kubernetes_dir().join("statefulset.yaml")).unwrap();
    for name in ["start.sh", "stop.sh"] {
        let file = fs::read_to_string(script(name)).unwrap();
        let embedded = configmap_entry(&manifest, name);
        if embedded != file {
            let line = embedded.lines().zip(file.lines()).position(|(a, b)| a != b);
            panic!(
                "the ConfigMap's {name} differs from deploy/kubernetes/{name} (first differing line: {:?}; \
                 lengths {} and {}): copy the file into statefulset.yaml, indented by 4",
                line.map(|index| index + 1),
                embedded.len(),
                file.len()
            );
        }
    }
    // What the pods run is that ConfigMap, mounted where the commands say.
    for needle in [
        "command: [\"/bin/sh\", \"/etc/fencelock/k8s/start.sh\"]",
        "command: [\"/bin/sh\", \"/etc/fencelock/k8s/stop.sh\"]",
        "mountPath: /etc/fencelock/k8s",
        "preStop:",
    ] {
        assert!(manifest.contains(needle), "statefulset.yaml lacks {needle}");
    }
}

/// What a script printed, and how it ended.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn lines(&self) -> Vec<String> {
        self.stdout.lines().map(str::to_owned).collect()
    }
}

/// Runs `script` with /bin/sh, with nothing of the test's environment but
/// `env` and a PATH (the test's fake commands first, if any).
fn sh(script: &Path, env: &[(&str, String)], fakes: Option<&Path>) -> Run {
    let path = match fakes {
        Some(dir) => format!("{}:/usr/local/bin:/usr/bin:/bin", dir.display()),
        None => "/usr/local/bin:/usr/bin:/bin".to_owned(),
    };
    let mut child = Command::new("/bin/sh")
        .arg(script)
        .env_clear()
        .env("PATH", path)
        .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + SCRIPT_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "{} ran for more than {SCRIPT_DEADLINE:?}: waiting for something? env {env:?}",
                script.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut run = Run { code: status.code(), stdout: String::new(), stderr: String::new() };
    child.stdout.take().unwrap().read_to_string(&mut run.stdout).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut run.stderr).unwrap();
    run
}

/// What a pod's data directory holds when it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Data {
    Blank,
    /// raft/ with a log file: a restart.
    Raft,
    /// raft/ and the marker stop.sh leaves on a scale-down.
    Removed,
    /// raft/ and the marker start.sh leaves before a first --join.
    Joined,
}

const ALL_DATA: [Data; 4] = [Data::Blank, Data::Raft, Data::Removed, Data::Joined];

fn data_dir(data: Data) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    // A fresh ext4 volume's own directory, which uid 10001 cannot delete.
    fs::create_dir(dir.path().join("lost+found")).unwrap();
    if data != Data::Blank {
        fs::create_dir_all(dir.path().join("raft").join("snapshots")).unwrap();
        fs::write(dir.path().join("raft").join("0000000000000001.raftlog"), b"log").unwrap();
    }
    match data {
        Data::Removed => fs::write(dir.path().join(REMOVED), "node removed\n").unwrap(),
        Data::Joined => fs::write(dir.path().join(JOINED), "node joined\n").unwrap(),
        Data::Blank | Data::Raft => {}
    }
    dir
}

/// Every path under `dir`, relative to it.
fn listing(dir: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            out.insert(path.strip_prefix(root).unwrap().display().to_string());
            if path.is_dir() && !path.is_symlink() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

fn start_env(ordinal: usize, data: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("HOSTNAME", format!("fencelock-{ordinal}")),
        ("POD_NAMESPACE", "ns".into()),
        ("POD_IP", "10.1.2.3".into()),
        ("INITIAL_MEMBERS", INITIAL.to_string()),
        // Not the default: it must reach fencelockd as given.
        ("INITIAL_CLUSTER_STATE", "existing".into()),
        ("DATA_DIR", data.display().to_string()),
    ]
}

fn dry_run(mut env: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
    env.push(("FENCELOCK_DRY_RUN", "1".into()));
    env
}

fn peer(ordinal: usize) -> String {
    format!("{}=fencelock-{ordinal}.{DOMAIN}:7001", ordinal + 1)
}

fn client(ordinal: usize) -> String {
    format!("fencelock-{ordinal}.{DOMAIN}:7101")
}

/// The command start.sh must print: what the decision table says.
fn expected_start(ordinal: usize, data: Data, data_dir: &Path) -> Vec<String> {
    let id = (ordinal + 1).to_string();
    let founders = || (0..INITIAL).map(peer).collect::<Vec<_>>();
    let mut args: Vec<String> = vec!["fencelockd".into(), "--id".into(), id];
    let join = matches!(data, Data::Removed | Data::Joined) || (data == Data::Blank && ordinal >= INITIAL);
    if join {
        let others: Vec<String> = (0..INITIAL).filter(|&n| n != ordinal).map(client).collect();
        args.extend(["--peers".into(), peer(ordinal), "--join".into(), others.join(",")]);
    } else {
        let mut peers = founders();
        if ordinal >= INITIAL {
            peers.push(peer(ordinal));
        }
        args.extend(["--peers".into(), peers.join(","), "--initial-cluster-state".into(), "existing".into()]);
    }
    let tail = [
        "--config",
        "/etc/fencelock/k8s/fencelock.toml",
        "--client-addr",
        "0.0.0.0:7101",
        "--advertise-client-addr",
        &client(ordinal),
        "--data-dir",
        &data_dir.display().to_string(),
        "--certs-dir",
        "/run/fencelock/certs",
        "--metrics-addr",
        "0.0.0.0:9101",
        "--insecure",
        "--log-format",
        "json",
    ]
    .map(str::to_owned);
    args.extend(tail);
    args
}

/// The value after `flag`, if it is there once.
fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let at: Vec<usize> = (0..args.len()).filter(|&index| args[index] == flag).collect();
    assert!(at.len() <= 1, "{flag} more than once: {args:?}");
    at.first().map(|&index| args[index + 1].as_str())
}

#[test]
fn start_decides_from_the_ordinal_and_the_data_directory() {
    for ordinal in 0..5 {
        for data in ALL_DATA {
            let dir = data_dir(data);
            let before = listing(dir.path());
            let run = sh(&script("start.sh"), &dry_run(start_env(ordinal, dir.path())), None);
            let case = format!("ordinal {ordinal}, {data:?}: {}", run.stderr);
            assert_eq!(run.code, Some(0), "{case}");
            let args = run.lines();
            assert_eq!(args, expected_start(ordinal, data, dir.path()), "{case}");

            // The rules the table stands for, said once more on their own.
            assert_eq!(flag(&args, "--id"), Some((ordinal + 1).to_string().as_str()), "{case}");
            let peers = flag(&args, "--peers").unwrap();
            let ids: Vec<&str> = peers.split(',').map(|entry| entry.split('=').next().unwrap()).collect();
            assert!(ids.contains(&(ordinal + 1).to_string().as_str()), "--id not among --peers: {case}");
            let join = flag(&args, "--join");
            match data {
                Data::Blank | Data::Raft => {
                    assert_eq!(join.is_some(), data == Data::Blank && ordinal >= INITIAL, "{case}")
                }
                Data::Removed | Data::Joined => assert!(join.is_some(), "{case}"),
            }
            if let Some(join) = join {
                assert!(!join.contains(&client(ordinal)), "joins itself: {case}");
                assert_eq!(peers, peer(ordinal), "a joiner's --peers name only itself: {case}");
                assert_eq!(flag(&args, "--initial-cluster-state"), None, "{case}");
            } else {
                assert_eq!(flag(&args, "--initial-cluster-state"), Some("existing"), "{case}");
            }
            if data == Data::Removed {
                assert!(run.stderr.contains("would wipe"), "{case}");
            } else {
                assert!(!run.stderr.contains("wipe"), "{case}");
            }
            // A dry run touches nothing.
            assert_eq!(listing(dir.path()), before, "{case}");
        }
    }
}

#[test]
fn start_reads_initial_members_with_a_default_of_three() {
    let dir = data_dir(Data::Blank);
    // Unset: 3 founders, so pod 3 joins.
    let mut env = dry_run(start_env(3, dir.path()));
    env.retain(|(name, _)| *name != "INITIAL_MEMBERS" && *name != "INITIAL_CLUSTER_STATE");
    let args = sh(&script("start.sh"), &env, None).lines();
    assert!(flag(&args, "--join").is_some(), "{args:?}");
    // Five founders: pod 3 founds, with all five in --peers, and the
    // default state `new`.
    env.push(("INITIAL_MEMBERS", "5".into()));
    let args = sh(&script("start.sh"), &env, None).lines();
    assert_eq!(flag(&args, "--join"), None, "{args:?}");
    assert_eq!(flag(&args, "--peers"), Some((0..5).map(peer).collect::<Vec<_>>().join(",").as_str()));
    assert_eq!(flag(&args, "--initial-cluster-state"), Some("new"));
    // A host name without an ordinal is refused.
    let mut env = dry_run(start_env(0, dir.path()));
    env.retain(|(name, _)| *name != "HOSTNAME");
    env.push(("HOSTNAME", "fencelock".into()));
    let run = sh(&script("start.sh"), &env, None);
    assert_ne!(run.code, Some(0), "{}", run.stdout);
}

fn write_executable(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// A `getent` that answers a stranger's IP address the first time (with
/// FAKE_WRONG_FIRST=1) and POD_IP after, counting its calls, and a
/// `fencelockd` that prints its command line as the dry run does.
fn start_fakes() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_executable(
        &dir.path().join("getent"),
        "#!/bin/sh\n\
         calls=$(cat \"$FAKE_DIR/getent-calls\" 2>/dev/null || echo 0)\n\
         calls=$((calls + 1))\n\
         echo \"$calls\" >\"$FAKE_DIR/getent-calls\"\n\
         if [ \"${FAKE_WRONG_FIRST:-0}\" = 1 ] && [ \"$calls\" = 1 ]; then ip=10.9.9.9; else ip=$POD_IP; fi\n\
         printf '%-15s %s\\n' \"$ip\" \"$2\"\n",
    );
    write_executable(&dir.path().join("fencelockd"), "#!/bin/sh\nprintf '%s\\n' fencelockd \"$@\"\n");
    dir
}

/// start.sh for real, after its dry run on the same directory: it must
/// exec the command the dry run printed.
fn start_for_real(ordinal: usize, data: Data, extra: &[(&'static str, String)]) -> (tempfile::TempDir, Run) {
    let dir = data_dir(data);
    let fakes = start_fakes();
    let mut env = start_env(ordinal, dir.path());
    env.push(("FAKE_DIR", fakes.path().display().to_string()));
    env.extend(extra.iter().cloned());
    let dry = sh(&script("start.sh"), &dry_run(env.clone()), Some(fakes.path()));
    let run = sh(&script("start.sh"), &env, Some(fakes.path()));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.lines(), dry.lines(), "the real start differs from its dry run: {}", run.stderr);
    assert_eq!(run.lines(), expected_start(ordinal, data, dir.path()));
    let calls: u32 = fs::read_to_string(fakes.path().join("getent-calls")).unwrap().trim().parse().unwrap();
    assert!(calls >= 1, "never waited for DNS");
    (dir, run)
}

#[test]
fn start_wipes_a_removed_node_and_marks_a_joiner() {
    // Removed: everything goes but lost+found, and the joined marker is
    // written (the old one went with the wipe).
    for ordinal in [1, 4] {
        let dir = data_dir(Data::Removed);
        fs::write(dir.path().join(JOINED), "old\n").unwrap();
        fs::write(dir.path().join(".hidden"), "x").unwrap();
        fs::write(dir.path().join("..odd"), "x").unwrap();
        fs::create_dir(dir.path().join("other")).unwrap();
        fs::write(dir.path().join("other").join("file"), "x").unwrap();
        let fakes = start_fakes();
        let mut env = start_env(ordinal, dir.path());
        env.push(("FAKE_DIR", fakes.path().display().to_string()));
        let run = sh(&script("start.sh"), &env, Some(fakes.path()));
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        assert_eq!(run.lines(), expected_start(ordinal, Data::Removed, dir.path()));
        let left = listing(dir.path());
        assert_eq!(left, BTreeSet::from(["lost+found".to_owned(), JOINED.to_owned()]), "{}", run.stderr);
        let marker = fs::read_to_string(dir.path().join(JOINED)).unwrap();
        assert!(marker.contains(&format!("node {}", ordinal + 1)), "{marker}");
    }

    // A blank pod past the founders joins, and says so in its directory.
    let (dir, _) = start_for_real(3, Data::Blank, &[]);
    assert_eq!(listing(dir.path()), BTreeSet::from(["lost+found".to_owned(), JOINED.to_owned()]));

    // A joined pod restarts with --join, its data untouched.
    let (dir, _) = start_for_real(4, Data::Joined, &[]);
    assert_eq!(listing(dir.path()), listing(data_dir(Data::Joined).path()));

    // A founder starts without a marker, restarted or blank.
    let (dir, _) = start_for_real(0, Data::Raft, &[]);
    assert_eq!(listing(dir.path()), listing(data_dir(Data::Raft).path()));
    let (dir, _) = start_for_real(2, Data::Blank, &[]);
    assert_eq!(listing(dir.path()), BTreeSet::from(["lost+found".to_owned()]));
}

#[test]
fn start_waits_until_its_name_resolves_to_its_pod_ip() {
    let dir = data_dir(Data::Blank);
    let fakes = start_fakes();
    let mut env = start_env(0, dir.path());
    env.push(("FAKE_DIR", fakes.path().display().to_string()));
    env.push(("FAKE_WRONG_FIRST", "1".into()));
    let run = sh(&script("start.sh"), &env, Some(fakes.path()));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let calls = fs::read_to_string(fakes.path().join("getent-calls")).unwrap();
    assert_eq!(calls.trim(), "2", "{}", run.stderr);
    assert!(run.stderr.contains(&format!("waiting for fencelock-0.{DOMAIN} to resolve to 10.1.2.3")));
    assert_eq!(run.lines()[0], "fencelockd");
}

fn stop_env(ordinal: usize, data: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("HOSTNAME", format!("fencelock-{ordinal}")),
        ("POD_NAMESPACE", "ns".into()),
        ("DATA_DIR", data.display().to_string()),
    ]
}

fn expected_remove(ordinal: usize, replicas: usize) -> Vec<String> {
    let endpoints: Vec<String> = (0..replicas).map(client).collect();
    [
        "fencelock",
        "member",
        "remove",
        &(ordinal + 1).to_string(),
        "--endpoints",
        &endpoints.join(","),
        "--certs-dir",
        "/run/fencelock/certs",
        "--user",
        "admin",
        "--timeout",
        "5s",
        "--retry-for",
        "30s",
    ]
    .map(str::to_owned)
    .to_vec()
}

#[test]
fn stop_removes_the_node_exactly_when_its_ordinal_is_past_the_replicas() {
    for replicas in [3, 5] {
        for ordinal in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let mut env = dry_run(stop_env(ordinal, dir.path()));
            env.push(("REPLICAS", replicas.to_string()));
            let run = sh(&script("stop.sh"), &env, None);
            let case = format!("ordinal {ordinal}, replicas {replicas}: {}", run.stderr);
            assert_eq!(run.code, Some(0), "{case}");
            if ordinal >= replicas {
                assert_eq!(run.lines(), expected_remove(ordinal, replicas), "{case}");
                assert!(!run.lines()[5].contains(&client(ordinal)), "asks itself: {case}");
            } else {
                assert!(run.stdout.is_empty(), "removes on a restart: {case}");
            }
            assert!(listing(dir.path()).is_empty(), "a dry run wrote something: {case}");
        }
    }
    // Scaled to zero: a pause; nobody removes itself.
    for ordinal in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let mut env = dry_run(stop_env(ordinal, dir.path()));
        env.push(("REPLICAS", "0".into()));
        let run = sh(&script("stop.sh"), &env, None);
        assert_eq!((run.code, run.stdout.as_str()), (Some(0), ""), "{}", run.stderr);
    }
}

/// A service account directory, a `curl` that answers FAKE_CODE with
/// FAKE_BODY (recording its arguments and standard input), and a
/// `fencelock` that records its arguments and whether the removed marker
/// was there when it ran, and exits FAKE_EXIT.
struct StopFakes {
    dir: tempfile::TempDir,
}

impl StopFakes {
    fn new() -> StopFakes {
        let dir = tempfile::tempdir().unwrap();
        let sa = dir.path().join("serviceaccount");
        fs::create_dir(&sa).unwrap();
        fs::write(sa.join("token"), "tok-123").unwrap();
        fs::write(sa.join("ca.crt"), "ca").unwrap();
        fs::write(sa.join("namespace"), "ns").unwrap();
        write_executable(
            &dir.path().join("curl"),
            "#!/bin/sh\n\
             printf '%s\\n' \"$@\" >\"$FAKE_DIR/curl-args\"\n\
             cat >\"$FAKE_DIR/curl-stdin\"\n\
             [ \"${FAKE_CURL_EXIT:-0}\" = 0 ] || exit \"$FAKE_CURL_EXIT\"\n\
             printf '%s\\n%s' \"$FAKE_BODY\" \"$FAKE_CODE\"\n",
        );
        write_executable(
            &dir.path().join("fencelock"),
            "#!/bin/sh\n\
             printf '%s\\n' fencelock \"$@\" >\"$FAKE_DIR/fencelock-args\"\n\
             if [ -e \"$DATA_DIR/fencelock-removed\" ]; then echo yes; else echo no; fi >\"$FAKE_DIR/marker-at-call\"\n\
             exit \"${FAKE_EXIT:-0}\"\n",
        );
        StopFakes { dir }
    }

    fn run(
        &self,
        ordinal: usize,
        data: &Path,
        code: &str,
        body: &str,
        extra: &[(&'static str, &str)],
    ) -> Run {
        let mut env = stop_env(ordinal, data);
        env.push(("FAKE_DIR", self.dir.path().display().to_string()));
        env.push(("SERVICEACCOUNT_DIR", self.dir.path().join("serviceaccount").display().to_string()));
        env.push(("FAKE_CODE", code.into()));
        env.push(("FAKE_BODY", body.into()));
        env.extend(extra.iter().map(|(name, value)| (*name, value.to_string())));
        sh(&script("stop.sh"), &env, Some(self.dir.path()))
    }

    fn read(&self, name: &str) -> Option<String> {
        fs::read_to_string(self.dir.path().join(name)).ok()
    }
}

/// A stop that removes nothing: ordinal, the API's status code and body,
/// more environment, and whether the hook succeeds.
type NoRemoval = (usize, &'static str, String, &'static [(&'static str, &'static str)], bool);

fn scale(replicas: &str) -> String {
    format!(
        "{{\"kind\":\"Scale\",\"apiVersion\":\"autoscaling/v1\",\"metadata\":{{\"name\":\"fencelock\",\
         \"namespace\":\"ns\"}},\"spec\":{replicas},\"status\":{{\"replicas\":5,\
         \"selector\":\"app.kubernetes.io/name=fencelock\"}}}}"
    )
}

#[test]
fn stop_reads_the_replicas_from_the_api_and_marks_the_removal() {
    // Scaled from 5 to 3: pod 4 removes node 5, with the marker written
    // first (the node stops as soon as it applies its removal).
    let fakes = StopFakes::new();
    let data = tempfile::tempdir().unwrap();
    let run = fakes.run(4, data.path(), "200", &scale("{\"replicas\":3}"), &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let args: Vec<String> = fakes.read("fencelock-args").unwrap().lines().map(str::to_owned).collect();
    assert_eq!(args, expected_remove(4, 3));
    assert_eq!(fakes.read("marker-at-call").unwrap().trim(), "yes");
    let marker = fs::read_to_string(data.path().join(REMOVED)).unwrap();
    assert!(marker.contains("node 5") && marker.contains("spec.replicas 3"), "{marker}");
    // The scale subresource of this StatefulSet, with the account's CA and
    // token; the token on standard input, not among the arguments.
    let curl = fakes.read("curl-args").unwrap();
    assert!(curl
        .contains("https://kubernetes.default.svc/apis/apps/v1/namespaces/ns/statefulsets/fencelock/scale"));
    assert!(curl.contains(&fakes.dir.path().join("serviceaccount").join("ca.crt").display().to_string()));
    assert!(!curl.contains("tok-123"), "{curl}");
    assert_eq!(fakes.read("curl-stdin").unwrap(), "header = \"Authorization: Bearer tok-123\"\n");

    // The removal failed: the marker goes again, and the hook fails.
    let fakes = StopFakes::new();
    let data = tempfile::tempdir().unwrap();
    let run = fakes.run(3, data.path(), "200", &scale("{\"replicas\":3}"), &[("FAKE_EXIT", "1")]);
    assert_ne!(run.code, Some(0));
    assert_eq!(fakes.read("marker-at-call").unwrap().trim(), "yes");
    assert!(listing(data.path()).is_empty(), "{}", run.stderr);

    // An answer spread over lines, as `?pretty` gives it.
    let fakes = StopFakes::new();
    let data = tempfile::tempdir().unwrap();
    let pretty = scale("{\n    \"replicas\": 4\n  }").replace(',', ",\n  ");
    let run = fakes.run(4, data.path(), "200", &pretty, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(fakes.read("fencelock-args").unwrap().lines().collect::<Vec<_>>(), expected_remove(4, 4));

    // No removal: a restart (ordinal below the replicas), a scale to zero
    // (Scale's spec is {} then), the StatefulSet deleted (404). The hook
    // fails without removing on a refusal, an unreadable answer, or no
    // answer.
    let cases: [NoRemoval; 7] = [
        (2, "200", scale("{\"replicas\":3}"), &[], true),
        (4, "200", scale("{\"replicas\":5}"), &[], true),
        (0, "200", scale("{}"), &[], true),
        (4, "404", "{\"kind\":\"Status\",\"code\":404}".into(), &[], true),
        (4, "403", "{\"kind\":\"Status\",\"code\":403}".into(), &[], false),
        (4, "200", "{\"kind\":\"Scale\"}".into(), &[], false),
        (4, "200", scale("{\"replicas\":3}"), &[("FAKE_CURL_EXIT", "7")], false),
    ];
    for (ordinal, code, body, extra, succeeds) in cases {
        let fakes = StopFakes::new();
        let data = tempfile::tempdir().unwrap();
        let run = fakes.run(ordinal, data.path(), code, &body, extra);
        let case = format!("ordinal {ordinal}, {code} {body} {extra:?}: {}", run.stderr);
        assert_eq!(run.code == Some(0), succeeds, "{case}");
        assert_eq!(fakes.read("fencelock-args"), None, "removed: {case}");
        assert!(listing(data.path()).is_empty(), "{case}");
    }
}
