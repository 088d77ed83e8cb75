//! Serves client requests: decodes and checks each one, hands it to the
//! driver (the node loop's core, which takes it in the loop's next turn),
//! and turns the driver's reply into a protocol response with a stable
//! error code.

use std::collections::BTreeMap;
use std::sync::Arc;

use crossbeam_channel::Sender;
use fencelock_net::{error_response, Handler, ResponseSink};
use fencelock_raft::answer::{Acquired, Opened, Proclaimed, Released, Renewal, SessionClosed, SessionKept};
use fencelock_raft::reply::{Checked, Holding, Listed, Membership, Transferred};
use fencelock_raft::shell::{Request as DriverRequest, Responder, StatusCallback};
use fencelock_raft::watch::{WatchAnswer, WatchEvent, WatchKind, WatchQuery};
use fencelock_raft::{
    Answer, ClientRequest, ConnId, MemberChange, NodeId, NodeStatus, Query, RequestError, Role,
};
use fencelock_types::client_pb::{
    self as proto, ErrorCode, Request_oneof_kind as Kind, Response_oneof_kind as Out,
};
use fencelock_types::{Command, FencingToken, Key, LeaseMs, Owner, Share, Value};

use crate::access::{Access, Right};
use crate::backup::Backups;
use crate::errors::error_to_response;

/// The most locks one list answers.
const LIST_LIMIT_MAX: u32 = 10_000;

/// About the most events one watch answers (and the most current holders).
const WATCH_LIMIT_MAX: u32 = 1_000;

/// The longest a watch waits for a change before it is answered empty.
const WATCH_WAIT_MAX_MS: u64 = 60_000;

/// Where the leader's clients connect, by node id, as far as this node knows.
pub trait Directory: Send + Sync {
    fn client_addr(&self, id: u64) -> Option<String>;
}

/// The client-facing side of one node.
pub struct ClientHandler {
    pub driver: Sender<DriverRequest>,
    pub identity: Arc<Identity>,
    /// What each TLS user may do; `None` without TLS, where every client
    /// may do everything.
    pub access: Option<Access>,
    /// The longest wait an acquire may ask for: a waiter holds a place in
    /// its key's queue and memory on the leader until then.
    pub wait_max_ms: u64,
    /// Requests queued for the node loop past which the listener stops
    /// reading requests until the loop's next turn takes some.
    pub queued_max: usize,
    /// The backups this node serves ([`crate::backup`]).
    pub backups: Arc<Backups>,
}

/// Who this node is, and where every node's clients connect.
pub struct Identity {
    pub node_id: u64,
    /// What clients are told to reach this node at.
    pub client_addr: String,
    pub peers: BTreeMap<u64, String>,
    pub directory: Arc<dyn Directory>,
}

impl Handler for ClientHandler {
    fn ready(&self) -> bool {
        self.driver.len() < self.queued_max
    }

    fn closed(&self, connection: u64) {
        // After every request the connection carried, on the same channel:
        // the node sees them in that order.
        let _ = self.driver.send(DriverRequest::ConnectionClosed(ConnId(connection)));
    }

    fn handle(&self, request: proto::Request, sink: ResponseSink) {
        let id = request.id;
        let Some(kind) = request.kind else {
            sink.send(error_response(id, ErrorCode::INVALID_ARGUMENT, "request names no operation"));
            return;
        };
        let user = match self.user(&sink) {
            Ok(user) => user,
            Err(message) => {
                sink.send(error_response(id, ErrorCode::PERMISSION_DENIED, message));
                return;
            }
        };
        let user = user.as_deref();
        if let Some(node) = user.and_then(fencelock_tls::principal_node) {
            if let Err((sink, code, message)) = self.as_node(node, kind, sink) {
                sink.send(error_response(id, code, message));
            }
            return;
        }
        let result = match kind {
            Kind::acquire(acquire) => self.acquire(acquire, user, sink),
            Kind::release(release) => self.release(release, user, sink),
            Kind::renew(renew) => self.renew(renew, user, sink),
            Kind::get(get) => self.get(get, user, sink),
            Kind::check(check) => self.check(check, user, sink),
            Kind::list(list) => self.list(list, user, sink),
            Kind::status(_) => {
                self.status(
                    user.is_none_or(|user| self.access.as_ref().is_some_and(|a| a.is_admin(user))),
                    sink,
                );
                Ok(())
            }
            Kind::backup(backup) => self.backup(backup, user, sink),
            Kind::proclaim(proclaim) => self.proclaim(proclaim, user, sink),
            Kind::watch(watch) => self.watch(watch, user, sink),
            Kind::session_open(open) => self.session_open(open, user, sink),
            Kind::session_keep_alive(keep) => self.session_command(keep.session, false, user, sink),
            Kind::session_close(close) => self.session_command(close.session, true, user, sink),
            Kind::member_list(_) => self.membership(None, user, sink),
            Kind::member_add(add) => {
                let change = match (host_port(&add.peer_addr), host_port(&add.client_addr)) {
                    (Ok(()), Ok(())) if add.id != 0 => Ok(MemberChange::AddLearner {
                        id: NodeId(add.id),
                        peer_addr: add.peer_addr,
                        client_addr: add.client_addr,
                        known: self.identity.known_members(),
                    }),
                    (Err(why), _) => Err(format!("peer address {:?}: {why}", add.peer_addr)),
                    (_, Err(why)) => Err(format!("client address {:?}: {why}", add.client_addr)),
                    _ => Err("node id 0 is reserved".to_string()),
                };
                match change {
                    Ok(change) => self.membership(Some(change), user, sink),
                    Err(why) => Err(invalid(sink, why)),
                }
            }
            Kind::member_promote(promote) => {
                self.membership(Some(MemberChange::Promote(NodeId(promote.id))), user, sink)
            }
            Kind::member_remove(remove) => {
                self.membership(Some(MemberChange::Remove(NodeId(remove.id))), user, sink)
            }
            Kind::leader_transfer(transfer) => self.transfer(NodeId(transfer.id), user, sink),
        };
        if let Err((sink, code, message)) = result {
            sink.send(error_response(id, code, message));
        }
    }
}

