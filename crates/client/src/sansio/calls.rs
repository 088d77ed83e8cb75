//! Each operation's request, and how its answer reads. Pure functions of
//! their arguments: the shells send what these build and hand back what came.

use std::time::Duration;

use fencelock_types::client_pb::{
    AcquireOutcome, AcquireRequest, CheckRequest, GetRequest, ListRequest, LockRef, ProclaimRequest,
    ReleaseRequest, RenewRequest, Request_oneof_kind, Response_oneof_kind, SessionCloseRequest,
    SessionKeepAliveRequest, SessionOpenRequest, StatusRequest, WatchRequest,
};

use fencelock_types::{client_pb, Share};

use crate::types::{Grant, LockInfo, NodeStatus, Released, Renewed, Session, WatchBatch};
use crate::ClientError;

/// Milliseconds, saturating: a lease too long for the wire is refused by the
/// server's bounds rather than wrapped.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// What an acquire asks for: a plain lock with its value, or a share.
#[derive(Clone, Copy, Debug)]
pub enum Acquiring<'a> {
    Exclusive(&'a [u8]),
    Shared(Share),
}

impl Acquiring<'_> {
    /// The acquire request for `owner` and `key`.
    pub fn request(&self, owner: &[u8], key: &[u8], lease: Duration, wait: Duration) -> Request_oneof_kind {
        match *self {
            Acquiring::Exclusive(value) => acquire(owner, key, value, lease, wait),
            Acquiring::Shared(share) => acquire_shared(owner, key, share, lease, wait),
        }
    }

    /// [`Acquiring::request`] held under `session` (`None`: a lease of its
    /// own). Under a session the lease is the session's: `lease` is not
    /// sent (0).
    pub fn request_in(
        &self,
        session: Option<u64>,
        owner: &[u8],
        key: &[u8],
        lease: Duration,
        wait: Duration,
    ) -> Request_oneof_kind {
        match session {
            None => self.request(owner, key, lease, wait),
            Some(session) => in_session(self.request(owner, key, Duration::ZERO, wait), session),
        }
    }
}

/// An acquire request (`acquire`, `acquire_shared`) held under `session`
/// instead of a lease of its own; any other request as it is.
pub fn in_session(mut kind: Request_oneof_kind, session: u64) -> Request_oneof_kind {
    if let Request_oneof_kind::acquire(request) = &mut kind {
        request.session = session;
    }
    kind
}

/// An acquire of `key` for `owner`, with the lock's `value` (empty for
/// none), waiting up to `wait` in the leader's queue. A retry sends what
/// is left of the caller's wait.
pub fn acquire(
    owner: &[u8],
    key: &[u8],
    value: &[u8],
    lease: Duration,
    wait: Duration,
) -> Request_oneof_kind {
    Request_oneof_kind::acquire(AcquireRequest {
        key: key.to_vec(),
        lease_ms: millis(lease),
        owner: owner.to_vec(),
        wait_ms: millis(wait),
        value: value.to_vec(),
        ..Default::default()
    })
}

/// A shared acquire of `key` for `owner`: a reader or the writer of a
/// read-write lock, or a permit of a semaphore.
pub fn acquire_shared(
    owner: &[u8],
    key: &[u8],
    share: Share,
    lease: Duration,
    wait: Duration,
) -> Request_oneof_kind {
    let (share, permits) = match share {
        Share::Read => (client_pb::Share::READ, 0),
        Share::Write => (client_pb::Share::WRITE, 0),
        Share::Permit(permits) => (client_pb::Share::PERMIT, permits),
    };
    Request_oneof_kind::acquire(AcquireRequest {
        key: key.to_vec(),
        lease_ms: millis(lease),
        owner: owner.to_vec(),
        wait_ms: millis(wait),
        share,
        permits,
        ..Default::default()
    })
}

/// The holder of `key` under `token` replaces its lock's value.
pub fn proclaim(key: &[u8], token: u64, value: &[u8]) -> Request_oneof_kind {
    Request_oneof_kind::proclaim(ProclaimRequest {
        key: key.to_vec(),
        token,
        value: value.to_vec(),
        ..Default::default()
    })
}

