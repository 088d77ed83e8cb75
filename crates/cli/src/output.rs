//! Exit codes and the JSON shapes printed with `--json`, kept apart from
//! the commands so that tests can pin them down without a cluster.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use fencelock_client::{ClientError, Grant, LockInfo, NodeStatus, Released, Session};
use serde::Serialize;
use serde_json::{json, Value};

/// Exit code: an error (unreachable cluster, bad arguments, refusal).
pub const EXIT_ERROR: u8 = 1;
/// Exit code: not obtained (held, wait timed out, not held).
pub const EXIT_NOT_OBTAINED: u8 = 2;
/// Exit code: the lock was lost while the command ran.
pub const EXIT_LOST: u8 = 3;
/// Exit code: the session is not open (closed, or it lapsed): `session
/// keepalive`, `session close`, `acquire --session`.
pub const EXIT_NO_SESSION: u8 = 4;
/// Exit code of `status` when nodes answered but the cluster cannot serve:
/// no leader answered, or the leader has no quorum. The same as "not
/// obtained": the question was asked and the answer is no.
pub const EXIT_NO_QUORUM: u8 = 2;

/// How a command that did not fail ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Done,
    NotObtained,
    /// `lock` passes on its command's exit code.
    Child(u8),
    /// Failed, with the output already printed (`status` when no node
    /// answered).
    Failed,
    /// `status`: nodes answered, but no leader did, or the leader has no
    /// quorum.
    NoQuorum,
    /// A code the user chose (`lock --conflict-exit-code`,
    /// `--lost-exit-code`).
    Code(u8),
    /// `session keepalive` or `close`: the session is not open.
    NoSession,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Done => 0,
            Exit::NotObtained => EXIT_NOT_OBTAINED,
            Exit::Child(code) => code,
            Exit::Failed => EXIT_ERROR,
            Exit::NoQuorum => EXIT_NO_QUORUM,
            Exit::Code(code) => code,
            Exit::NoSession => EXIT_NO_SESSION,
        }
    }
}