/// A request refused before it reached the driver: the sink, the code and
/// why.
type Refusal = (ResponseSink, ErrorCode, String);

fn invalid(sink: ResponseSink, message: String) -> Refusal {
    (sink, ErrorCode::INVALID_ARGUMENT, message)
}

fn denied(sink: ResponseSink, message: String) -> Refusal {
    (sink, ErrorCode::PERMISSION_DENIED, message)
}

/// How a request ends other than with its answer: a driver error, or a
/// lock of another user's (decided by the state machine).
enum Failure {
    Driver(RequestError),
    Denied(String),
    /// The state machine refused it as asked (a shared acquire of another
    /// kind than the key): INVALID_ARGUMENT.
    Invalid(String),
    /// The acquire named a session that is not open: NO_SESSION.
    NoSession(String),
}

impl From<RequestError> for Failure {
    fn from(err: RequestError) -> Failure {
        Failure::Driver(err)
    }
}

impl ClientHandler {
    /// The authenticated user the request comes from: `None` without TLS.
    /// With TLS every connection has one before its first request is read.
    fn user(&self, sink: &ResponseSink) -> Result<Option<String>, String> {
        match (&self.access, sink.user()) {
            (None, _) => Ok(None),
            (Some(_), Some(user)) => Ok(Some(user.to_owned())),
            (Some(_), None) => Err("permission denied: the connection has no authenticated user".to_owned()),
        }
    }

    /// Whether `user` (`None`: plain TCP, no users) has `right` on `key`.
    fn allows(&self, user: Option<&str>, right: Right, key: &[u8]) -> bool {
        match (user, &self.access) {
            (Some(user), Some(access)) => access.allows(user, right, key),
            _ => true,
        }
    }

    fn require(
        &self,
        user: Option<&str>,
        right: Right,
        key: &Key,
        sink: ResponseSink,
    ) -> Result<ResponseSink, Refusal> {
        if self.allows(user, right, key.as_bytes()) {
            return Ok(sink);
        }
        let message = format!(
            "permission denied: user {} has no `{}` right on key {key}",
            user.unwrap_or_default(),
            right.name()
        );
        Err(denied(sink, message))
    }