/// How a proclaim ended: done, or not, and then which token holds the key
/// (`None`: it is free). The same shape as a release's.
pub fn proclaim_answer(kind: Response_oneof_kind) -> Result<Released, ClientError> {
    match kind {
        Response_oneof_kind::proclaim(response) => Ok(Released {
            released: response.proclaimed,
            holder_token: Some(response.holder_token).filter(|holder| *holder != 0 && !response.proclaimed),
        }),
        other => Err(unexpected("proclaim", &other)),
    }
}

/// A watch of the keys under `prefix`: the changes after `after` (`None`:
/// start, with the current holders), waiting up to `wait` for one.
pub fn watch(prefix: &[u8], after: Option<u64>, wait: Duration, limit: u32) -> Request_oneof_kind {
    Request_oneof_kind::watch(WatchRequest {
        prefix: prefix.to_vec(),
        after_index: after.unwrap_or(0),
        start: after.is_none(),
        wait_ms: millis(wait),
        limit,
        ..Default::default()
    })
}

/// What a watch was answered. An answer whose index goes below the asked
/// one is a node's bug, refused.
pub fn watch_answer(kind: Response_oneof_kind, after: Option<u64>) -> Result<WatchBatch, ClientError> {
    match kind {
        Response_oneof_kind::watch(response) => {
            if after.is_some_and(|after| response.index < after) {
                return Err(ClientError::Internal(format!(
                    "a watch after index {} was answered with index {}",
                    after.unwrap_or(0),
                    response.index
                )));
            }
            Ok(WatchBatch::from(response))
        }
        other => Err(unexpected("watch", &other)),
    }
}

/// The grant an acquire for `lease` was answered with, or why not.
pub fn acquire_answer(kind: Response_oneof_kind, lease: Duration) -> Result<Grant, ClientError> {
    let Response_oneof_kind::acquire(response) = kind else {
        return Err(unexpected("acquire", &kind));
    };
    let holder_token = (response.holder_token != 0).then_some(response.holder_token);
    match response.outcome {
        AcquireOutcome::GRANTED if response.token != 0 => {
            let lease = if response.lease_ms == 0 { lease } else { Duration::from_millis(response.lease_ms) };
            Ok(Grant { token: response.token, lease, existing: response.existing })
        }
        AcquireOutcome::GRANTED => Err(ClientError::Internal("granted without a token".to_owned())),
        AcquireOutcome::HELD if response.delayed => {
            Err(ClientError::Delayed { holder_token, left: Duration::from_millis(response.delay_left_ms) })
        }
        AcquireOutcome::HELD => Err(ClientError::Held { holder_token }),
        AcquireOutcome::WAIT_TIMED_OUT => Err(ClientError::WaitTimedOut { holder_token }),
        AcquireOutcome::ACQUIRE_OUTCOME_UNSPECIFIED => {
            Err(ClientError::Internal("acquire answered without an outcome".to_owned()))
        }
    }
}

/// A release of `key` if `token` holds it, or whoever holds it (`force`).
pub fn release(key: &[u8], token: u64, force: bool) -> Request_oneof_kind {
    Request_oneof_kind::release(ReleaseRequest { key: key.to_vec(), token, force, ..Default::default() })
}

pub fn release_answer(kind: Response_oneof_kind) -> Result<Released, ClientError> {
    match kind {
        Response_oneof_kind::release(response) => Ok(Released {
            released: response.released,
            holder_token: Some(response.holder_token).filter(|holder| *holder != 0 && !response.released),
        }),
        other => Err(unexpected("release", &other)),
    }
}

/// A renewal of every `(key, token)` to `lease`.
pub fn renew(locks: &[(Vec<u8>, u64)], lease: Duration) -> Request_oneof_kind {
    Request_oneof_kind::renew(RenewRequest {
        locks: locks
            .iter()
            .map(|(key, token)| LockRef { key: key.clone(), token: *token, ..Default::default() })
            .collect::<Vec<_>>()
            .into(),
        lease_ms: millis(lease),
        ..Default::default()
    })
}

