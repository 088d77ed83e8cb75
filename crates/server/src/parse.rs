//! Reads a client's request: the decoded protocol request and the
//! connection's user in, the request the node takes (with what its answer
//! needs) or a refusal with its stable code out. Pure: no socket, no node,
//! no clock, so every check is unit-tested here.
//!
//! It owns the checks made before a request reaches the node: each field's
//! bounds, the user's rights on the keys it names (TLS), whose owner or
//! session a request may name, and what a node's certificate may ask. It
//! does not send anything, nor turn answers into responses: that is
//! [`crate::handler`]'s.

use fencelock_raft::watch::WatchQuery;
use fencelock_raft::{ClientRequest, MemberChange, NodeId};
use fencelock_types::client_pb::{self as proto, ErrorCode, Request_oneof_kind as Kind};
use fencelock_types::{Command, FencingToken, Key, LeaseMs, Owner, Share, Value};

use crate::access::{Access, Right};

/// The most locks one list answers.
pub const LIST_LIMIT_MAX: u32 = 10_000;

/// About the most events one watch answers (and the most current holders).
pub const WATCH_LIMIT_MAX: u32 = 1_000;

/// The longest a watch waits for a change before it is answered empty.
pub const WATCH_WAIT_MAX_MS: u64 = 60_000;

/// What a request is checked against.
pub struct Rules<'a> {
    /// What each TLS user may do; `None` without TLS, where every client
    /// may do everything.
    pub access: Option<&'a Access>,
    /// The longest wait an acquire may ask for.
    pub wait_max_ms: u64,
}

/// A request refused before it reached the node: its code and why.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused {
    pub code: ErrorCode,
    pub message: String,
}

fn invalid(message: impl Into<String>) -> Refused {
    Refused { code: ErrorCode::INVALID_ARGUMENT, message: message.into() }
}

fn denied(message: impl Into<String>) -> Refused {
    Refused { code: ErrorCode::PERMISSION_DENIED, message: message.into() }
}

/// A checked request: what the node is asked, and what its answer needs.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    /// An acquire of any kind, as the node takes it; `key` names it in the
    /// refusals decided when it applies.
    Acquire {
        key: Key,
        request: ClientRequest,
    },
    Release {
        key: Key,
        token: Option<FencingToken>,
        user: Option<Owner>,
    },
    Renew {
        locks: Vec<(Key, FencingToken)>,
        lease_ms: LeaseMs,
        user: Option<Owner>,
    },
    Proclaim {
        key: Key,
        token: FencingToken,
        value: Value,
        user: Option<Owner>,
    },
    OpenSession {
        owner: Owner,
        ttl_ms: LeaseMs,
    },
    KeepAlive {
        session: FencingToken,
        user: Option<Owner>,
    },
    CloseSession {
        session: FencingToken,
        user: Option<Owner>,
    },
    Get {
        key: Key,
        linearizable: bool,
    },
    Check {
        key: Key,
        token: FencingToken,
    },
    List {
        prefix: Vec<u8>,
        limit: usize,
    },
    Watch(WatchQuery),
    /// The node's status; `admin`: with the peers' addresses.
    Status {
        admin: bool,
    },
    Backup(proto::BackupRequest),
    /// The membership (`None`) or a change of it. An added learner's
    /// `known` is left empty: the handler fills in where this node knows
    /// the members are.
    Members(Option<MemberChange>),
    /// A node's certificate confirming the entry an admin made for it: the
    /// membership, only if it holds that node at those addresses.
    Confirm {
        node: u64,
        peer_addr: String,
        client_addr: String,
    },
    Transfer(NodeId),
}

