//! Exit codes and the JSON shapes printed with `--json`, kept apart from
//! the commands so that tests can pin them down without a cluster.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use fencelock_client::{ClientError, Grant, LockInfo, NodeStatus};
use serde_json::{json, Value};

/// Exit code: an error (unreachable cluster, bad arguments, refusal).
pub const EXIT_ERROR: u8 = 1;
/// Exit code: not obtained (held, wait timed out, not held).
pub const EXIT_NOT_OBTAINED: u8 = 2;
/// Exit code: the lock was lost while the command ran.
pub const EXIT_LOST: u8 = 3;

/// How a command that did not fail ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Done,
    NotObtained,
    Lost,
    /// `lock` passes on its command's exit code.
    Child(u8),
    /// Failed, with the output already printed (`status` when no node
    /// answered).
    Failed,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Done => 0,
            Exit::NotObtained => EXIT_NOT_OBTAINED,
            Exit::Lost => EXIT_LOST,
            Exit::Child(code) => code,
            Exit::Failed => EXIT_ERROR,
        }
    }
}

/// The exit code for a command that failed with `error`: 2 when the lock
/// was simply not obtained, else 1.
pub fn error_exit_code(error: &anyhow::Error) -> u8 {
    match client_error(error) {
        Some(client_error) if client_error.is_not_obtained() => EXIT_NOT_OBTAINED,
        _ => EXIT_ERROR,
    }
}

/// The exit code that passes on a child's status, shell style: its own code,
/// or 128+N when signal N killed it.
pub fn child_exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(EXIT_ERROR),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(EXIT_ERROR),
        (None, None) => EXIT_ERROR,
    }
}

fn client_error(error: &anyhow::Error) -> Option<&ClientError> {
    error.chain().find_map(|cause| cause.downcast_ref::<ClientError>())
}

/// `{"error", "kind", "holder_token"}`: `kind` is the client error's code
/// (`held`, `wait_timed_out`, `invalid_argument`, `unavailable`, `internal`)
/// or `error` for anything else; `holder_token` only when known.
pub fn error_json(error: &anyhow::Error) -> Value {
    let mut value = json!({ "error": format!("{error:#}") });
    let cause = client_error(error);
    value["kind"] = json!(cause.map_or("error", ClientError::code));
    if let Some(token) = cause.and_then(ClientError::holder_token) {
        value["holder_token"] = json!(token);
    }
    value
}

/// `fencelock acquire`: `{"key", "token", "lease_ms", "owner", "existing"}`
/// (`existing`: the owner held the lock already, and `token` is the one
/// granted then).
pub fn acquire_json(key: &str, grant: &Grant, owner: &[u8]) -> Value {
    json!({
        "key": key,
        "token": grant.token,
        "lease_ms": millis(grant.lease),
        "owner": String::from_utf8_lossy(owner),
        "existing": grant.existing,
    })
}

/// `fencelock lock`, after the command: `{"key", "token", "lease_ms",
/// "exit_code", "lost", "lost_reason"}`.
pub fn lock_json(key: &str, token: u64, lease: Duration, exit: Exit, lost_reason: Option<&str>) -> Value {
    json!({
        "key": key,
        "token": token,
        "lease_ms": millis(lease),
        "exit_code": exit.code(),
        "lost": lost_reason.is_some(),
        "lost_reason": lost_reason,
    })
}

/// `fencelock release`: `{"key", "token", "force", "released"}` (`token`
/// is null with `--force`).
pub fn release_json(key: &str, token: Option<u64>, force: bool, released: bool) -> Value {
    json!({ "key": key, "token": token, "force": force, "released": released })
}

/// `fencelock renew`: `{"key", "token", "lease_ms", "renewed"}`.
pub fn renew_json(key: &str, token: u64, lease: Duration, renewed: bool) -> Value {
    json!({ "key": key, "token": token, "lease_ms": millis(lease), "renewed": renewed })
}

/// `fencelock get`: `{"key", "holder"}`, `holder` null when free, else
/// `{"key", "token", "owner", "lease_ms"}`.
pub fn get_json(key: &str, holder: Option<&LockInfo>) -> Value {
    json!({ "key": key, "holder": holder })
}

/// `fencelock check`: `{"key", "token", "holds"}`.
pub fn check_json(key: &str, token: u64, holds: bool) -> Value {
    json!({ "key": key, "token": token, "holds": holds })
}

/// `fencelock list`: `{"prefix", "locks": [{"key", "token", "owner", "lease_ms"}]}`.
pub fn list_json(prefix: &str, locks: &[LockInfo]) -> Value {
    json!({ "prefix": prefix, "locks": locks })
}

/// `fencelock status`: `{"nodes": [...]}`, one object per endpoint: the
/// endpoint and either every status field (`node_id`, `role`, `term`,
/// `leader_id`, `leader_addr`, `commit_index`, `applied_index`,
/// `last_index`, `snapshot_index`, `snapshot_bytes`, `locks`, `last_token`,
/// `members`, `rejoining`) or `error`.
pub fn status_json(nodes: &[(String, Result<NodeStatus, String>)]) -> Value {
    let nodes: Vec<Value> = nodes
        .iter()
        .map(|(endpoint, answer)| {
            let mut node = match answer {
                Ok(status) => json!(status),
                Err(error) => json!({ "error": error }),
            };
            node["endpoint"] = json!(endpoint);
            node
        })
        .collect();
    json!({ "nodes": nodes })
}