/// How one renewal request was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenewAnswer {
    /// Per lock: `(key, token, renewed)`.
    pub results: Vec<(Vec<u8>, u64, bool)>,
    /// Per lock, in the same order: the token that holds its key (0: free).
    pub holders: Vec<u64>,
    /// The lease the server renewed to.
    pub lease: Duration,
}

pub fn renew_answer(kind: Response_oneof_kind, lease: Duration) -> Result<RenewAnswer, ClientError> {
    let Response_oneof_kind::renew(response) = kind else {
        return Err(unexpected("renew", &kind));
    };
    let granted = if response.lease_ms == 0 { lease } else { Duration::from_millis(response.lease_ms) };
    let holders = response.results.iter().map(|result| result.holder_token).collect();
    let results =
        response.results.into_iter().map(|result| (result.key, result.token, result.renewed)).collect();
    Ok(RenewAnswer { results, holders, lease: granted })
}

/// How the renewal of one lock went, from the answer to a renewal of it
/// alone.
pub fn renewed_one(answer: &RenewAnswer) -> Renewed {
    let renewed = answer.results.first().is_some_and(|(_, _, renewed)| *renewed);
    let holder_token = answer.holders.first().copied().filter(|holder| *holder != 0 && !renewed);
    Renewed { renewed, lease: answer.lease, holder_token }
}

/// Why a renewal error means the lock is lost for good (a renewal will
/// never succeed), or `None` when it is worth trying again while the lease
/// lasts. Permission denied: the user lost its `lock` right on the key (the
/// rules changed), or the renewal named another user's lock.
pub fn renew_error_loses(error: &ClientError) -> Option<String> {
    match error {
        ClientError::InvalidArgument(message) | ClientError::PermissionDenied(message) => {
            Some(format!("renewal refused: {message}"))
        }
        _ => None,
    }
}

/// The sentence a lock lost to a refused renewal carries.
pub fn refused_reason(token: u64, holder_token: u64) -> String {
    match holder_token {
        0 => format!("renewal refused: token {token} no longer holds the lock (it is free)"),
        holder => format!("renewal refused: token {token} no longer holds the lock (token {holder} does)"),
    }
}

pub fn get(key: &[u8], linearizable: bool) -> Request_oneof_kind {
    Request_oneof_kind::get(GetRequest { key: key.to_vec(), linearizable, ..Default::default() })
}

pub fn get_answer(kind: Response_oneof_kind) -> Result<Option<LockInfo>, ClientError> {
    match kind {
        Response_oneof_kind::get(response) => Ok(response.holder.into_option().map(LockInfo::from)),
        other => Err(unexpected("get", &other)),
    }
}

/// Every holder a get answered: the read-write lock's or semaphore's, or
/// the plain lock's one (none: the key is free).
pub fn holders_answer(kind: Response_oneof_kind) -> Result<Vec<LockInfo>, ClientError> {
    match kind {
        Response_oneof_kind::get(response) if response.holders.is_empty() => {
            Ok(response.holder.into_option().map(LockInfo::from).into_iter().collect())
        }
        Response_oneof_kind::get(response) => Ok(response.holders.into_iter().map(LockInfo::from).collect()),
        other => Err(unexpected("get", &other)),
    }
}

pub fn check(key: &[u8], token: u64) -> Request_oneof_kind {
    Request_oneof_kind::check(CheckRequest { key: key.to_vec(), token, ..Default::default() })
}

pub fn check_answer(kind: Response_oneof_kind) -> Result<bool, ClientError> {
    match kind {
        Response_oneof_kind::check(response) => Ok(response.holds),
        other => Err(unexpected("check", &other)),
    }
}

pub fn list(prefix: &[u8], limit: u32) -> Request_oneof_kind {
    Request_oneof_kind::list(ListRequest { prefix: prefix.to_vec(), limit, ..Default::default() })
}

