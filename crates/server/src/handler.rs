//! Serves client requests: checks each one ([`crate::parse`]), hands it to
//! the driver (the node loop's core, which takes it in the loop's next
//! turn) with how its answer becomes a response, and turns that answer,
//! typed per operation, into a protocol response with a stable error code.

use std::collections::BTreeMap;
use std::sync::Arc;

use crossbeam_channel::Sender;
use fencelock_net::{error_response, Handler, ResponseSink};
use fencelock_raft::answer::{Acquired, Opened, Proclaimed, Released, Renewal, SessionClosed, SessionKept};
use fencelock_raft::reply::{Checked, Holding, Listed, Membership, Transferred};
use fencelock_raft::shell::{Request as DriverRequest, Responder, StatusCallback};
use fencelock_raft::watch::{WatchAnswer, WatchEvent, WatchKind};
use fencelock_raft::{
    Answer, ClientRequest, ConnId, MemberChange, NodeId, NodeStatus, Query, RequestError, Role,
};
use fencelock_types::client_pb::{self as proto, ErrorCode, Response_oneof_kind as Out};
use fencelock_types::{FencingToken, Key, LeaseMs, Share};
use slog::{info, Logger};

use crate::access::Access;
use crate::backup::Backups;
use crate::errors::error_to_response;
use crate::parse::{parse, Parsed, Rules};

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
    /// Where the audit lines go: forced releases, membership changes,
    /// leader transfers and backups, each with the user who asked.
    pub logger: Logger,
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
        let rules = Rules { access: self.access.as_ref(), wait_max_ms: self.wait_max_ms };
        match parse(request, sink.user(), &rules) {
            Ok(parsed) => self.dispatch(parsed, sink),
            Err(refused) => {
                sink.send(error_response(id, refused.code, refused.message));
            }
        }
    }
}

/// Who asked, for the audit log: the TLS user; plain TCP authenticates no
/// one.
fn audit_user(sink: &ResponseSink) -> String {
    match sink.user() {
        Some(user) => user.to_owned(),
        None => "(plain TCP, no user)".to_owned(),
    }
}

