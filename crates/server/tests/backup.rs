//! Backup and restore through real processes: `fencelock snapshot save`
//! against a running cluster, a new cluster started with `fencelockd
//! --restore` on every node, the saved locks with their tokens and owners
//! in it, and tokens going on above both the saved counter and what the
//! old cluster issued after the backup. Also what is refused: a restore
//! into a data directory that holds data, a damaged file, and backup
//! requests naming backups that do not exist.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{fencelock, Cluster, DEADLINE};
use fencelock_client::{Client, ClientError};
use fencelock_launch::Stopped;
use fencelock_net::{read_frame, write_frame};
use fencelock_types::client_pb::{
    BackupRequest, ErrorCode, Request, Request_oneof_kind, Response, Response_oneof_kind,
};

const LEASE: Duration = Duration::from_secs(600);

/// Long keys, so that a few thousand locks take more than one backup chunk
/// (1 MiB).
fn big_key(n: usize) -> String {
    format!("bulk/{n:06}/{}", "k".repeat(900))
}

/// Acquires `count` locks of long keys, on a few threads.
fn fill(client: &Client, count: usize) {
    std::thread::scope(|scope| {
        for thread in 0..8 {
            scope.spawn(move || {
                for n in (thread..count).step_by(8) {
                    client.acquire_raw(b"bulk-owner", big_key(n), LEASE, Duration::ZERO).unwrap();
                }
            });
        }
    });
}

/// Waits for node `id`'s process to exit; returns its exit code.
fn exit_code(cluster: &mut Cluster, id: u64) -> i32 {
    let child = cluster.nodes[(id - 1) as usize].child.take().unwrap();
    match child.wait_until(Instant::now() + DEADLINE).unwrap() {
        Stopped::Exited(status) => status.code().unwrap_or(-1),
        Stopped::Killed => panic!("node {id} did not exit\n{}", cluster.logs()),
    }
}