pub fn list_answer(kind: Response_oneof_kind) -> Result<Vec<LockInfo>, ClientError> {
    match kind {
        Response_oneof_kind::list(response) => Ok(response.locks.into_iter().map(LockInfo::from).collect()),
        other => Err(unexpected("list", &other)),
    }
}

pub fn status() -> Request_oneof_kind {
    Request_oneof_kind::status(StatusRequest::default())
}

pub fn status_answer(kind: Response_oneof_kind) -> Result<NodeStatus, ClientError> {
    match kind {
        Response_oneof_kind::status(status) => Ok(NodeStatus::from(status)),
        other => Err(unexpected("status", &other)),
    }
}

/// Opens a session for `owner` with a time to live of `ttl` (within the
/// server's lease bounds). Not idempotent: a retry whose first attempt was
/// applied but not answered opens a second session, and the first lapses
/// unused after its TTL.
pub fn session_open(owner: &[u8], ttl: Duration) -> Request_oneof_kind {
    Request_oneof_kind::session_open(SessionOpenRequest {
        owner: owner.to_vec(),
        ttl_ms: millis(ttl),
        ..Default::default()
    })
}

/// Renews `session` for another TTL, from now.
pub fn session_keep_alive(session: u64) -> Request_oneof_kind {
    Request_oneof_kind::session_keep_alive(SessionKeepAliveRequest { session, ..Default::default() })
}

/// Closes `session`: everything held under it is released.
pub fn session_close(session: u64) -> Request_oneof_kind {
    Request_oneof_kind::session_close(SessionCloseRequest { session, ..Default::default() })
}

/// How a session request was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionAnswer {
    pub session: u64,
    /// The session's TTL (zero when not said: a close, or not found).
    pub ttl: Duration,
    /// False: the session is not open (closed, or it lapsed and everything
    /// it held is free); nothing was done.
    pub found: bool,
}

/// What a keep-alive or a close of `session` was answered. An answer about
/// another session is a node's bug, refused.
pub fn session_answer(kind: Response_oneof_kind, session: u64) -> Result<SessionAnswer, ClientError> {
    let Response_oneof_kind::session(response) = kind else {
        return Err(unexpected("session", &kind));
    };
    if response.session != session && response.session != 0 {
        return Err(ClientError::Internal(format!(
            "a request about session {session} was answered about session {}",
            response.session
        )));
    }
    Ok(SessionAnswer { session, ttl: Duration::from_millis(response.ttl_ms), found: response.found })
}

/// The session an open for `ttl` was answered with.
pub fn session_opened(kind: Response_oneof_kind, ttl: Duration) -> Result<Session, ClientError> {
    let Response_oneof_kind::session(response) = kind else {
        return Err(unexpected("session open", &kind));
    };
    if response.session == 0 || !response.found {
        return Err(ClientError::Internal("a session open was answered without a session".to_owned()));
    }
    let ttl = if response.ttl_ms == 0 { ttl } else { Duration::from_millis(response.ttl_ms) };
    Ok(Session { id: response.session, ttl })
}

/// The sentence a session lost to a keep-alive answered "not open" carries
/// (and every lock held under it).
pub fn session_gone_reason(session: u64) -> String {
    format!("session {session} is not open any more (closed, or it lapsed and everything it held was freed)")
}

/// The sentence a session closed by its own handle carries (and every lock
/// held under it).
pub fn session_closed_reason(session: u64) -> String {
    format!("session {session} was closed: everything held under it was released")
}

/// A node answered a `call` request with another kind of response.
pub fn unexpected(call: &str, kind: &Response_oneof_kind) -> ClientError {
    let got = match kind {
        Response_oneof_kind::acquire(_) => "acquire",
        Response_oneof_kind::release(_) => "release",
        Response_oneof_kind::renew(_) => "renew",
        Response_oneof_kind::get(_) => "get",
        Response_oneof_kind::check(_) => "check",
        Response_oneof_kind::list(_) => "list",
        Response_oneof_kind::status(_) => "status",
        Response_oneof_kind::backup(_) => "backup",
        Response_oneof_kind::member(_) => "member",
        Response_oneof_kind::leader_transfer(_) => "leader transfer",
        Response_oneof_kind::proclaim(_) => "proclaim",
        Response_oneof_kind::watch(_) => "watch",
        Response_oneof_kind::session(_) => "session",
    };
    ClientError::Internal(format!("a {call} request was answered with a {got} response"))
}