    fn acquire(
        &self,
        acquire: proto::AcquireRequest,
        user: Option<&str>,
        sink: ResponseSink,
    ) -> Result<(), Refusal> {
        let conn = ConnId(sink.connection());
        let key = match Key::new(acquire.key) {
            Ok(key) => key,
            Err(err) => return Err(invalid(sink, format!("key: {err}"))),
        };
        let session = FencingToken::new(acquire.session);
        // Under a session the lease is the session's: `lease_ms` may be 0.
        let lease_ms = match (LeaseMs::new(acquire.lease_ms), session) {
            (Ok(lease_ms), _) => lease_ms,
            (Err(_), Some(_)) if acquire.lease_ms == 0 => LeaseMs::MIN,
            (Err(err), _) => return Err(invalid(sink, format!("lease_ms: {err}"))),
        };
        let owner = match Owner::new(acquire.owner) {
            Ok(owner) => owner,
            Err(err) => return Err(invalid(sink, format!("owner: {err}"))),
        };
        let value = match Value::new(acquire.value) {
            Ok(value) => value,
            Err(err) => return Err(invalid(sink, format!("value: {err}"))),
        };
        let share = match (acquire.share, acquire.permits) {
            (proto::Share::EXCLUSIVE, 0) => None,
            (proto::Share::READ, 0) => Some(Share::Read),
            (proto::Share::WRITE, 0) => Some(Share::Write),
            (proto::Share::PERMIT, permits @ 1..=fencelock_types::PERMITS_MAX) => {
                Some(Share::Permit(permits))
            }
            (share, permits) => {
                let message = format!(
                    "share {share:?} with {permits} permits: READ, WRITE and EXCLUSIVE take no permits, PERMIT \
                     takes 1 to {}",
                    fencelock_types::PERMITS_MAX
                );
                return Err(invalid(sink, message));
            }
        };
        if share.is_some() && !value.is_empty() {
            return Err(invalid(
                sink,
                "a read-write lock's or a semaphore's holder carries no value".to_owned(),
            ));
        }
        if acquire.wait_ms > self.wait_max_ms {
            let message = format!(
                "wait_ms {} is over this server's maximum of {} ms",
                acquire.wait_ms, self.wait_max_ms
            );
            return Err(invalid(sink, message));
        }
        let sink = self.require(user, Right::Lock, &key, sink)?;
        if let Err(message) = owner_of_user(&owner, user) {
            return Err(denied(sink, message));
        }
        let mismatch_key = key.clone();
        let reply = self.responder(sink, move |reply: Result<Acquired, RequestError>| {
            let outcome =
                |outcome, token: Option<FencingToken>, lease_ms: u64, holder: Option<FencingToken>| {
                    proto::AcquireResponse {
                        outcome,
                        token: token.map_or(0, FencingToken::get),
                        lease_ms,
                        holder_token: holder.map_or(0, FencingToken::get),
                        ..Default::default()
                    }
                };
            let held = |holder| Out::acquire(outcome(proto::AcquireOutcome::HELD, None, 0, holder));
            match reply {
                Ok(Acquired::Granted { token, lease_ms, existing }) => {
                    let granted = outcome(proto::AcquireOutcome::GRANTED, Some(token), lease_ms.get(), None);
                    Ok(Out::acquire(proto::AcquireResponse { existing, ..granted }))
                }
                Ok(Acquired::Held { holder_token }) => Ok(held(Some(holder_token))),
                Ok(Acquired::Mismatch { permits: 0 }) => Err(Failure::Invalid(format!(
                    "key {mismatch_key} is a read-write lock: acquire it with READ or WRITE"
                ))),
                Ok(Acquired::Mismatch { permits }) => Err(Failure::Invalid(format!(
                    "key {mismatch_key} is a semaphore of {permits} permits: acquire it with PERMIT and \
                     permits {permits}"
                ))),
                Ok(Acquired::NoSession { session }) => Err(Failure::NoSession(format!(
                    "session {session} is not open (closed, or lapsed: what it held is free): open a new one"
                ))),
                Ok(Acquired::NotSessionOwner { session }) => Err(Failure::Denied(format!(
                    "permission denied: session {session} is another owner's: acquire under it as its owner"
                ))),
                Err(RequestError::Held { holder_token, .. }) => Ok(held(Some(holder_token))),
                Err(RequestError::Delayed { holder_token, left_ms, .. }) => {
                    Ok(Out::acquire(proto::AcquireResponse {
                        delayed: true,
                        delay_left_ms: left_ms.unwrap_or(0),
                        ..outcome(proto::AcquireOutcome::HELD, None, 0, Some(holder_token))
                    }))
                }
                Err(RequestError::WaitTimedOut { holder_token, .. }) => {
                    Ok(Out::acquire(outcome(proto::AcquireOutcome::WAIT_TIMED_OUT, None, 0, holder_token)))
                }
                Err(err) => Err(err.into()),
            }
        });
        let request = match (share, session) {
            (None, None) => ClientRequest::Acquire { key, lease_ms, owner, value, wait_ms: acquire.wait_ms },
            (Some(share), None) => {
                ClientRequest::AcquireShared { key, lease_ms, owner, share, wait_ms: acquire.wait_ms }
            }
            (None, session) => ClientRequest::AcquireWith {
                grant: Command::Grant { key, lease_ms, owner, value, session },
                wait_ms: acquire.wait_ms,
            },
            (Some(share), session) => ClientRequest::AcquireWith {
                grant: Command::GrantShared { key, lease_ms, owner, share, session },
                wait_ms: acquire.wait_ms,
            },
        };
        self.client(conn, request, reply);
        Ok(())
    }

    fn release(
        &self,
        release: proto::ReleaseRequest,
        user: Option<&str>,
        sink: ResponseSink,
    ) -> Result<(), Refusal> {
        let conn = ConnId(sink.connection());
        let key = match Key::new(release.key) {
            Ok(key) => key,
            Err(err) => return Err(invalid(sink, format!("key: {err}"))),
        };
        let (token, sink) = match (release.force, FencingToken::new(release.token)) {
            (true, _) => (None, self.require(user, Right::Force, &key, sink)?),
            (false, Some(token)) => (Some(token), self.require(user, Right::Lock, &key, sink)?),
            (false, None) => return Err(invalid(sink, "a release needs a token, or force".to_owned())),
        };
        // The table checks that the lock is the user's, unless the user may
        // release anyone's.
        let user = user.filter(|user| !self.allows(Some(user), Right::Force, key.as_bytes()));
        let user = match user.map(|user| Owner::new(user.as_bytes().to_vec())).transpose() {
            Ok(user) => user,
            Err(err) => return Err(invalid(sink, format!("user: {err}"))),
        };
        let denied_key = key.clone();
        let reply = self.responder(sink, move |reply| match reply? {
            Released::Released { token } => Ok(Out::release(proto::ReleaseResponse {
                released: true,
                token: token.get(),
                ..Default::default()
            })),
            Released::NotHeld { holder_token } => Ok(Out::release(proto::ReleaseResponse {
                holder_token: holder_token.map_or(0, FencingToken::get),
                ..Default::default()
            })),
            Released::NotYours { token } => Err(not_yours(&[(&denied_key, token)])),
        });
        self.client(conn, ClientRequest::Release { key, token, user }, reply);
        Ok(())
    }

    /// Opens a session for `owner` (over TLS, the user's). A session holds
    /// nothing by itself, so it needs no right on a key; it counts as one
    /// lock in its owner's quota.
    fn session_open(
        &self,
        open: proto::SessionOpenRequest,
        user: Option<&str>,
        sink: ResponseSink,
    ) -> Result<(), Refusal> {
        let conn = ConnId(sink.connection());
        let owner = match Owner::new(open.owner) {
            Ok(owner) => owner,
            Err(err) => return Err(invalid(sink, format!("owner: {err}"))),
        };
        let ttl_ms = match LeaseMs::new(open.ttl_ms) {
            Ok(ttl_ms) => ttl_ms,
            Err(err) => return Err(invalid(sink, format!("ttl_ms: {err}"))),
        };
        if let Err(message) = owner_of_user(&owner, user) {
            return Err(denied(sink, message));
        }
        let reply = self.responder(sink, move |reply| {
            let Opened { session, ttl_ms } = reply?;
            Ok(Out::session(proto::SessionResponse {
                session: session.get(),
                ttl_ms: ttl_ms.get(),
                found: true,
                ..Default::default()
            }))
        });
        self.client(conn, ClientRequest::OpenSession { owner, ttl_ms }, reply);
        Ok(())
    }

