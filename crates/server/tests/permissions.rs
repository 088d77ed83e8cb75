//! Permissions over TLS, through real processes: rights per key prefix from
//! the configuration file, owners bound to users, and a lock of one user
//! that another cannot release, renew or shorten even with its token, while
//! an admin can force it. Each answer is checked through the Rust client
//! and through the CLI.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{fencelock, Cluster, DEADLINE};
use fencelock_client::{Client, ClientConfig, ClientError, TlsConfig};

const RULES: &str = r#"
admins = ["ops"]

[[rules]]
users = ["alice", "bob"]
prefixes = ["jobs/"]
rights = ["lock", "read"]

[[rules]]
users = ["*"]
prefixes = ["public/"]
rights = ["read"]

[[rules]]
users = ["reader"]
prefixes = ["jobs/"]
rights = ["read"]
"#;

fn user(cluster: &Cluster, certs: &Path, name: &str) -> Client {
    let mut config = ClientConfig::new(cluster.endpoints());
    config.request_timeout = Duration::from_secs(5);
    config.retry_for = DEADLINE;
    config.tls = Some(TlsConfig { certs_dir: certs.to_owned(), user: name.to_owned() });
    Client::connect(config).unwrap()
}

fn denied<T: std::fmt::Debug>(result: Result<T, ClientError>, needle: &str) {
    match result {
        Err(ClientError::PermissionDenied(message)) => {
            assert!(message.contains(needle), "expected `{needle}` in: {message}")
        }
        other => panic!("expected permission denied ({needle}), got {other:?}"),
    }
}