#[cfg(test)]
mod tests {
    use fencelock_types::client_pb::{
        AcquireResponse, ReleaseResponse, RenewResponse, RenewResult, SessionResponse,
    };

    use super::*;

    #[test]
    fn acquire_answers_read_as_grants_or_errors() {
        let lease = Duration::from_secs(10);
        let answer = |outcome, token, holder_token, lease_ms| {
            acquire_answer(
                Response_oneof_kind::acquire(AcquireResponse {
                    outcome,
                    token,
                    holder_token,
                    lease_ms,
                    ..Default::default()
                }),
                lease,
            )
        };
        assert_eq!(answer(AcquireOutcome::GRANTED, 7, 0, 0), Ok(Grant { token: 7, lease, existing: false }));
        assert_eq!(answer(AcquireOutcome::GRANTED, 7, 0, 2_000).map(|g| g.lease), Ok(Duration::from_secs(2)));
        assert!(matches!(answer(AcquireOutcome::GRANTED, 0, 0, 0), Err(ClientError::Internal(_))));
        assert_eq!(answer(AcquireOutcome::HELD, 0, 5, 0), Err(ClientError::Held { holder_token: Some(5) }));
        assert_eq!(
            answer(AcquireOutcome::WAIT_TIMED_OUT, 0, 0, 0),
            Err(ClientError::WaitTimedOut { holder_token: None })
        );
        assert!(matches!(
            acquire_answer(Response_oneof_kind::release(ReleaseResponse::default()), lease),
            Err(ClientError::Internal(message)) if message.contains("answered with a release")
        ));
    }

    #[test]
    fn release_and_renew_answers_name_the_holder_only_when_not_done() {
        let released = |released, holder_token| {
            release_answer(Response_oneof_kind::release(ReleaseResponse {
                released,
                holder_token,
                ..Default::default()
            }))
        };
        assert_eq!(released(true, 9), Ok(Released { released: true, holder_token: None }));
        assert_eq!(released(false, 9), Ok(Released { released: false, holder_token: Some(9) }));
        assert_eq!(released(false, 0), Ok(Released { released: false, holder_token: None }));

        let results = vec![RenewResult {
            key: b"k".to_vec(),
            token: 3,
            renewed: false,
            holder_token: 4,
            ..Default::default()
        }];
        let answer = renew_answer(
            Response_oneof_kind::renew(RenewResponse {
                results: results.into(),
                lease_ms: 0,
                ..Default::default()
            }),
            Duration::from_secs(5),
        );
        assert_eq!(
            answer,
            Ok(RenewAnswer {
                results: vec![(b"k".to_vec(), 3, false)],
                holders: vec![4],
                lease: Duration::from_secs(5)
            })
        );
        assert_eq!(refused_reason(3, 4), "renewal refused: token 3 no longer holds the lock (token 4 does)");
        assert!(renew_error_loses(&ClientError::PermissionDenied("no".into())).is_some());
        assert!(renew_error_loses(&ClientError::Unavailable("down".into())).is_none());
    }

    #[test]
    fn durations_go_on_the_wire_as_saturating_milliseconds() {
        assert_eq!(millis(Duration::from_micros(2_999)), 2);
        assert_eq!(millis(Duration::MAX), u64::MAX);
        let Request_oneof_kind::acquire(request) =
            acquire(b"o", b"k", b"", Duration::from_secs(2), Duration::from_millis(1_500))
        else {
            panic!("an acquire")
        };
        assert_eq!((request.lease_ms, request.wait_ms, request.owner), (2_000, 1_500, b"o".to_vec()));
    }