    /// A session's keep-alive, or its close (`close`): over TLS, only the
    /// user's own session.
    fn session_command(
        &self,
        session: u64,
        close: bool,
        user: Option<&str>,
        sink: ResponseSink,
    ) -> Result<(), Refusal> {
        let conn = ConnId(sink.connection());
        let Some(session) = FencingToken::new(session) else {
            return Err(invalid(sink, "a session's id is never 0".to_owned()));
        };
        let user = match user.map(|user| Owner::new(user.as_bytes().to_vec())).transpose() {
            Ok(user) => user,
            Err(err) => return Err(invalid(sink, format!("user: {err}"))),
        };
        // `found` with the TTL in force (0 once closed), or not found.
        let answer = move |ttl_ms: Option<u64>| {
            Ok(Out::session(proto::SessionResponse {
                session: session.get(),
                ttl_ms: ttl_ms.unwrap_or(0),
                found: ttl_ms.is_some(),
                ..Default::default()
            }))
        };
        let not_yours =
            move || Failure::Denied(format!("permission denied: session {session} is another user's"));
        if close {
            let reply = self.responder(sink, move |reply| match reply? {
                SessionClosed::Closed => answer(Some(0)),
                SessionClosed::NotOpen => answer(None),
                SessionClosed::NotYours => Err(not_yours()),
            });
            self.client(conn, ClientRequest::CloseSession { session, user }, reply);
        } else {
            let reply = self.responder(sink, move |reply| match reply? {
                SessionKept::Kept { ttl_ms } => answer(Some(ttl_ms.get())),
                SessionKept::NotOpen => answer(None),
                SessionKept::NotYours => Err(not_yours()),
            });
            self.client(conn, ClientRequest::KeepAlive { session, user }, reply);
        }
        Ok(())
    }

    /// A holder replaces its lock's value: like a release with a token, the
    /// `lock` right, and only the user's own lock.
    fn proclaim(
        &self,
        proclaim: proto::ProclaimRequest,
        user: Option<&str>,
        sink: ResponseSink,
    ) -> Result<(), Refusal> {
        let conn = ConnId(sink.connection());
        let key = match Key::new(proclaim.key) {
            Ok(key) => key,
            Err(err) => return Err(invalid(sink, format!("key: {err}"))),
        };
        let Some(token) = FencingToken::new(proclaim.token) else {
            return Err(invalid(sink, "a proclaim needs the lock's token".to_owned()));
        };
        let value = match Value::new(proclaim.value) {
            Ok(value) => value,
            Err(err) => return Err(invalid(sink, format!("value: {err}"))),
        };
        let sink = self.require(user, Right::Lock, &key, sink)?;
        let user = match user.map(|user| Owner::new(user.as_bytes().to_vec())).transpose() {
            Ok(user) => user,
            Err(err) => return Err(invalid(sink, format!("user: {err}"))),
        };
        let answer_key = key.clone();
        let reply = self.responder(sink, move |reply| match reply? {
            Proclaimed::Proclaimed { token } => Ok(Out::proclaim(proto::ProclaimResponse {
                proclaimed: true,
                token: token.get(),
                ..Default::default()
            })),
            Proclaimed::NotHeld { holder_token } => Ok(Out::proclaim(proto::ProclaimResponse {
                token: token.get(),
                holder_token: holder_token.map_or(0, FencingToken::get),
                ..Default::default()
            })),
            Proclaimed::NotYours { token } => Err(not_yours(&[(&answer_key, token)])),
            // The token holds the key, as a reader, the writer or a permit:
            // `proclaimed: false` would tell it that it lost the key.
            Proclaimed::SharedHolder => Err(Failure::Invalid(format!(
                "key {answer_key} is a read-write lock or a semaphore: token {token} holds it as a reader, \
                 writer or permit, which carries no value to proclaim (values are for plain locks)"
            ))),
        });
        self.client(conn, ClientRequest::Proclaim { key, token, value, user }, reply);
        Ok(())
    }