#[test]
fn users_act_on_their_own_locks_and_prefixes_and_admins_force() {
    let mut cluster = Cluster::configure(1);
    let certs = cluster.dir.path().join("certs");
    let dir = certs.to_str().unwrap().to_owned();
    assert!(fencelock(&["cert", "create-ca", "--certs-dir", &dir]).status.success());
    assert!(fencelock(&["cert", "create-node", "--certs-dir", &dir, "--id", "1", "127.0.0.1"])
        .status
        .success());
    for name in ["alice", "bob", "ops", "reader"] {
        assert!(fencelock(&["cert", "create-client", "--certs-dir", &dir, name]).status.success());
    }
    let config = cluster.dir.path().join("fencelock.toml");
    std::fs::write(&config, RULES).unwrap();
    cluster.nodes[0].extra_args =
        vec!["--certs-dir".into(), dir.clone(), "--config".into(), config.display().to_string()];
    cluster.launch(1);

    let alice = user(&cluster, &certs, "alice");
    let bob = user(&cluster, &certs, "bob");
    let ops = user(&cluster, &certs, "ops");
    let reader = user(&cluster, &certs, "reader");
    let minute = Duration::from_secs(60);

    // Owners are bound to users: the default one, a suffix, not another's.
    assert!(bob.owner().starts_with(b"bob/"), "{:?}", String::from_utf8_lossy(bob.owner()));
    let bobs = bob.acquire_raw(b"bob/worker-1", b"jobs/x", minute, Duration::ZERO).unwrap();
    let again = bob.acquire_raw(b"bob/worker-1", b"jobs/x", minute, Duration::ZERO).unwrap();
    assert_eq!((again.token, again.existing), (bobs.token, true), "an idempotent re-acquire");
    denied(alice.acquire_raw(b"bob/worker-1", b"jobs/y", minute, Duration::ZERO), "not user alice's");
    denied(alice.acquire_raw(b"bobby", b"jobs/y", minute, Duration::ZERO), "not user alice's");
    assert!(alice.acquire_raw(b"alice", b"jobs/y", minute, Duration::ZERO).is_ok());

    // Alice has bob's token: she still cannot release, renew or shorten it.
    denied(alice.release(b"jobs/x", bobs.token), "another user's lock: jobs/x");
    denied(alice.renew(&[(b"jobs/x".to_vec(), bobs.token)], Duration::from_secs(2)), "another user's lock");
    denied(alice.force_release(b"jobs/x"), "no `force` right on key jobs/x");
    let held = alice.get(b"jobs/x", true).unwrap().unwrap();
    assert_eq!((held.token, held.lease_ms), (bobs.token, 60_000));
    // Nor can bob shorten his own.
    let renewed = bob.renew(&[(b"jobs/x".to_vec(), bobs.token)], Duration::from_secs(2)).unwrap();
    assert!(renewed.iter().all(|(_, _, renewed)| *renewed));
    assert_eq!(alice.get(b"jobs/x", true).unwrap().unwrap().lease_ms, 60_000);

    // Rights per prefix.
    denied(alice.acquire(b"other/x", minute, Duration::ZERO), "no `lock` right on key other/x");
    denied(reader.acquire(b"jobs/z", minute, Duration::ZERO), "no `lock` right on key jobs/z");
    assert_eq!(reader.get(b"jobs/x", true).unwrap().unwrap().token, bobs.token);
    assert!(reader.check(b"jobs/x", bobs.token).unwrap());
    assert_eq!(reader.list(b"jobs/", 0).unwrap().len(), 2);
    denied(reader.list(b"", 0), "no `read` right on every key under prefix ``");
    denied(alice.get(b"secret", false), "no `read` right on key secret");
    assert_eq!(alice.get(b"public/anything", true).unwrap(), None);
    assert_eq!(ops.list(b"", 0).unwrap().len(), 2);

    // Peer addresses are for admins.
    let endpoint = cluster.client_addr(1).to_owned();
    let seen = alice.status(&endpoint).unwrap();
    assert!(seen.members.iter().all(|member| member.peer_addr.is_empty()), "{seen:?}");
    let seen = ops.status(&endpoint).unwrap();
    assert_eq!(seen.members[0].peer_addr, cluster.peer_addr(1));

    // Membership and leadership are for admins.
    denied(alice.member_list(), "membership is for admins");
    denied(alice.member_add(7, "127.0.0.1:7", "127.0.0.1:8"), "membership is for admins");
    denied(alice.member_remove(1), "membership is for admins");
    denied(alice.leader_transfer(1), "membership is for admins");
    let listed: Vec<u64> = ops.member_list().unwrap().members.iter().map(|member| member.id).collect();
    assert_eq!(listed, seen.members.iter().map(|member| member.id).collect::<Vec<_>>());

    // The same answers through the CLI.
    let endpoints = cluster.endpoints().join(",");
    let as_user = |name: &str, args: &[&str]| {
        let base = ["--endpoints", endpoints.as_str(), "--certs-dir", dir.as_str(), "--user", name, "--json"];
        fencelock(&[&base[..], args].concat())
    };
    let token = bobs.token.to_string();
    for args in [
        &["release", "jobs/x", "--token", token.as_str()][..],
        &["renew", "jobs/x", "--token", token.as_str(), "--ttl", "2s"],
        &["release", "jobs/x", "--force"],
        &["acquire", "other/x", "--ttl", "2s"],
    ] {
        let out = as_user("alice", args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(answer["kind"], "permission_denied", "{args:?}: {answer}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("permission denied"), "{out:?}");
    }
    // An --owner without the user is taken as the user's: alice cannot
    // pass for bob's owner, hers is another one.
    let out = as_user("alice", &["acquire", "jobs/x", "--ttl", "2s", "--owner", "bob/worker-1"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("held by another owner"), "{out:?}");
    let out = as_user("alice", &["acquire", "jobs/cli", "--ttl", "30s", "--owner", "w1"]);
    assert!(out.status.success(), "{out:?}");
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["owner"], "alice/w1");
    let out = as_user("alice", &["acquire", "jobs/cli", "--ttl", "30s", "--owner", "alice/w1"]);
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((again["token"].clone(), again["existing"].clone()), (answer["token"].clone(), true.into()));
    let out = as_user("alice", &["status"]);
    assert!(out.status.success(), "{out:?}");

    // The admin forces bob's lock; alice's token outlives nothing. The
    // node's audit log says who did it, and that it was done.
    let out = as_user("ops", &["release", "jobs/x", "--force"]);
    assert!(out.status.success(), "{out:?}");
    let log = cluster.log(1);
    let audit = log.lines().find(|line| line.contains("audit") && line.contains("forced release of jobs/x"));
    assert!(
        audit.is_some_and(|line| line.contains("ops") && line.contains("done")),
        "no audit line for the forced release: {audit:?}"
    );
    assert_eq!(alice.get(b"jobs/x", true).unwrap(), None);
    assert!(!bob.release(b"jobs/x", bobs.token).unwrap(), "released twice");
    // Tokens went on increasing through every refusal.
    let next = alice.acquire(b"jobs/x", minute, Duration::ZERO).unwrap();
    assert!(next.token() > answer["token"].as_u64().unwrap() && next.token() > bobs.token);
}