/// Checks `request` from a connection of `user` (its certificate's name
/// under TLS) against `rules`.
pub fn parse(request: proto::Request, user: Option<&str>, rules: &Rules<'_>) -> Result<Parsed, Refused> {
    let Some(kind) = request.kind else {
        return Err(invalid("request names no operation"));
    };
    let user = match (rules.access, user) {
        (None, _) => None,
        (Some(_), Some(user)) => Some(user),
        (Some(_), None) => return Err(denied("permission denied: the connection has no authenticated user")),
    };
    if let Some(node) = user.and_then(fencelock_tls::principal_node) {
        return as_node(node, kind);
    }
    let checker = Checker { access: rules.access, user };
    match kind {
        Kind::acquire(acquire) => checker.acquire(acquire, rules.wait_max_ms),
        Kind::release(release) => checker.release(release),
        Kind::renew(renew) => checker.renew(renew),
        Kind::get(get) => {
            let key = key(get.key)?;
            checker.require(Right::Read, &key)?;
            Ok(Parsed::Get { key, linearizable: get.linearizable })
        }
        Kind::check(check) => {
            let key = key(check.key)?;
            let token = FencingToken::new(check.token).ok_or_else(|| invalid("a check needs a token"))?;
            checker.require(Right::Read, &key)?;
            Ok(Parsed::Check { key, token })
        }
        Kind::list(list) => {
            checker.require_under(&list.prefix)?;
            let limit = match list.limit {
                0 => LIST_LIMIT_MAX,
                limit => limit.min(LIST_LIMIT_MAX),
            };
            Ok(Parsed::List { prefix: list.prefix, limit: limit as usize })
        }
        Kind::status(_) => Ok(Parsed::Status { admin: checker.admin() }),
        Kind::backup(backup) => {
            checker.admin_only("backups")?;
            Ok(Parsed::Backup(backup))
        }
        Kind::proclaim(proclaim) => checker.proclaim(proclaim),
        Kind::watch(watch) => checker.watch(watch),
        Kind::session_open(open) => {
            let owner = Owner::new(open.owner).map_err(|err| invalid(format!("owner: {err}")))?;
            let ttl_ms = LeaseMs::new(open.ttl_ms).map_err(|err| invalid(format!("ttl_ms: {err}")))?;
            owner_of_user(&owner, user).map_err(denied)?;
            // A session exists to hold locks, and counts against its
            // owner's quota like one: a read-only user opens none.
            if let (Some(user), Some(access)) = (user, rules.access) {
                if !access.allows_somewhere(user, Right::Lock) {
                    return Err(denied(format!(
                        "permission denied: user {user} has no `lock` right on any key, and a session is for \
                         holding locks"
                    )));
                }
            }
            Ok(Parsed::OpenSession { owner, ttl_ms })
        }
        Kind::session_keep_alive(keep) => {
            let (session, user) = checker.session(keep.session)?;
            Ok(Parsed::KeepAlive { session, user })
        }
        Kind::session_close(close) => {
            let (session, user) = checker.session(close.session)?;
            Ok(Parsed::CloseSession { session, user })
        }
        Kind::member_list(_) => {
            checker.admin_only("membership")?;
            Ok(Parsed::Members(None))
        }
        Kind::member_add(add) => {
            let change = match (host_port(&add.peer_addr), host_port(&add.client_addr)) {
                (Ok(()), Ok(())) if add.id != 0 => MemberChange::AddLearner {
                    id: NodeId(add.id),
                    peer_addr: add.peer_addr,
                    client_addr: add.client_addr,
                    known: Vec::new(),
                },
                (Err(why), _) => return Err(invalid(format!("peer address {:?}: {why}", add.peer_addr))),
                (_, Err(why)) => return Err(invalid(format!("client address {:?}: {why}", add.client_addr))),
                _ => return Err(invalid("node id 0 is reserved")),
            };
            checker.admin_only("membership")?;
            Ok(Parsed::Members(Some(change)))
        }
        Kind::member_promote(promote) => {
            checker.admin_only("membership")?;
            Ok(Parsed::Members(Some(MemberChange::Promote(NodeId(promote.id)))))
        }
        Kind::member_remove(remove) => {
            checker.admin_only("membership")?;
            Ok(Parsed::Members(Some(MemberChange::Remove(NodeId(remove.id)))))
        }
        Kind::leader_transfer(transfer) => {
            checker.admin_only("membership")?;
            Ok(Parsed::Transfer(NodeId(transfer.id)))
        }
    }
}

/// What a node's certificate may do on the client port (TLS): what
/// `--join` needs and nothing more. It may read the status and the
/// membership, confirm the entry an admin's `member add` made for it (a
/// `member add` of itself at the addresses that entry holds: it never adds
/// a node), and ask to be promoted. So a node joins without an admin's key
/// on its machine, and a node's key, stolen, adds no node and touches no
/// lock.
fn as_node(node: u64, kind: Kind) -> Result<Parsed, Refused> {
    match kind {
        Kind::status(_) => Ok(Parsed::Status { admin: false }),
        Kind::member_list(_) => Ok(Parsed::Members(None)),
        Kind::member_add(add) if add.id == node => {
            Ok(Parsed::Confirm { node, peer_addr: add.peer_addr, client_addr: add.client_addr })
        }
        Kind::member_promote(promote) if promote.id == node => {
            Ok(Parsed::Members(Some(MemberChange::Promote(NodeId(node)))))
        }
        _ => Err(denied(format!(
            "permission denied: node {node}'s certificate may only join the cluster as node {node} (status, \
             member list, and member add and promote of node {node})"
        ))),
    }
}

/// The checks of one request's user.
struct Checker<'a> {
    access: Option<&'a Access>,
    /// `None`: plain TCP, no users.
    user: Option<&'a str>,
}