    /// The changes under a prefix after a log index, from this node (a long
    /// poll): the `read` right on every key under the prefix.
    fn watch(
        &self,
        watch: proto::WatchRequest,
        user: Option<&str>,
        sink: ResponseSink,
    ) -> Result<(), Refusal> {
        let conn = ConnId(sink.connection());
        if let (Some(user), Some(access)) = (user, &self.access) {
            if !access.allows_all_under(user, Right::Read, &watch.prefix) {
                let message = format!(
                    "permission denied: user {user} has no `read` right on every key under prefix `{}`",
                    watch.prefix.escape_ascii()
                );
                return Err(denied(sink, message));
            }
        }
        if watch.prefix.len() > fencelock_types::KEY_LEN_MAX {
            let message =
                format!("prefix: longer than a key may be ({} bytes)", fencelock_types::KEY_LEN_MAX);
            return Err(invalid(sink, message));
        }
        if watch.wait_ms > WATCH_WAIT_MAX_MS {
            let message = format!(
                "wait_ms {} is over the maximum of {WATCH_WAIT_MAX_MS} ms for a watch",
                watch.wait_ms
            );
            return Err(invalid(sink, message));
        }
        let limit = match watch.limit {
            0 => WATCH_LIMIT_MAX,
            limit => limit.min(WATCH_LIMIT_MAX),
        };
        let query = WatchQuery {
            prefix: watch.prefix,
            after: (!watch.start).then_some(watch.after_index),
            wait_ms: watch.wait_ms,
            limit: limit as usize,
        };
        let reply = self.responder(sink, |reply: Result<WatchAnswer, RequestError>| {
            let answer = reply?;
            Ok(Out::watch(proto::WatchResponse {
                events: answer.events.iter().map(watch_event).collect(),
                index: answer.index,
                has_current: answer.current.is_some(),
                current: answer.current.iter().flatten().map(|(key, held)| lock_info(key, held)).collect(),
                compacted: answer.compacted,
                ..Default::default()
            }))
        });
        self.client(conn, ClientRequest::Watch(query), reply);
        Ok(())
    }

    fn renew(
        &self,
        renew: proto::RenewRequest,
        user: Option<&str>,
        sink: ResponseSink,
    ) -> Result<(), Refusal> {
        let conn = ConnId(sink.connection());
        let lease_ms = match LeaseMs::new(renew.lease_ms) {
            Ok(lease_ms) => lease_ms,
            Err(err) => return Err(invalid(sink, format!("lease_ms: {err}"))),
        };
        if renew.locks.is_empty() {
            return Err(invalid(sink, "a renew names no lock".to_owned()));
        }
        let renewer = match user.map(|user| Owner::new(user.as_bytes().to_vec())).transpose() {
            Ok(renewer) => renewer,
            Err(err) => return Err(invalid(sink, format!("user: {err}"))),
        };
        let mut sink = sink;
        let mut locks = Vec::with_capacity(renew.locks.len());
        for lock in renew.locks.into_iter() {
            let key = match Key::new(lock.key) {
                Ok(key) => key,
                Err(err) => return Err(invalid(sink, format!("key: {err}"))),
            };
            let Some(token) = FencingToken::new(lock.token) else {
                return Err(invalid(sink, "a renew needs each lock's token".to_owned()));
            };
            sink = self.require(user, Right::Lock, &key, sink)?;
            locks.push((key, token));
        }
        let asked = locks.clone();
        let reply = self.responder(sink, move |reply: Result<Vec<Renewal>, RequestError>| {
            // One renewal per lock asked, in order (the node answers so).
            let renewals = reply?;
            let denied: Vec<(&Key, FencingToken)> = asked
                .iter()
                .zip(&renewals)
                .filter_map(|((key, _), renewal)| match renewal {
                    Renewal::NotYours { token } => Some((key, *token)),
                    _ => None,
                })
                .collect();
            if !denied.is_empty() {
                return Err(not_yours(&denied));
            }
            let results = asked
                .into_iter()
                .zip(renewals)
                .map(|((key, token), renewal)| proto::RenewResult {
                    key: key.into_bytes(),
                    token: token.get(),
                    renewed: matches!(renewal, Renewal::Renewed { .. }),
                    holder_token: match renewal {
                        Renewal::NotHeld { holder_token } => holder_token.map_or(0, FencingToken::get),
                        Renewal::Renewed { .. } | Renewal::NotYours { .. } => 0,
                    },
                    ..Default::default()
                })
                .collect();
            Ok(Out::renew(proto::RenewResponse { results, lease_ms: lease_ms.get(), ..Default::default() }))
        });
        self.client(conn, ClientRequest::Renew { locks, lease_ms, user: renewer }, reply);
        Ok(())
    }

    fn get(&self, get: proto::GetRequest, user: Option<&str>, sink: ResponseSink) -> Result<(), Refusal> {
        let conn = ConnId(sink.connection());
        let key = match Key::new(get.key) {
            Ok(key) => key,
            Err(err) => return Err(invalid(sink, format!("key: {err}"))),
        };
        let sink = self.require(user, Right::Read, &key, sink)?;
        let holder_key = key.clone();
        let reply = self.responder(sink, move |reply| match reply? {
            Holding::Plain(holder) => Ok(Out::get(proto::GetResponse {
                holder: holder.map(|held| lock_info(&holder_key, &held)).into(),
                ..Default::default()
            })),
            Holding::Shared(holders) => Ok(Out::get(proto::GetResponse {
                holder: holders.first().map(|held| lock_info(&holder_key, held)).into(),
                holders: holders.iter().map(|held| lock_info(&holder_key, held)).collect(),
                ..Default::default()
            })),
        });
        self.read(conn, get.linearizable, Query::Holder(key), reply);
        Ok(())
    }

    fn check(
        &self,
        check: proto::CheckRequest,
        user: Option<&str>,
        sink: ResponseSink,
    ) -> Result<(), Refusal> {
        let conn = ConnId(sink.connection());
        let key = match Key::new(check.key) {
            Ok(key) => key,
            Err(err) => return Err(invalid(sink, format!("key: {err}"))),
        };
        let Some(token) = FencingToken::new(check.token) else {
            return Err(invalid(sink, "a check needs a token".to_owned()));
        };
        let sink = self.require(user, Right::Read, &key, sink)?;
        let reply = self.responder(sink, |reply| {
            let Checked(holds) = reply?;
            Ok(Out::check(proto::CheckResponse { holds, ..Default::default() }))
        });
        self.read(conn, true, Query::Check { key, token }, reply);
        Ok(())
    }