/// How a request ends other than with its answer: a driver error, or a
/// refusal the state machine decided.
enum Failure {
    Driver(RequestError),
    /// Another user's lock or session: PERMISSION_DENIED.
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
    /// Hands a checked request to the node with how its answer, in the
    /// operation's own type, becomes a response.
    fn dispatch(&self, parsed: Parsed, sink: ResponseSink) {
        let conn = ConnId(sink.connection());
        let (request, reply) = match parsed {
            Parsed::Acquire { key, request } => {
                (request, self.responder(sink, move |reply| acquired(&key, reply)))
            }
            Parsed::Release { key, token, user } => {
                let asked = key.clone();
                let reply = match token {
                    Some(_) => self.responder(sink, move |reply| released(&asked, reply?)),
                    None => {
                        let action = format!("forced release of {key}");
                        self.audited(sink, action, move |reply| released(&asked, reply?))
                    }
                };
                (ClientRequest::Release { key, token, user }, reply)
            }
            Parsed::Renew { locks, lease_ms, user } => {
                let asked = locks.clone();
                let reply = self.responder(sink, move |reply| renewed(asked, lease_ms, reply?));
                (ClientRequest::Renew { locks, lease_ms, user }, reply)
            }
            Parsed::Proclaim { key, token, value, user } => {
                let asked = key.clone();
                let reply = self.responder(sink, move |reply| proclaimed(&asked, token, reply?));
                (ClientRequest::Proclaim { key, token, value, user }, reply)
            }
            Parsed::OpenSession { owner, ttl_ms } => {
                let reply = self.responder(sink, |reply| {
                    let Opened { session, ttl_ms } = reply?;
                    Ok(session_answer(session, Some(ttl_ms.get())))
                });
                (ClientRequest::OpenSession { owner, ttl_ms }, reply)
            }
            Parsed::KeepAlive { session, user } => {
                let reply = self.responder(sink, move |reply| Ok(session_kept(session, reply?)));
                (ClientRequest::KeepAlive { session, user }, reply)
            }
            Parsed::CloseSession { session, user } => {
                let reply = self.responder(sink, move |reply| Ok(session_closed(session, reply?)));
                (ClientRequest::CloseSession { session, user }, reply)
            }
            Parsed::Get { key, linearizable } => {
                let query = Query::Holder(key.clone());
                let reply = self.responder(sink, move |reply| Ok(holding(&key, reply?)));
                (
                    if linearizable { ClientRequest::Read(query) } else { ClientRequest::ReadLocal(query) },
                    reply,
                )
            }
            Parsed::Check { key, token } => {
                let reply = self.responder(sink, |reply| {
                    let Checked(holds) = reply?;
                    Ok(Out::check(proto::CheckResponse { holds, ..Default::default() }))
                });
                (ClientRequest::Read(Query::Check { key, token }), reply)
            }
            Parsed::List { prefix, limit } => {
                let reply = self.responder(sink, |reply| {
                    let Listed(locks) = reply?;
                    Ok(Out::list(proto::ListResponse {
                        locks: locks.iter().map(|(key, held)| lock_info(key, held)).collect(),
                        ..Default::default()
                    }))
                });
                (ClientRequest::Read(Query::List { prefix, limit }), reply)
            }
            Parsed::Watch(query) => {
                let reply = self.responder(sink, |reply| Ok(watched(reply?)));
                (ClientRequest::Watch(query), reply)
            }
            Parsed::Status { admin } => return self.status(admin, sink),
            Parsed::Backup(backup) => {
                if backup.offset == 0 {
                    // A backup is served in chunks, each asked for: its
                    // first is the one audited.
                    info!(self.logger, "audit"; "action" => "backup", "user" => audit_user(&sink));
                }
                let identity = Arc::clone(&self.identity);
                let leader_addr = move |leader: Option<NodeId>| identity.client_addr_of(leader?.0);
                return self.backups.serve(backup, sink, leader_addr, |reply| {
                    self.client(conn, ClientRequest::Read(Query::Table), reply)
                });
            }
            Parsed::Members(mut change) => {
                // Where the members of --peers are reached, as this node knows.
                if let Some(MemberChange::AddLearner { known, .. }) = &mut change {
                    *known = self.identity.known_members();
                }
                let action = change.as_ref().map(|change| match change {
                    MemberChange::AddLearner { id, peer_addr, client_addr, .. } => {
                        format!("member add {} {peer_addr} {client_addr}", id.0)
                    }
                    MemberChange::Promote(id) => format!("member promote {}", id.0),
                    MemberChange::Remove(id) => format!("member remove {}", id.0),
                });
                let reply = self.membership(sink, None, action);
                (change.map_or(ClientRequest::Read(Query::Members), ClientRequest::ChangeMembers), reply)
            }
            Parsed::Confirm { node, peer_addr, client_addr } => {
                let reply = self.membership(sink, Some((node, peer_addr, client_addr)), None);
                (ClientRequest::Read(Query::Members), reply)
            }
            Parsed::Transfer(to) => {
                let reply = self.audited(sink, format!("leader transfer to {}", to.0), |reply| {
                    let Transferred { leader } = reply?;
                    Ok(Out::leader_transfer(proto::LeaderTransferResponse {
                        leader_id: leader.0,
                        ..Default::default()
                    }))
                });
                (ClientRequest::TransferLeader(to), reply)
            }
        };
        self.client(conn, request, reply);
    }