    fn session_response(session: u64, ttl_ms: u64, found: bool) -> Response_oneof_kind {
        Response_oneof_kind::session(SessionResponse { session, ttl_ms, found, ..Default::default() })
    }

    #[test]
    fn session_requests_carry_the_owner_ttl_and_id() {
        let Request_oneof_kind::session_open(open) = session_open(b"o", Duration::from_millis(2_500)) else {
            panic!("a session open")
        };
        assert_eq!((open.owner, open.ttl_ms), (b"o".to_vec(), 2_500));
        let Request_oneof_kind::session_keep_alive(keep) = session_keep_alive(17) else {
            panic!("a keep-alive")
        };
        assert_eq!(keep.session, 17);
        let Request_oneof_kind::session_close(close) = session_close(17) else { panic!("a close") };
        assert_eq!(close.session, 17);
    }

    #[test]
    fn acquires_under_a_session_carry_it_and_no_lease() {
        let wait = Duration::from_secs(1);
        let lease = Duration::from_secs(9);
        for acquiring in
            [Acquiring::Exclusive(b"v"), Acquiring::Shared(Share::Read), Acquiring::Shared(Share::Permit(3))]
        {
            let Request_oneof_kind::acquire(own) = acquiring.request_in(None, b"o", b"k", lease, wait) else {
                panic!("an acquire")
            };
            assert_eq!((own.session, own.lease_ms, own.wait_ms), (0, 9_000, 1_000));
            let Request_oneof_kind::acquire(under) = acquiring.request_in(Some(5), b"o", b"k", lease, wait)
            else {
                panic!("an acquire")
            };
            assert_eq!((under.session, under.lease_ms, under.wait_ms), (5, 0, 1_000));
            // Everything else as without a session.
            assert_eq!(AcquireRequest { session: 0, lease_ms: 9_000, ..under }, own);
        }
        // Only acquires have a session.
        assert_eq!(in_session(release(b"k", 3, false), 5), release(b"k", 3, false));
    }

    #[test]
    fn session_answers_read_as_sessions_or_errors() {
        let ttl = Duration::from_secs(10);
        assert_eq!(
            session_opened(session_response(12, 4_000, true), ttl),
            Ok(Session { id: 12, ttl: Duration::from_secs(4) })
        );
        // No TTL said: the one asked for.
        assert_eq!(session_opened(session_response(12, 0, true), ttl).map(|session| session.ttl), Ok(ttl));
        assert!(matches!(
            session_opened(session_response(0, 4_000, true), ttl),
            Err(ClientError::Internal(_))
        ));
        assert!(matches!(
            session_opened(session_response(12, 4_000, false), ttl),
            Err(ClientError::Internal(_))
        ));
        assert!(matches!(
            session_opened(Response_oneof_kind::release(ReleaseResponse::default()), ttl),
            Err(ClientError::Internal(message)) if message.contains("answered with a release")
        ));

        assert_eq!(
            session_answer(session_response(12, 4_000, true), 12),
            Ok(SessionAnswer { session: 12, ttl: Duration::from_secs(4), found: true })
        );
        assert_eq!(
            session_answer(session_response(12, 0, false), 12),
            Ok(SessionAnswer { session: 12, ttl: Duration::ZERO, found: false })
        );
        // An answer that names no session reads as the asked one's.
        assert_eq!(session_answer(session_response(0, 0, false), 12).map(|answer| answer.session), Ok(12));
        assert!(matches!(
            session_answer(session_response(13, 4_000, true), 12),
            Err(ClientError::Internal(message)) if message.contains("session 13")
        ));
        assert!(matches!(
            session_answer(Response_oneof_kind::renew(RenewResponse::default()), 12),
            Err(ClientError::Internal(message)) if message.contains("session request was answered with a renew")
        ));
        assert!(matches!(
            acquire_answer(session_response(12, 1, true), Duration::ZERO),
            Err(ClientError::Internal(message)) if message.contains("answered with a session response")
        ));
        assert!(session_gone_reason(12).starts_with("session 12 is not open any more"));
        assert!(session_closed_reason(12).starts_with("session 12 was closed"));
    }
}