    fn list(&self, list: proto::ListRequest, user: Option<&str>, sink: ResponseSink) -> Result<(), Refusal> {
        let conn = ConnId(sink.connection());
        if let (Some(user), Some(access)) = (user, &self.access) {
            if !access.allows_all_under(user, Right::Read, &list.prefix) {
                let message = format!(
                    "permission denied: user {user} has no `read` right on every key under prefix `{}`",
                    list.prefix.escape_ascii()
                );
                return Err(denied(sink, message));
            }
        }
        let limit = match list.limit {
            0 => LIST_LIMIT_MAX,
            limit => limit.min(LIST_LIMIT_MAX),
        };
        let reply = self.responder(sink, |reply| {
            let Listed(locks) = reply?;
            Ok(Out::list(proto::ListResponse {
                locks: locks.iter().map(|(key, held)| lock_info(key, held)).collect(),
                ..Default::default()
            }))
        });
        self.read(conn, true, Query::List { prefix: list.prefix, limit: limit as usize }, reply);
        Ok(())
    }

    /// A backup's request, served by [`Backups`]; admins only over TLS.
    fn backup(
        &self,
        backup: proto::BackupRequest,
        user: Option<&str>,
        sink: ResponseSink,
    ) -> Result<(), Refusal> {
        if let Some(user) = user.filter(|user| !self.access.as_ref().is_some_and(|a| a.is_admin(user))) {
            let message =
                format!("permission denied: user {user} is not an admin, and backups are for admins");
            return Err(denied(sink, message));
        }
        let conn = ConnId(sink.connection());
        let identity = Arc::clone(&self.identity);
        let leader_addr = move |leader: Option<NodeId>| identity.client_addr_of(leader?.0);
        self.backups.serve(backup, sink, leader_addr, |reply| {
            self.client(conn, ClientRequest::Read(Query::Table), reply)
        });
        Ok(())
    }

    /// What a node's certificate may do on the client port (TLS): what
    /// `--join` needs and nothing more. It may read the status and the
    /// membership, confirm the entry an admin's `member add` made for it
    /// (a `member add` of itself at the addresses that entry holds: it
    /// never adds a node), and ask to be promoted. So a node joins without
    /// an admin's key on its machine, and a node's key, stolen, adds no
    /// node and touches no lock.
    fn as_node(&self, node: u64, kind: Kind, sink: ResponseSink) -> Result<(), Refusal> {
        match kind {
            Kind::status(_) => {
                self.status(false, sink);
                Ok(())
            }
            Kind::member_list(_) => self.membership_answer(None, None, sink),
            Kind::member_add(add) if add.id == node => {
                let entry = (node, add.peer_addr, add.client_addr);
                self.membership_answer(None, Some(entry), sink)
            }
            Kind::member_promote(promote) if promote.id == node => {
                self.membership_answer(Some(MemberChange::Promote(NodeId(node))), None, sink)
            }
            _ => Err(denied(
                sink,
                format!(
                    "permission denied: node {node}'s certificate may only join the cluster as node {node} \
                     (status, member list, and member add and promote of node {node})"
                ),
            )),
        }
    }

    /// A membership change (`None`: the list), for admins only under TLS;
    /// answered with the membership.
    fn membership(
        &self,
        change: Option<MemberChange>,
        user: Option<&str>,
        sink: ResponseSink,
    ) -> Result<(), Refusal> {
        let sink = self.admin_only(user, sink)?;
        self.membership_answer(change, None, sink)
    }

    /// Hands leadership to `to`, for admins only under TLS; answered with
    /// the new leader.
    fn transfer(&self, to: NodeId, user: Option<&str>, sink: ResponseSink) -> Result<(), Refusal> {
        let sink = self.admin_only(user, sink)?;
        let conn = ConnId(sink.connection());
        let reply = self.responder(sink, |reply| {
            let Transferred { leader } = reply?;
            Ok(Out::leader_transfer(proto::LeaderTransferResponse {
                leader_id: leader.0,
                ..Default::default()
            }))
        });
        self.client(conn, ClientRequest::TransferLeader(to), reply);
        Ok(())
    }

    /// The sink back when `user` (`None`: no TLS) is an admin.
    fn admin_only(&self, user: Option<&str>, sink: ResponseSink) -> Result<ResponseSink, Refusal> {
        match user.filter(|user| !self.access.as_ref().is_some_and(|a| a.is_admin(user))) {
            Some(user) => Err(denied(
                sink,
                format!("permission denied: user {user} is not an admin, and membership is for admins"),
            )),
            None => Ok(sink),
        }
    }