impl Checker<'_> {
    /// Whether the user has `right` on `key`.
    fn allows(&self, right: Right, key: &[u8]) -> bool {
        match (self.user, self.access) {
            (Some(user), Some(access)) => access.allows(user, right, key),
            _ => true,
        }
    }

    fn require(&self, right: Right, key: &Key) -> Result<(), Refused> {
        if self.allows(right, key.as_bytes()) {
            return Ok(());
        }
        Err(denied(format!(
            "permission denied: user {} has no `{}` right on key {key}",
            self.user.unwrap_or_default(),
            right.name()
        )))
    }

    /// The `read` right on every key under `prefix`.
    fn require_under(&self, prefix: &[u8]) -> Result<(), Refused> {
        match (self.user, self.access) {
            (Some(user), Some(access)) if !access.allows_all_under(user, Right::Read, prefix) => {
                Err(denied(format!(
                    "permission denied: user {user} has no `read` right on every key under prefix `{}`",
                    prefix.escape_ascii()
                )))
            }
            _ => Ok(()),
        }
    }

    /// Whether the user is an admin (everyone is without TLS).
    fn admin(&self) -> bool {
        self.user.is_none_or(|user| self.access.is_some_and(|access| access.is_admin(user)))
    }

    fn admin_only(&self, what: &str) -> Result<(), Refused> {
        match self.user.filter(|_| !self.admin()) {
            Some(user) => Err(denied(format!(
                "permission denied: user {user} is not an admin, and {what} {} for admins",
                if what.ends_with('s') { "are" } else { "is" }
            ))),
            None => Ok(()),
        }
    }

    /// The user as an owner, for the state machine to check that a lock
    /// or session named is the user's.
    fn owner(&self) -> Result<Option<Owner>, Refused> {
        self.user
            .map(|user| Owner::new(user.as_bytes().to_vec()))
            .transpose()
            .map_err(|err| invalid(format!("user: {err}")))
    }

    fn acquire(&self, acquire: proto::AcquireRequest, wait_max_ms: u64) -> Result<Parsed, Refused> {
        let key = key(acquire.key)?;
        let session = FencingToken::new(acquire.session);
        // Under a session the lease is the session's: `lease_ms` may be 0.
        let lease_ms = match (LeaseMs::new(acquire.lease_ms), session) {
            (Ok(lease_ms), _) => lease_ms,
            (Err(_), Some(_)) if acquire.lease_ms == 0 => LeaseMs::MIN,
            (Err(err), _) => return Err(invalid(format!("lease_ms: {err}"))),
        };
        let owner = Owner::new(acquire.owner).map_err(|err| invalid(format!("owner: {err}")))?;
        let value = Value::new(acquire.value).map_err(|err| invalid(format!("value: {err}")))?;
        let share = match (acquire.share, acquire.permits) {
            (proto::Share::EXCLUSIVE, 0) => None,
            (proto::Share::READ, 0) => Some(Share::Read),
            (proto::Share::WRITE, 0) => Some(Share::Write),
            (proto::Share::PERMIT, permits @ 1..=fencelock_types::PERMITS_MAX) => {
                Some(Share::Permit(permits))
            }
            (share, permits) => {
                return Err(invalid(format!(
                "share {share:?} with {permits} permits: READ, WRITE and EXCLUSIVE take no permits, PERMIT \
                     takes 1 to {}",
                fencelock_types::PERMITS_MAX
            )))
            }
        };
        if share.is_some() && !value.is_empty() {
            return Err(invalid("a read-write lock's or a semaphore's holder carries no value"));
        }
        if acquire.wait_ms > wait_max_ms {
            return Err(invalid(format!(
                "wait_ms {} is over this server's maximum of {wait_max_ms} ms",
                acquire.wait_ms
            )));
        }
        self.require(Right::Lock, &key)?;
        owner_of_user(&owner, self.user).map_err(denied)?;
        let wait_ms = acquire.wait_ms;
        let request = match (share, session) {
            (None, None) => ClientRequest::Acquire { key: key.clone(), lease_ms, owner, value, wait_ms },
            (Some(share), None) => {
                ClientRequest::AcquireShared { key: key.clone(), lease_ms, owner, share, wait_ms }
            }
            (None, session) => ClientRequest::AcquireWith {
                grant: Command::Grant { key: key.clone(), lease_ms, owner, value, session },
                wait_ms,
            },
            (Some(share), session) => ClientRequest::AcquireWith {
                grant: Command::GrantShared { key: key.clone(), lease_ms, owner, share, session },
                wait_ms,
            },
        };
        Ok(Parsed::Acquire { key, request })
    }

    fn release(&self, release: proto::ReleaseRequest) -> Result<Parsed, Refused> {
        let key = key(release.key)?;
        let token = match (release.force, FencingToken::new(release.token)) {
            (true, _) => {
                self.require(Right::Force, &key)?;
                None
            }
            (false, Some(token)) => {
                self.require(Right::Lock, &key)?;
                Some(token)
            }
            (false, None) => return Err(invalid("a release needs a token, or force")),
        };
        // The table checks that the lock is the user's, unless the user may
        // release anyone's.
        let user = match self.allows(Right::Force, key.as_bytes()) {
            true => None,
            false => self.owner()?,
        };
        Ok(Parsed::Release { key, token, user })
    }

    fn renew(&self, renew: proto::RenewRequest) -> Result<Parsed, Refused> {
        let lease_ms = LeaseMs::new(renew.lease_ms).map_err(|err| invalid(format!("lease_ms: {err}")))?;
        if renew.locks.is_empty() {
            return Err(invalid("a renew names no lock"));
        }
        let user = self.owner()?;
        let mut locks = Vec::with_capacity(renew.locks.len());
        for lock in renew.locks {
            let key = key(lock.key)?;
            let token =
                FencingToken::new(lock.token).ok_or_else(|| invalid("a renew needs each lock's token"))?;
            self.require(Right::Lock, &key)?;
            locks.push((key, token));
        }
        Ok(Parsed::Renew { locks, lease_ms, user })
    }

    /// A holder replaces its lock's value: like a release with a token, the
    /// `lock` right, and only the user's own lock.
    fn proclaim(&self, proclaim: proto::ProclaimRequest) -> Result<Parsed, Refused> {
        let key = key(proclaim.key)?;
        let token =
            FencingToken::new(proclaim.token).ok_or_else(|| invalid("a proclaim needs the lock's token"))?;
        let value = Value::new(proclaim.value).map_err(|err| invalid(format!("value: {err}")))?;
        self.require(Right::Lock, &key)?;
        let user = self.owner()?;
        Ok(Parsed::Proclaim { key, token, value, user })
    }

    /// The changes under a prefix after a log index (a long poll): the
    /// `read` right on every key under the prefix.
    fn watch(&self, watch: proto::WatchRequest) -> Result<Parsed, Refused> {
        self.require_under(&watch.prefix)?;
        if watch.prefix.len() > fencelock_types::KEY_LEN_MAX {
            return Err(invalid(format!(
                "prefix: longer than a key may be ({} bytes)",
                fencelock_types::KEY_LEN_MAX
            )));
        }
        if watch.wait_ms > WATCH_WAIT_MAX_MS {
            return Err(invalid(format!(
                "wait_ms {} is over the maximum of {WATCH_WAIT_MAX_MS} ms for a watch",
                watch.wait_ms
            )));
        }
        let limit = match watch.limit {
            0 => WATCH_LIMIT_MAX,
            limit => limit.min(WATCH_LIMIT_MAX),
        };
        Ok(Parsed::Watch(WatchQuery {
            prefix: watch.prefix,
            after: (!watch.start).then_some(watch.after_index),
            wait_ms: watch.wait_ms,
            limit: limit as usize,
        }))
    }

    /// A session's keep-alive or close: over TLS, only the user's own
    /// session (the state machine checks).
    fn session(&self, session: u64) -> Result<(FencingToken, Option<Owner>), Refused> {
        let session = FencingToken::new(session).ok_or_else(|| invalid("a session's id is never 0"))?;
        Ok((session, self.owner()?))
    }
}