/// The exit code for a command that failed with `error`: 2 when the lock
/// was simply not obtained, 4 when the session it was asked under is not
/// open, else 1.
pub fn error_exit_code(error: &anyhow::Error) -> u8 {
    match client_error(error) {
        Some(client_error) if client_error.is_not_obtained() => EXIT_NOT_OBTAINED,
        Some(ClientError::NoSession(_)) => EXIT_NO_SESSION,
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

/// `fencelock acquire --session ID`: [`acquire_json`] and `"session"`.
pub fn acquire_in_json(key: &str, grant: &Grant, owner: &[u8], session: u64) -> Value {
    let mut value = acquire_json(key, grant, owner);
    value["session"] = json!(session);
    value
}

/// `fencelock session open`: `{"session", "ttl_ms", "owner"}`.
pub fn session_open_json(session: &Session, owner: &[u8]) -> Value {
    json!({ "session": session.id, "ttl_ms": millis(session.ttl), "owner": String::from_utf8_lossy(owner) })
}

/// `fencelock session keepalive`: `{"session", "ttl_ms", "kept_alive"}`
/// (`ttl_ms` 0 when not kept alive: the session is not open).
pub fn session_keepalive_json(session: u64, ttl: Duration, kept_alive: bool) -> Value {
    json!({ "session": session, "ttl_ms": millis(ttl), "kept_alive": kept_alive })
}

/// `fencelock session close`: `{"session", "closed"}` (`closed` false: it
/// was not open).
pub fn session_close_json(session: u64, closed: bool) -> Value {
    json!({ "session": session, "closed": closed })
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

/// `fencelock release`: `{"key", "token", "force", "released",
/// "holder_token"}` (`token`
/// is null with `--force`).
/// `holder_token`: when not released, the token that holds the key (null:
/// free, or released).
pub fn release_json(key: &str, token: Option<u64>, force: bool, outcome: Released) -> Value {
    json!({
        "key": key,
        "token": token,
        "force": force,
        "released": outcome.released,
        "holder_token": outcome.holder_token,
    })
}

/// `fencelock renew`: `{"key", "token", "lease_ms", "renewed",
/// "holder_token"}` (`holder_token`: when not renewed, the token that
/// holds the key; null: free, or renewed).
pub fn renew_json(key: &str, token: u64, lease: Duration, renewed: bool, holder_token: Option<u64>) -> Value {
    json!({ "key": key, "token": token, "lease_ms": millis(lease), "renewed": renewed, "holder_token": holder_token })
}

/// `fencelock get`: `{"key", "holder"}`, `holder` null when free, else
/// `{"key", "token", "owner", "lease_ms", ...}`; for a read-write lock or a
/// semaphore also `"holders"`, every holder (`holder` is the first).
pub fn get_json(key: &str, holders: &[LockInfo]) -> Value {
    match holders {
        [] => json!({ "key": key, "holder": null }),
        [one] if one.share == fencelock_client::ShareKind::Exclusive => json!({ "key": key, "holder": one }),
        all => json!({ "key": key, "holder": all[0], "holders": all }),
    }
}

/// `fencelock check`: `{"key", "token", "holds"}`.
pub fn check_json(key: &str, token: u64, holds: bool) -> Value {
    json!({ "key": key, "token": token, "holds": holds })
}

/// `fencelock list`: `{"prefix", "locks": [{"key", "token", "owner", "lease_ms"}]}`.
pub fn list_json(prefix: &str, locks: &[LockInfo]) -> Value {
    json!({ "prefix": prefix, "locks": locks })
}

/// The cluster as `fencelock status` sums it up: from the leader's own
/// answer, since only the leader hears from every member (a follower hears
/// only from its leader).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The leader's id; `None` when no leader answered.
    pub leader: Option<u64>,
    /// The leader's client address, as it tells clients.
    pub leader_addr: Option<String>,
    /// Members the leader heard from within an election timeout, itself
    /// included; without a leader, as many as the answer that reaches the
    /// most says.
    pub reachable: usize,
    pub members: usize,
    /// The leader reaches a majority of the voters: it can commit. Never
    /// true without a leader.
    pub quorum: bool,
}

impl Summary {
    /// Sums up `answers`: the leader of the highest term among them, or
    /// without one the answer that reaches the most members.
    pub fn of<'a>(answers: impl IntoIterator<Item = &'a NodeStatus>) -> Summary {
        let answers: Vec<&NodeStatus> = answers.into_iter().collect();
        let reached = |status: &NodeStatus| status.members.iter().filter(|member| member.reachable).count();
        let leader = answers.iter().filter(|status| status.role == "leader").max_by_key(|status| status.term);
        match leader {
            Some(leader) => {
                let own_addr = leader.members.iter().find(|member| member.id == leader.node_id);
                let addr = match own_addr.map(|member| member.client_addr.as_str()) {
                    Some(addr) if !addr.is_empty() => addr,
                    _ => leader.leader_addr.as_str(),
                };
                Summary {
                    leader: Some(leader.node_id),
                    leader_addr: Some(addr.to_owned()).filter(|addr| !addr.is_empty()),
                    reachable: reached(leader),
                    members: leader.members.len(),
                    quorum: leader.quorum,
                }
            }
            None => {
                // `max_by_key` takes the last of equals: the first is wanted.
                let widest = answers.iter().rev().max_by_key(|status| reached(status));
                Summary {
                    leader: None,
                    leader_addr: None,
                    reachable: widest.map_or(0, |status| reached(status)),
                    members: widest.map_or(0, |status| status.members.len()),
                    quorum: false,
                }
            }
        }
    }

    /// A leader answered, and it has a quorum.
    pub fn serves(&self) -> bool {
        self.leader.is_some() && self.quorum
    }

    /// `leader: 1 (h:7101)  reachable: 3/3 members  quorum: yes`, or
    /// `leader: none  ...`.
    pub fn line(&self) -> String {
        let leader = match (self.leader, &self.leader_addr) {
            (Some(id), Some(addr)) => format!("{id} ({addr})"),
            (Some(id), None) => id.to_string(),
            (None, _) => "none".to_owned(),
        };
        format!(
            "leader: {leader}  reachable: {}/{} members  quorum: {}",
            self.reachable,
            self.members,
            if self.quorum { "yes" } else { "no" }
        )
    }
}

/// What a node's status line adds after its indexes: ` rejoining (...)`,
/// ` starting (waiting for peers 2, 3)`, or nothing.
pub fn status_notes(status: &NodeStatus) -> String {
    let mut notes = String::new();
    if status.rejoining {
        notes.push_str(" rejoining (lost its data; not voting until caught up)");
    }
    if status.starting {
        notes.push_str(" starting");
        if !status.waiting_for.is_empty() {
            let peers: Vec<String> = status.waiting_for.iter().map(u64::to_string).collect();
            notes.push_str(&format!(" (waiting for peers {})", peers.join(", ")));
        }
    }
    notes
}

/// `fencelock status`: `{"nodes": [...], "summary": {...}}`. `nodes` has
/// one object per endpoint: the endpoint and either every status field
/// (`node_id`, `role`, `term`, `leader_id`, `leader_addr`, `commit_index`,
/// `applied_index`, `last_index`, `snapshot_index`, `snapshot_bytes`,
/// `locks`, `last_token`, `members` (each `id`, `peer_addr`, `client_addr`,
/// `reachable`, `role`), `rejoining`, `cluster_id`, `starting`,
/// `waiting_for`, `quorum`) or `error`. `summary` is the [`Summary`]:
/// `leader` (null when none answered), `leader_addr`, `reachable`,
/// `members`, `quorum`.
pub fn status_json(nodes: &[(String, Result<NodeStatus, String>)], summary: &Summary) -> Value {
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
    json!({ "nodes": nodes, "summary": summary })
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
    fn sessions_print_their_id_and_ttl_and_a_missing_session_exits_4() {
        let session = Session { id: 12, ttl: Duration::from_secs(10) };
        assert_eq!(session_open_json(&session, b"w"), json!({"session": 12, "ttl_ms": 10_000, "owner": "w"}));
        assert_eq!(
            session_keepalive_json(12, Duration::from_secs(10), true),
            json!({"session": 12, "ttl_ms": 10_000, "kept_alive": true})
        );
        assert_eq!(session_close_json(12, false), json!({"session": 12, "closed": false}));
        let grant = Grant { token: 42, lease: Duration::from_secs(10), existing: false };
        assert_eq!(
            acquire_in_json("k", &grant, b"w", 12),
            json!({"key": "k", "token": 42, "lease_ms": 10_000, "owner": "w", "existing": false, "session": 12})
        );
        let gone = anyhow::Error::new(ClientError::NoSession("session 12 is not open".into()))
            .context("cannot acquire k");
        assert_eq!(error_exit_code(&gone), 4);
        assert_eq!(error_json(&gone)["kind"], json!("no_session"));
        assert_eq!(Exit::NoSession.code(), 4);
        // A holder under a session shows it; others do not change.
        let info = LockInfo {
            key: b"a".to_vec(),
            token: 3,
            owner: b"o".to_vec(),
            lease_ms: 100,
            remaining_ms: 60,
            delayed: false,
            value: Vec::new(),
            share: fencelock_client::ShareKind::Exclusive,
            permits: 0,
            session: Some(12),
        };
        assert_eq!(get_json("a", std::slice::from_ref(&info))["holder"]["session"], json!(12));
        assert_eq!(list_json("", std::slice::from_ref(&info))["locks"][0]["session"], json!(12));
        let own = LockInfo { session: None, ..info };
        assert!(get_json("a", &[own])["holder"].get("session").is_none());
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
        assert_eq!(
            [Exit::Done, Exit::NotObtained, Exit::Code(EXIT_LOST), Exit::Child(7)].map(Exit::code),
            [0, 2, 3, 7]
        );
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
        let info = LockInfo {
            key: b"a".to_vec(),
            token: 3,
            owner: b"o".to_vec(),
            lease_ms: 100,
            remaining_ms: 60,
            delayed: false,
            value: Vec::new(),
            share: fencelock_client::ShareKind::Exclusive,
            permits: 0,
            session: None,
        };
        assert_eq!(get_json("a", &[]), json!({"key": "a", "holder": null}));
        assert_eq!(
            get_json("a", std::slice::from_ref(&info)),
            json!({"key": "a", "holder": {"key": "a", "token": 3, "owner": "o", "lease_ms": 100, "remaining_ms": 60, "delayed": false, "value": "", "share": "exclusive", "permits": 0}})
        );
        let readers = [
            LockInfo { share: fencelock_client::ShareKind::Read, ..info.clone() },
            LockInfo { token: 4, share: fencelock_client::ShareKind::Read, ..info.clone() },
        ];
        let shared = get_json("a", &readers);
        assert_eq!(
            (shared["holder"]["token"].clone(), shared["holder"]["share"].clone()),
            (json!(3), json!("read"))
        );
        assert_eq!(shared["holders"].as_array().map(Vec::len), Some(2));
        assert_eq!(shared["holders"][1]["token"], json!(4));
        // One reader is still a read-write lock: "holders" says so.
        assert_eq!(get_json("a", &readers[..1])["holders"].as_array().map(Vec::len), Some(1));
        assert_eq!(list_json("", std::slice::from_ref(&info))["locks"][0]["token"], json!(3));
        assert_eq!(check_json("a", 3, false), json!({"key": "a", "token": 3, "holds": false}));
        assert_eq!(
            release_json("a", None, true, Released { released: true, holder_token: None }),
            json!({"key": "a", "token": null, "force": true, "released": true, "holder_token": null})
        );
        assert_eq!(
            release_json("a", Some(3), false, Released { released: false, holder_token: Some(9) }),
            json!({"key": "a", "token": 3, "force": false, "released": false, "holder_token": 9})
        );
        assert_eq!(
            renew_json("a", 3, Duration::from_secs(1), true, None),
            json!({"key": "a", "token": 3, "lease_ms": 1000, "renewed": true, "holder_token": null})
        );
        assert_eq!(renew_json("a", 3, Duration::from_secs(1), false, Some(9))["holder_token"], json!(9));
        let lost = lock_json("a", 3, Duration::from_secs(1), Exit::Code(EXIT_LOST), Some("gone"));
        assert_eq!((lost["exit_code"].clone(), lost["lost"].clone()), (json!(3), json!(true)));
    }

    fn member(id: u64, reachable: bool) -> Member {
        Member {
            id,
            peer_addr: format!("h:720{id}"),
            client_addr: format!("h:710{id}"),
            reachable,
            role: "voter".into(),
        }
    }

    /// Node `id`'s answer in a cluster of three led by node 1.
    fn node(id: u64, role: &str, reachable: &[u64]) -> NodeStatus {
        NodeStatus {
            node_id: id,
            role: role.into(),
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
            members: (1..=3).map(|member_id| member(member_id, reachable.contains(&member_id))).collect(),
            rejoining: false,
            cluster_id: "0123456789abcdef0123456789abcdef".into(),
            starting: false,
            waiting_for: vec![],
            quorum: reachable.len() >= 2,
        }
    }

    #[test]
    fn status_lists_every_node_with_an_error_for_unreachable_ones() {
        let status = NodeStatus { rejoining: true, ..node(1, "leader", &[1, 2, 3]) };
        let summary = Summary::of([&status]);
        let value = status_json(
            &[("h:7101".into(), Ok(status)), ("h:7102".into(), Err("connection refused".into()))],
            &summary,
        );
        assert_eq!(value["nodes"][0]["endpoint"], json!("h:7101"));
        assert_eq!(value["nodes"][0]["role"], json!("leader"));
        assert_eq!(value["nodes"][0]["members"][0]["peer_addr"], json!("h:7201"));
        assert_eq!(value["nodes"][0]["members"][0]["reachable"], json!(true));
        assert_eq!(value["nodes"][0]["members"][0]["role"], json!("voter"));
        assert_eq!(value["nodes"][0]["rejoining"], json!(true));
        assert_eq!(value["nodes"][0]["cluster_id"], json!("0123456789abcdef0123456789abcdef"));
        assert_eq!(
            (&value["nodes"][0]["starting"], &value["nodes"][0]["waiting_for"], &value["nodes"][0]["quorum"]),
            (&json!(false), &json!([]), &json!(true))
        );
        assert_eq!(value["nodes"][1], json!({"endpoint": "h:7102", "error": "connection refused"}));
        assert_eq!(
            value["summary"],
            json!({"leader": 1, "leader_addr": "h:7101", "reachable": 3, "members": 3, "quorum": true})
        );
    }

    #[test]
    fn the_summary_is_the_leaders_view() {
        // A follower hears only from its leader; the leader hears from all.
        let follower = node(2, "follower", &[1, 2]);
        let leader = node(1, "leader", &[1, 2, 3]);
        let summary = Summary::of([&follower, &leader]);
        assert_eq!(summary.line(), "leader: 1 (h:7101)  reachable: 3/3 members  quorum: yes");
        assert!(summary.serves());
        // A leader of an older term, cut off, loses to the newer one.
        let stale = NodeStatus { term: 3, ..node(3, "leader", &[3]) };
        assert_eq!(Summary::of([&stale, &leader]).leader, Some(1));
        // A leader that hears from itself alone.
        let alone = Summary::of([&node(1, "leader", &[1])]);
        assert_eq!(alone.line(), "leader: 1 (h:7101)  reachable: 1/3 members  quorum: no");
        assert!(!alone.serves());
        // No leader answered: the widest view, and no quorum.
        let candidate =
            NodeStatus { leader_id: 0, leader_addr: String::new(), ..node(2, "candidate", &[2, 3]) };
        let none = Summary::of([&NodeStatus { quorum: false, ..node(3, "follower", &[3]) }, &candidate]);
        assert_eq!(none.line(), "leader: none  reachable: 2/3 members  quorum: no");
        assert!(!none.serves());
        assert_eq!(
            serde_json::to_value(&none).unwrap(),
            json!({"leader": null, "leader_addr": null, "reachable": 2, "members": 3, "quorum": false})
        );
        assert_eq!(Summary::of([]).line(), "leader: none  reachable: 0/0 members  quorum: no");
        assert_eq!(Exit::NoQuorum.code(), 2);
    }

    #[test]
    fn a_node_line_says_rejoining_or_starting_and_whom_it_waits_for() {
        assert_eq!(status_notes(&node(2, "follower", &[1, 2])), "");
        let starting = NodeStatus { starting: true, waiting_for: vec![2, 3], ..node(1, "follower", &[1]) };
        assert_eq!(status_notes(&starting), " starting (waiting for peers 2, 3)");
        assert_eq!(status_notes(&NodeStatus { waiting_for: vec![], ..starting }), " starting");
        let rejoining = NodeStatus { rejoining: true, ..node(2, "follower", &[1, 2]) };
        assert_eq!(status_notes(&rejoining), " rejoining (lost its data; not voting until caught up)");
    }
}