    /// Sends a membership change (`None`: the list) on, and answers with
    /// the membership. With `confirm` (a node's id and addresses), the
    /// membership answers only if it holds that node at those addresses
    /// (see [`ClientHandler::as_node`]).
    fn membership_answer(
        &self,
        change: Option<MemberChange>,
        confirm: Option<(u64, String, String)>,
        sink: ResponseSink,
    ) -> Result<(), Refusal> {
        let conn = ConnId(sink.connection());
        let identity = Arc::clone(&self.identity);
        let reply = self.responder(sink, move |reply| {
            let Membership { members, index } = reply?;
            {
                if let Some((node, peer_addr, client_addr)) = confirm {
                    let entry = members.iter().find(|member| member.id.0 == node);
                    let same = entry
                        .and_then(|member| member.addrs.as_ref())
                        .is_some_and(|addrs| addrs.peer_addr == peer_addr && addrs.client_addr == client_addr);
                    if !same {
                        let asked = format!("node {node}'s certificate joins only as the member an admin added");
                        let why = match (entry, entry.and_then(|member| member.addrs.as_ref())) {
                            (_, Some(addrs)) => format!(
                                "{asked}: it holds node {node} at peer {} and client {}, not at {peer_addr} and \
                                 {client_addr}",
                                addrs.peer_addr, addrs.client_addr
                            ),
                            // A founding member: its addresses are the
                            // --peers of the founders, not an admin's entry.
                            (Some(_), None) => format!(
                                "{asked}: node {node} is a founding member, which starts without --join (with \
                                 a lost data directory, with --initial-cluster-state existing)"
                            ),
                            (None, None) => format!(
                                "{asked}: it does not hold node {node}; run `fencelock member add {node} \
                                 {peer_addr} {client_addr}` as an admin first"
                            ),
                        };
                        return Err(Failure::Denied(format!("permission denied: {why}")));
                    }
                }
                Ok(Out::member(proto::MemberResponse {
                    members: members.iter().map(|member| identity.member(member)).collect(),
                    index,
                    ..Default::default()
                }))
            }
        });
        let request = change.map_or(ClientRequest::Read(Query::Members), ClientRequest::ChangeMembers);
        self.client(conn, request, reply);
        Ok(())
    }

    fn read(&self, conn: ConnId, linearizable: bool, query: Query, reply: Responder) {
        let request = if linearizable { ClientRequest::Read(query) } else { ClientRequest::ReadLocal(query) };
        self.client(conn, request, reply);
    }

    fn client(&self, conn: ConnId, request: ClientRequest, reply: Responder) {
        self.send(DriverRequest::Client { conn, request, reply });
    }

    /// Answers from the driver's status, without waiting for it here: this
    /// runs on the client listener's event loop. Peer addresses are shown
    /// to admins only (to everyone without TLS).
    fn status(&self, admin: bool, sink: ResponseSink) {
        let identity = Arc::clone(&self.identity);
        let deliver = StatusCallback::new(move |status| {
            let response = match status {
                Some(status) => proto::Response {
                    kind: Some(Out::status(identity.status_response(&status, admin))),
                    ..Default::default()
                },
                None => {
                    error_response(0, ErrorCode::UNAVAILABLE, "no status: the node is starting or stopping")
                }
            };
            sink.send(response);
        });
        if let Err(crossbeam_channel::SendError(DriverRequest::StatusTo { deliver })) =
            self.driver.send(DriverRequest::StatusTo { deliver })
        {
            deliver.deliver(None);
        }
    }

    /// Wraps the sink so that the driver's reply becomes a response; a
    /// driver error becomes an error response with its stable code.
    fn responder<A: Answer>(
        &self,
        sink: ResponseSink,
        convert: impl FnOnce(Result<A, RequestError>) -> Result<Out, Failure> + Send + 'static,
    ) -> Responder {
        let id = sink.id();
        let identity = Arc::clone(&self.identity);
        Responder::new(move |reply| {
            let response = match convert(A::of(reply)) {
                Ok(kind) => proto::Response { id, kind: Some(kind), ..Default::default() },
                Err(Failure::Driver(err)) => {
                    error_to_response(id, &err, |leader: Option<NodeId>| identity.client_addr_of(leader?.0))
                }
                Err(Failure::Denied(message)) => error_response(id, ErrorCode::PERMISSION_DENIED, message),
                Err(Failure::Invalid(message)) => error_response(id, ErrorCode::INVALID_ARGUMENT, message),
                Err(Failure::NoSession(message)) => error_response(id, ErrorCode::NO_SESSION, message),
            };
            sink.send(response)
        })
    }

    fn send(&self, request: DriverRequest) {
        // The driver ends only when the node stops; a request that cannot
        // reach it is answered through its responder when dropped.
        if let Err(crossbeam_channel::SendError(request)) = self.driver.send(request) {
            refuse(request);
        }
    }
}

impl Identity {
    fn status_response(&self, status: &NodeStatus, admin: bool) -> proto::StatusResponse {
        let leader_id = status.leader.map_or(0, |leader| leader.0);
        proto::StatusResponse {
            node_id: self.node_id,
            role: match status.role {
                Role::Leader => "leader",
                Role::Follower => "follower",
                Role::Candidate => "candidate",
                Role::PreCandidate => "pre-candidate",
            }
            .to_owned(),
            term: status.term,
            leader_id,
            leader_addr: self.client_addr_of(leader_id).unwrap_or_default(),
            commit_index: status.commit_index,
            applied_index: status.applied_index,
            last_index: status.last_index,
            snapshot_index: status.snapshot_index,
            snapshot_bytes: status.snapshot_bytes,
            locks: status.locks as u64,
            last_token: status.last_token.map_or(0, FencingToken::get),
            members: self.members(status, admin).into(),
            rejoining: status.rejoining,
            cluster_id: status.cluster_id.map(|id| id.to_string()).unwrap_or_default(),
            starting: status.starting,
            waiting_for: status.waiting_for.clone(),
            quorum: status.has_quorum(),
            ..Default::default()
        }
    }

    /// Where this node knows the members of its --peers are reached (their
    /// client addresses from their hellos), for a membership change to
    /// record.
    fn known_members(&self) -> Vec<(NodeId, fencelock_fsm::MemberAddrs)> {
        self.peers
            .iter()
            .filter_map(|(id, peer_addr)| {
                let client_addr = self.client_addr_of(*id)?;
                Some((NodeId(*id), fencelock_fsm::MemberAddrs { peer_addr: peer_addr.clone(), client_addr }))
            })
            .collect()
    }