fn cluster_id(cluster: &Cluster, client: &Client, id: u64) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Ok(status) = client.status(cluster.client_addr(id)) {
            if !status.cluster_id.is_empty() {
                return status.cluster_id;
            }
        }
        assert!(Instant::now() < deadline, "node {id} never named its cluster\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_saved_table_seeds_a_new_cluster_whose_tokens_go_on_above_everything_issued() {
    let files = tempfile::tempdir().unwrap();
    let file = files.path().join("backup.flkt");
    let file_arg = file.to_str().unwrap();

    let mut old = Cluster::start(3);
    let client = old.client();
    old.leader(&client);
    let old_id = cluster_id(&old, &client, 1);
    fill(&client, 1_300);
    let mut saved = Vec::new();
    for (key, owner) in [("jobs/a", "alice"), ("jobs/b", "bob"), ("jobs/c", "carol")] {
        let grant = client.acquire_raw(owner.as_bytes(), key, LEASE, Duration::ZERO).unwrap();
        saved.push((key, owner, grant.token));
    }
    // A lock released before the backup is not in it.
    let gone = client.acquire_raw(b"dave", "jobs/gone", LEASE, Duration::ZERO).unwrap();
    assert!(client.release("jobs/gone", gone.token).unwrap());
    let saved_last = gone.token;

    // Asked of a follower: it follows the leader.
    let leader = old.leader(&client);
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let endpoints = format!("{},{}", old.client_addr(follower), old.client_addr(leader));
    let save = fencelock(&["--endpoints", &endpoints, "--json", "snapshot", "save", file_arg]);
    let stdout = String::from_utf8_lossy(&save.stdout);
    let stderr = String::from_utf8_lossy(&save.stderr);
    assert_eq!(save.status.code(), Some(0), "{stdout}\n{stderr}\n{}", old.logs());
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let bytes = std::fs::metadata(&file).unwrap().len();
    assert_eq!(json["file"], file_arg);
    assert_eq!(json["locks"], 1_303);
    assert_eq!(json["last_token"], saved_last);
    assert_eq!(json["bytes"], bytes);
    assert!(bytes > 1 << 20, "{bytes} bytes: one chunk, so chunking went untested");
    // Grants are batched into log entries, so the index is well below the lock count.
    assert!(json["index"].as_u64().unwrap() > 3, "{json}");
    // Only the backup is left in the directory: no temporary file.
    assert_eq!(std::fs::read_dir(files.path()).unwrap().count(), 1);

    // Never over an existing file, unless --force; plain output.
    let again = fencelock(&["--endpoints", &endpoints, "snapshot", "save", file_arg]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists; pass --force"), "{again:?}");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), bytes);
    let forced = fencelock(&["--endpoints", &endpoints, "snapshot", "save", file_arg, "--force"]);
    let plain = String::from_utf8_lossy(&forced.stdout);
    assert_eq!(forced.status.code(), Some(0), "{forced:?}");
    assert!(
        plain.starts_with(&format!("saved {file_arg}: 1303 locks, last token {saved_last}, index ")),
        "{plain}"
    );
    assert!(plain.trim_end().ends_with(&format!("{bytes} bytes")), "{plain}");

    // The old cluster goes on issuing tokens after the backup.
    let after = client.acquire_raw(b"erin", "jobs/after", LEASE, Duration::ZERO).unwrap().token;
    assert!(after > saved_last);
    for id in 1..=3 {
        old.kill(id);
    }

    let mut new = Cluster::configure(3);
    for node in &mut new.nodes {
        node.extra_args = vec!["--restore".into(), file_arg.into()];
    }
    for id in 1..=3 {
        new.launch(id);
    }
    let client = new.client();
    new.leader(&client);
    for id in 1..=3 {
        let log = new.log(id);
        assert!(
            log.contains("restored the lock table from a backup") && log.contains("locks: 1303"),
            "{log}"
        );
    }
    for (key, owner, token) in &saved {
        let lock = client.get(key, true).unwrap().unwrap_or_else(|| panic!("{key} is not restored"));
        assert_eq!((lock.token, lock.owner.as_slice()), (*token, owner.as_bytes()), "{key}");
        assert!(client.check(key, *token).unwrap());
    }
    assert_eq!(client.get("jobs/after", true).unwrap(), None, "a lock taken after the backup came back");
    assert_eq!(client.get("jobs/gone", true).unwrap(), None);
    assert_eq!(client.list("jobs/", 0).unwrap().len(), 3);
    assert_eq!(client.list("bulk/", 0).unwrap().len(), 1_300);
    // The holder of a restored lock still holds it: its retry gets its token.
    let retry = client.acquire_raw(b"alice", "jobs/a", LEASE, Duration::ZERO).unwrap();
    assert_eq!((retry.token, retry.existing), (saved[0].2, true));
    // New grants: above the saved counter, and above what the old cluster
    // issued after the backup (the new cluster's clock floor).
    let fresh = client.acquire_raw(b"frank", "jobs/new", LEASE, Duration::ZERO).unwrap().token;
    assert!(fresh > saved_last && fresh > after, "token {fresh} is not above {saved_last} and {after}");
    // A new cluster, with a name of its own.
    let new_id = cluster_id(&new, &client, 1);
    assert_ne!(new_id, old_id);

    // A restart with --restore still given is refused, and says what to do.
    new.kill(1);
    new.launch(1);
    assert_eq!(exit_code(&mut new, 1), 1, "{}", new.log(1));
    let log = new.log(1);
    let data_dir = new.data_dir(1);
    let expected =
        format!("--restore needs an empty data directory; {} holds node 1's data", data_dir.display());
    assert!(log.contains(&expected), "{log}");
    // Without it the node starts on its data and the cluster serves on.
    new.nodes[0].extra_args.clear();
    new.launch(1);
    let deadline = Instant::now() + DEADLINE;
    while client.status(new.client_addr(1)).map_or(true, |status| status.cluster_id != new_id) {
        assert!(Instant::now() < deadline, "node 1 did not come back\n{}", new.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(client.check("jobs/new", fresh).unwrap());
}

#[test]
fn a_damaged_backup_is_refused_at_start() {
    let mut table = fencelock_fsm::LockTable::new();
    table.apply(fencelock_types::Command::Grant {
        session: None,
        key: fencelock_types::Key::new(b"jobs/a".to_vec()).unwrap(),
        lease_ms: fencelock_types::LeaseMs::new(60_000).unwrap(),
        owner: fencelock_types::Owner::new(b"alice".to_vec()).unwrap(),
        value: fencelock_types::Value::none(),
    });
    let mut bytes = table.snapshot();
    let middle = bytes.len() / 2 + 10;
    bytes[middle] ^= 0x01;
    let mut cluster = Cluster::configure(3);
    let file = cluster.dir.path().join("damaged.flkt");
    std::fs::write(&file, &bytes).unwrap();
    cluster.nodes[0].extra_args = vec!["--restore".into(), file.to_str().unwrap().into()];
    cluster.launch(1);
    assert_eq!(exit_code(&mut cluster, 1), 1, "{}", cluster.log(1));
    let log = cluster.log(1);
    assert!(
        log.contains(&format!("--restore: {} is not a whole lock-table backup", file.display()))
            && log.contains("checksum mismatch"),
        "{log}"
    );
    // Not a backup at all, and a file that is not there.
    std::fs::write(&file, b"not a backup").unwrap();
    cluster.launch(1);
    assert_eq!(exit_code(&mut cluster, 1), 1);
    assert!(cluster.log(1).contains("shorter than its 20-byte header"), "{}", cluster.log(1));
    cluster.nodes[0].extra_args = vec!["--restore".into(), "/nonexistent/backup.flkt".into()];
    cluster.launch(1);
    assert_eq!(exit_code(&mut cluster, 1), 1);
    assert!(cluster.log(1).contains("--restore: cannot read /nonexistent/backup.flkt"), "{}", cluster.log(1));
    assert!(!data_holds_a_store(&cluster.data_dir(1)), "a refused restore wrote the store");
}

/// Whether the store in `data_dir` holds anything: a snapshot file would
/// be the seed's.
fn data_holds_a_store(data_dir: &Path) -> bool {
    std::fs::read_dir(data_dir.join("raft").join("snapshots")).is_ok_and(|mut files| files.next().is_some())
}

/// One request on a connection of its own, and its answer.
fn ask(addr: &str, connection: &mut Option<TcpStream>, id: u64, backup_id: u64, offset: u64) -> Response {
    let stream = connection.get_or_insert_with(|| {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        stream
    });
    let request = Request {
        id,
        kind: Some(Request_oneof_kind::backup(BackupRequest { backup_id, offset, ..Default::default() })),
        ..Default::default()
    };
    write_frame(stream, &request).unwrap();
    let response: Response = read_frame(stream, 16 << 20).unwrap();
    assert_eq!(response.id, id);
    response
}

fn refused(response: &Response) -> (ErrorCode, String) {
    let error = response.error.as_ref().unwrap_or_else(|| panic!("not refused: {:?}", response.kind));
    (error.code, error.message.clone())
}

#[test]
fn bogus_backup_requests_get_clear_errors_and_the_node_serves_on() {
    let cluster = Cluster::start(1);
    let client = cluster.client();
    cluster.leader(&client);
    fill(&client, 1_300);
    let addr = cluster.client_addr(1).to_owned();
    let mut connection = None;

    // Backups that never were, and offsets anywhere.
    for (backup_id, offset) in [(1, 0), (12_345, 0), (u64::MAX, u64::MAX), (7, 1 << 40)] {
        let (code, message) = refused(&ask(&addr, &mut connection, 1, backup_id, offset));
        assert_eq!(code, ErrorCode::INVALID_ARGUMENT);
        assert_eq!(message, format!("backup {backup_id} is unknown or expired; start again"));
    }
    let (code, message) = refused(&ask(&addr, &mut connection, 2, 0, 99));
    assert_eq!(code, ErrorCode::INVALID_ARGUMENT);
    assert!(message.contains("starts at offset 0"), "{message}");

    // Two backups begun and left unread: a third is refused until one is
    // read to its end.
    let first = ask(&addr, &mut connection, 3, 0, 0);
    let Some(Response_oneof_kind::backup(first)) = first.kind else { panic!("{first:?}") };
    assert_eq!(first.offset, 0);
    assert_eq!(first.chunk.len(), 1 << 20);
    assert!(first.total_bytes > 1 << 20);
    assert_eq!(first.locks, 1_300);
    let total = first.total_bytes;
    let (code, message) = refused(&ask(&addr, &mut connection, 4, first.backup_id, total));
    assert_eq!(code, ErrorCode::INVALID_ARGUMENT);
    assert_eq!(
        message,
        format!("offset {total} is past the end of backup {} ({total} bytes)", first.backup_id)
    );
    let second = ask(&addr, &mut connection, 5, 0, 0);
    assert!(second.error.is_none(), "{second:?}");
    let (code, message) = refused(&ask(&addr, &mut connection, 6, 0, 0));
    assert_eq!(code, ErrorCode::RESOURCE_EXHAUSTED);
    assert!(message.contains("2 backups are under way"), "{message}");
    assert!(matches!(client.backup(&mut Vec::new()), Err(ClientError::ResourceExhausted(_))));

    // The node serves on meanwhile.
    let grant = client.acquire_raw(b"o", "jobs/during", LEASE, Duration::ZERO).unwrap();
    assert!(client.check("jobs/during", grant.token).unwrap());

    // The rest of the first backup, then its place is free again.
    let rest = ask(&addr, &mut connection, 7, first.backup_id, 1 << 20);
    let Some(Response_oneof_kind::backup(rest)) = rest.kind else { panic!("{rest:?}") };
    assert_eq!(rest.offset + rest.chunk.len() as u64, total);
    let (code, _) = refused(&ask(&addr, &mut connection, 8, first.backup_id, 0));
    assert_eq!(code, ErrorCode::INVALID_ARGUMENT, "a backup read to its end is dropped");
    let mut bytes = Vec::new();
    let info = client.backup(&mut bytes).unwrap();
    assert_eq!((info.locks, info.bytes), (1_301, bytes.len() as u64));
    let table = fencelock_fsm::LockTable::restore(&bytes).unwrap();
    assert_eq!(table.holder(b"jobs/during").map(|lock| lock.token.get()), Some(grant.token));
    assert_eq!(table.last_token().map(fencelock_types::FencingToken::get), Some(info.last_token));
}