    /// Answers with the membership. With `confirm` (a node's id and
    /// addresses), only if it holds that node at those addresses (a node's
    /// certificate joining, see [`crate::parse`]).
    /// With `action`, a change, audited.
    fn membership(
        &self,
        sink: ResponseSink,
        confirm: Option<(u64, String, String)>,
        action: Option<String>,
    ) -> Responder {
        let identity = Arc::clone(&self.identity);
        let convert = move |reply: Result<Membership, RequestError>| {
            let Membership { members, index } = reply?;
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
                        // A founding member: its addresses are the --peers
                        // of the founders, not an admin's entry.
                        (Some(_), None) => format!(
                            "{asked}: node {node} is a founding member, which starts without --join (with a lost \
                             data directory, with --initial-cluster-state existing)"
                        ),
                        (None, None) => format!(
                            "{asked}: it does not hold node {node}; run `fencelock member add {node} {peer_addr} \
                             {client_addr}` as an admin first"
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
        };
        match action {
            Some(action) => self.audited(sink, action, convert),
            None => self.responder(sink, convert),
        }
    }

    /// [`ClientHandler::responder`] for an action the audit log records:
    /// one line when it is answered, with the user who asked, the action,
    /// and how it ended (done, or why not).
    fn audited<A: Answer>(
        &self,
        sink: ResponseSink,
        action: String,
        convert: impl FnOnce(Result<A, RequestError>) -> Result<Out, Failure> + Send + 'static,
    ) -> Responder {
        let (logger, user) = (self.logger.clone(), audit_user(&sink));
        self.responder(sink, move |reply| {
            let answer = convert(reply);
            let outcome = match &answer {
                Ok(_) => "done".to_owned(),
                Err(Failure::Driver(err)) => format!("not done: {err}"),
                Err(Failure::Denied(why) | Failure::Invalid(why) | Failure::NoSession(why)) => {
                    format!("refused: {why}")
                }
            };
            info!(logger, "audit"; "action" => action, "user" => user, "outcome" => outcome);
            answer
        })
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
            commit_index: status.log.commit_index,
            applied_index: status.log.applied_index,
            last_index: status.log.last_index,
            snapshot_index: status.log.snapshot_index,
            snapshot_bytes: status.log.snapshot_bytes,
            locks: status.locks as u64,
            last_token: status.last_token.map_or(0, FencingToken::get),
            members: self.members(status, admin).into(),
            rejoining: status.rejoining,
            cluster_id: status.cluster_id.map(|id| id.to_string()).unwrap_or_default(),
            starting: status.starting,
            waiting_for: status.conf.waiting_for.clone(),
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
        for id in status.conf.learners.iter() {
            roles.insert(*id, "learner");
        }
        for id in status.conf.voters.iter().chain(&status.conf.voters_outgoing) {
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
                reachable: status.conf.reachable.contains(&id),
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

/// An acquire's answer as the protocol says it: granted, held (by whom, or
/// held back by lock-delay), the wait ran out; or a refusal.
fn acquired(key: &Key, reply: Result<Acquired, RequestError>) -> Result<Out, Failure> {
    let outcome = |outcome, token: Option<FencingToken>, lease_ms: u64, holder: Option<FencingToken>| {
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
        Ok(Acquired::Mismatch { permits: 0 }) => {
            Err(Failure::Invalid(format!("key {key} is a read-write lock: acquire it with READ or WRITE")))
        }
        Ok(Acquired::Mismatch { permits }) => Err(Failure::Invalid(format!(
            "key {key} is a semaphore of {permits} permits: acquire it with PERMIT and permits {permits}"
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
}

fn released(key: &Key, released: Released) -> Result<Out, Failure> {
    match released {
        Released::Released { token } => Ok(Out::release(proto::ReleaseResponse {
            released: true,
            token: token.get(),
            ..Default::default()
        })),
        Released::NotHeld { holder_token } => Ok(Out::release(proto::ReleaseResponse {
            holder_token: holder_token.map_or(0, FencingToken::get),
            ..Default::default()
        })),
        Released::NotYours { token } => Err(not_yours(&[(key, token)])),
    }
}

/// The renewals of the locks `asked`, one each in order (as the node
/// answers them); refused as a whole if any is another user's.
fn renewed(
    asked: Vec<(Key, FencingToken)>,
    lease_ms: LeaseMs,
    renewals: Vec<Renewal>,
) -> Result<Out, Failure> {
    let denied: Vec<(&Key, FencingToken)> = asked
        .iter()
        .zip(&renewals)
        .filter_map(|((key, _), renewal)| match renewal {
            Renewal::NotYours { token } => Some((key, *token)),
            Renewal::Renewed { .. } | Renewal::NotHeld { .. } => None,
        })
        .collect();
    if !denied.is_empty() {
        return Err(not_yours(&denied));
    }
    // The answer's lease is the shortest in force among the locks renewed
    // (a lock under a session has the session's TTL, whatever was asked):
    // a client that counts it from when it sent the renewal never outlives
    // a lease. The one asked when none was renewed.
    let in_force = renewals
        .iter()
        .filter_map(|renewal| match renewal {
            Renewal::Renewed { lease_ms, .. } => Some(lease_ms.get()),
            Renewal::NotHeld { .. } | Renewal::NotYours { .. } => None,
        })
        .min()
        .unwrap_or(lease_ms.get());
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
            lease_ms: match renewal {
                Renewal::Renewed { lease_ms, .. } => lease_ms.get(),
                Renewal::NotHeld { .. } | Renewal::NotYours { .. } => 0,
            },
            ..Default::default()
        })
        .collect();
    Ok(Out::renew(proto::RenewResponse { results, lease_ms: in_force, ..Default::default() }))
}

fn proclaimed(key: &Key, asked: FencingToken, proclaimed: Proclaimed) -> Result<Out, Failure> {
    match proclaimed {
        Proclaimed::Proclaimed { token } => Ok(Out::proclaim(proto::ProclaimResponse {
            proclaimed: true,
            token: token.get(),
            ..Default::default()
        })),
        Proclaimed::NotHeld { holder_token } => Ok(Out::proclaim(proto::ProclaimResponse {
            token: asked.get(),
            holder_token: holder_token.map_or(0, FencingToken::get),
            ..Default::default()
        })),
        Proclaimed::NotYours { token } => Err(not_yours(&[(key, token)])),
        // The token holds the key, as a reader, the writer or a permit:
        // `proclaimed: false` would tell it that it lost the key.
        Proclaimed::SharedHolder => Err(Failure::Invalid(format!(
            "key {key} is a read-write lock or a semaphore: token {asked} holds it as a reader, writer or permit, \
             which carries no value to proclaim (values are for plain locks)"
        ))),
    }
}

/// A session's answer: `found` with the TTL in force (0 once closed), or
/// not found.
fn session_answer(session: FencingToken, ttl_ms: Option<u64>) -> Out {
    Out::session(proto::SessionResponse {
        session: session.get(),
        ttl_ms: ttl_ms.unwrap_or(0),
        found: ttl_ms.is_some(),
        ..Default::default()
    })
}

/// A keep-alive's answer. Another user's session is answered as one not
/// open (nothing was done either way): a session id tells a user nothing
/// of other users' sessions, not even that one exists.
fn session_kept(session: FencingToken, kept: SessionKept) -> Out {
    match kept {
        SessionKept::Kept { ttl_ms } => session_answer(session, Some(ttl_ms.get())),
        SessionKept::NotOpen | SessionKept::NotYours => session_answer(session, None),
    }
}

/// A close's answer; another user's session as for [`session_kept`].
fn session_closed(session: FencingToken, closed: SessionClosed) -> Out {
    match closed {
        SessionClosed::Closed => session_answer(session, Some(0)),
        SessionClosed::NotOpen | SessionClosed::NotYours => session_answer(session, None),
    }
}

/// A get's answer: the holder of a plain key, or the holders of a shared
/// one (the first also as `holder`).
fn holding(key: &Key, holding: Holding) -> Out {
    match holding {
        Holding::Plain(holder) => Out::get(proto::GetResponse {
            holder: holder.map(|held| lock_info(key, &held)).into(),
            ..Default::default()
        }),
        Holding::Shared(holders) => Out::get(proto::GetResponse {
            holder: holders.first().map(|held| lock_info(key, held)).into(),
            holders: holders.iter().map(|held| lock_info(key, held)).collect(),
            ..Default::default()
        }),
    }
}

fn watched(answer: WatchAnswer) -> Out {
    Out::watch(proto::WatchResponse {
        events: answer.events.iter().map(watch_event).collect(),
        index: answer.index,
        has_current: answer.current.is_some(),
        current: answer.current.iter().flatten().map(|(key, held)| lock_info(key, held)).collect(),
        compacted: answer.compacted,
        ..Default::default()
    })
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

/// Locks the state machine refused to release or renew for this user.
fn not_yours(locks: &[(&Key, FencingToken)]) -> Failure {
    let locks: Vec<String> = locks.iter().map(|(key, token)| format!("{key} (token {token})")).collect();
    Failure::Denied(format!("permission denied: another user's lock: {}", locks.join(", ")))
}

#[cfg(test)]
#[path = "handler_tests.rs"]
mod tests;