    /// One member as a membership answer shows it: the addresses a
    /// membership change recorded, else this node's --peers and what the
    /// member's hello said.
    fn member(&self, member: &fencelock_raft::Member) -> proto::Member {
        let id = member.id.0;
        let (peer_addr, client_addr) = match &member.addrs {
            Some(addrs) => (addrs.peer_addr.clone(), addrs.client_addr.clone()),
            None => (
                self.peers.get(&id).cloned().unwrap_or_default(),
                self.client_addr_of(id).unwrap_or_default(),
            ),
        };
        proto::Member {
            id,
            peer_addr,
            client_addr,
            role: member.role.name().to_owned(),
            ..Default::default()
        }
    }

    /// The members this node knows: the voters and learners of its
    /// configuration, else (while it starts) the configured peers.
    fn members(&self, status: &NodeStatus, admin: bool) -> Vec<proto::Member> {
        let mut roles: BTreeMap<u64, &'static str> = BTreeMap::new();
        for id in status.learners.iter() {
            roles.insert(*id, "learner");
        }
        for id in status.voters.iter().chain(&status.voters_outgoing) {
            roles.insert(*id, "voter");
        }
        if roles.is_empty() {
            roles = self.peers.keys().map(|id| (*id, "voter")).collect();
        }
        roles
            .into_iter()
            .map(|(id, role)| proto::Member {
                id,
                peer_addr: match self.peers.get(&id) {
                    Some(addr) if admin => addr.to_string(),
                    _ => String::new(),
                },
                client_addr: self.client_addr_of(id).unwrap_or_default(),
                reachable: status.reachable.contains(&id),
                role: role.to_owned(),
                ..Default::default()
            })
            .collect()
    }

    /// Where node `id`'s clients connect: this node's from its config,
    /// others' from what they announced when they connected.
    fn client_addr_of(&self, id: u64) -> Option<String> {
        if id == self.node_id {
            return Some(self.client_addr.clone());
        }
        self.directory.client_addr(id)
    }
}

/// Answers a request the driver never took.
fn refuse(request: DriverRequest) {
    request.refuse();
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

fn lock_info(key: &Key, held: &fencelock_raft::HeldLock) -> proto::LockInfo {
    let lock = &held.lock;
    proto::LockInfo {
        key: key.as_bytes().to_vec(),
        token: lock.token.get(),
        owner: lock.owner.as_bytes().to_vec(),
        lease_ms: lock.lease_ms.get(),
        remaining_ms: held.remaining_ms.unwrap_or(0),
        delayed: lock.delayed,
        value: lock.value.as_bytes().to_vec(),
        share: match held.share {
            None => proto::Share::EXCLUSIVE,
            Some(Share::Read) => proto::Share::READ,
            Some(Share::Write) => proto::Share::WRITE,
            Some(Share::Permit(_)) => proto::Share::PERMIT,
        },
        permits: held.share.map_or(0, Share::permits),
        session: lock.session.map_or(0, FencingToken::get),
        ..Default::default()
    }
}

/// A watch's change as the protocol says it.
fn watch_event(event: &WatchEvent) -> proto::WatchEvent {
    proto::WatchEvent {
        index: event.index,
        key: event.key.as_bytes().to_vec(),
        kind: match event.kind {
            WatchKind::Granted => proto::WatchEventKind::WATCH_EVENT_KIND_GRANTED,
            WatchKind::Released => proto::WatchEventKind::WATCH_EVENT_KIND_RELEASED,
            WatchKind::Expired => proto::WatchEventKind::WATCH_EVENT_KIND_EXPIRED,
            WatchKind::Delayed => proto::WatchEventKind::WATCH_EVENT_KIND_DELAYED,
            WatchKind::DelayLifted => proto::WatchEventKind::WATCH_EVENT_KIND_DELAY_LIFTED,
            WatchKind::Proclaimed => proto::WatchEventKind::WATCH_EVENT_KIND_PROCLAIMED,
        },
        token: event.token.get(),
        owner: event.owner.as_bytes().to_vec(),
        value: event.value.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// A reply of the wrong shape: a bug, reported as INTERNAL.

/// Locks the state machine refused to release or renew for this user.
fn not_yours(locks: &[(&Key, FencingToken)]) -> Failure {
    let locks: Vec<String> = locks.iter().map(|(key, token)| format!("{key} (token {token})")).collect();
    Failure::Denied(format!("permission denied: another user's lock: {}", locks.join(", ")))
}

/// Whether `addr` is HOST:PORT (a host name or an IP address, a port
/// above 0), the form member addresses take.
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
mod tests {
    use super::host_port;

    #[test]
    fn member_addresses_are_host_port_and_nonsense_is_refused() {
        for good in ["127.0.0.1:7001", "[::1]:7001", "lock-4.example.com:7101", "localhost:1"] {
            assert_eq!(host_port(good), Ok(()), "{good}");
        }
        let long = format!("{}:7001", "a".repeat(fencelock_fsm::MEMBER_ADDR_MAX));
        for bad in
            ["", "7001", "host:", "host:0", "host:65536", ":7001", "a b:1", "x..y:1", "-:", long.as_str()]
        {
            assert!(host_port(bad).is_err(), "{bad:?}");
        }
    }
}