/// A lease as a human reads it: `10s`, `1m 30s`, `500ms`.
pub fn human(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use anyhow::Context;
    use fencelock_client::Member;

    use super::*;

    #[test]
    fn acquire_prints_key_token_lease_owner_and_whether_it_was_held_already() {
        let grant = Grant { token: 42, lease: Duration::from_secs(10), existing: false };
        let value = acquire_json("jobs/x", &grant, b"worker-1");
        assert_eq!(
            value,
            json!({"key": "jobs/x", "token": 42, "lease_ms": 10_000, "owner": "worker-1", "existing": false})
        );
        let again = acquire_json("jobs/x", &Grant { existing: true, ..grant }, b"worker-1");
        assert_eq!(again["existing"], json!(true));
        assert_eq!(again["token"], json!(42));
    }

    #[test]
    fn not_obtained_exits_2_and_other_errors_exit_1() {
        let held =
            anyhow::Error::new(ClientError::Held { holder_token: Some(5) }).context("cannot acquire k");
        assert_eq!(error_exit_code(&held), 2);
        let timed_out: anyhow::Result<()> =
            Err(ClientError::WaitTimedOut { holder_token: None }).context("cannot acquire k");
        assert_eq!(error_exit_code(&timed_out.unwrap_err()), 2);
        let unavailable =
            anyhow::Error::new(ClientError::Unavailable("no leader".into())).context("cannot get k");
        assert_eq!(error_exit_code(&unavailable), 1);
        assert_eq!(error_exit_code(&anyhow::anyhow!("cannot run the command")), 1);
        assert_eq!([Exit::Done, Exit::NotObtained, Exit::Lost, Exit::Child(7)].map(Exit::code), [0, 2, 3, 7]);
    }

    #[test]
    fn a_child_status_passes_through_and_signals_become_128_plus_n() {
        assert_eq!(child_exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(child_exit_code(ExitStatus::from_raw(3 << 8)), 3);
        // A raw wait status of 9 means "killed by signal 9".
        assert_eq!(child_exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(child_exit_code(ExitStatus::from_raw(15)), 143);
    }

    #[test]
    fn errors_in_json_carry_their_kind_and_holder() {
        let held =
            anyhow::Error::new(ClientError::Held { holder_token: Some(5) }).context("cannot acquire k");
        assert_eq!(
            error_json(&held),
            json!({"error": "cannot acquire k: lock is held by another owner (holder token 5)", "kind": "held", "holder_token": 5})
        );
        assert_eq!(error_json(&anyhow::anyhow!("boom")), json!({"error": "boom", "kind": "error"}));
    }

    #[test]
    fn read_shapes() {
        let info = LockInfo { key: b"a".to_vec(), token: 3, owner: b"o".to_vec(), lease_ms: 100 };
        assert_eq!(get_json("a", None), json!({"key": "a", "holder": null}));
        assert_eq!(
            get_json("a", Some(&info)),
            json!({"key": "a", "holder": {"key": "a", "token": 3, "owner": "o", "lease_ms": 100}})
        );
        assert_eq!(list_json("", std::slice::from_ref(&info))["locks"][0]["token"], json!(3));
        assert_eq!(check_json("a", 3, false), json!({"key": "a", "token": 3, "holds": false}));
        assert_eq!(
            release_json("a", None, true, true),
            json!({"key": "a", "token": null, "force": true, "released": true})
        );
        assert_eq!(
            renew_json("a", 3, Duration::from_secs(1), true),
            json!({"key": "a", "token": 3, "lease_ms": 1000, "renewed": true})
        );
        let lost = lock_json("a", 3, Duration::from_secs(1), Exit::Lost, Some("gone"));
        assert_eq!((lost["exit_code"].clone(), lost["lost"].clone()), (json!(3), json!(true)));
    }

    #[test]
    fn status_lists_every_node_with_an_error_for_unreachable_ones() {
        let status = NodeStatus {
            node_id: 1,
            role: "leader".into(),
            term: 4,
            leader_id: 1,
            leader_addr: "h:7101".into(),
            commit_index: 9,
            applied_index: 9,
            last_index: 9,
            snapshot_index: 0,
            snapshot_bytes: 0,
            locks: 2,
            last_token: 5,
            members: vec![Member { id: 1, peer_addr: "h:7201".into(), client_addr: "h:7101".into() }],
            rejoining: true,
            cluster_id: "0123456789abcdef0123456789abcdef".into(),
        };
        let value = status_json(&[
            ("h:7101".into(), Ok(status)),
            ("h:7102".into(), Err("connection refused".into())),
        ]);
        assert_eq!(value["nodes"][0]["endpoint"], json!("h:7101"));
        assert_eq!(value["nodes"][0]["role"], json!("leader"));
        assert_eq!(value["nodes"][0]["members"][0]["peer_addr"], json!("h:7201"));
        assert_eq!(value["nodes"][0]["rejoining"], json!(true));
        assert_eq!(value["nodes"][0]["cluster_id"], json!("0123456789abcdef0123456789abcdef"));
        assert_eq!(value["nodes"][1], json!({"endpoint": "h:7102", "error": "connection refused"}));
    }
}