fn key(bytes: Vec<u8>) -> Result<Key, Refused> {
    Key::new(bytes).map_err(|err| invalid(format!("key: {err}")))
}

/// Over TLS (a `user`), whether `owner` is the user's: the user name, or
/// the user name, `/` and a suffix. The refusal's message otherwise.
fn owner_of_user(owner: &Owner, user: Option<&str>) -> Result<(), String> {
    match user {
        Some(user) if !owner.is_of_user(user.as_bytes()) => Err(format!(
            "permission denied: owner {owner} is not user {user}'s: over TLS an owner is the user name, or the \
             user name, `/` and a suffix ({user}/worker-1)"
        )),
        _ => Ok(()),
    }
}

/// Checks that `addr` is `HOST:PORT`: a host name or an IP address (IPv6
/// in brackets), and a port from 1 to 65535.
fn host_port(addr: &str) -> Result<(), String> {
    let (host, port) = addr.rsplit_once(':').ok_or("not HOST:PORT")?;
    let host = host.strip_prefix('[').and_then(|host| host.strip_suffix(']')).unwrap_or(host);
    let port_ok = port.parse::<u16>().is_ok_and(|port| port > 0);
    let host_ok = !host.is_empty()
        && addr.len() <= fencelock_fsm::MEMBER_ADDR_MAX
        && (host.parse::<std::net::IpAddr>().is_ok()
            || host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'-')
            }));
    match (host_ok, port_ok) {
        (true, true) => Ok(()),
        _ => Err("not HOST:PORT (a host name or IP address, and a port from 1 to 65535)".into()),
    }
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
