//! [`Client`]: the connection pool, the retry loop and the calls.
//!
//! Every call goes through one retry loop. It starts at the node that last
//! answered, follows `NOT_LEADER` to the leader's address, moves on to the
//! next endpoint (with backoff) when a node is unavailable, times out or
//! cannot be reached, and gives up with [`ClientError::Unavailable`] once the
//! call's budget is spent. Retrying is safe: an acquire carries the owner, and
//! a retried acquire by the same owner gets the same token, never a second
//! grant.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use fencelock_types::client_pb::{
    AcquireOutcome, AcquireRequest, CheckRequest, ErrorCode, GetRequest, ListRequest, LockRef,
    ReleaseRequest, RenewRequest, Request, Request_oneof_kind, Response, Response_oneof_kind, StatusRequest,
};

use crate::config::{default_owner, ClientConfig};
use crate::connection::{CallError, Connection};
use crate::guard::LockGuard;
use crate::local::LocalHold;
use crate::renewer::{HeldLock, Renewer};
use crate::types::{Grant, LockInfo, NodeStatus, Released, Renewed};
use crate::ClientError;

/// The first pause after a failed attempt; it doubles up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// The least time an attempt gets, even at the end of its call's budget.
const ATTEMPT_MIN: Duration = Duration::from_millis(100);

/// A blocking, thread-safe fencelock client. Clones share connections, the
/// owner identity and the background renewer.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("endpoints", &self.inner.endpoints)
            .field("owner", &String::from_utf8_lossy(&self.inner.owner))
            .finish_non_exhaustive()
    }
}

/// What clones of one [`Client`] share.
#[derive(Debug)]
pub(crate) struct Inner {
    endpoints: Vec<String>,
    /// TLS to every node, as the configured user.
    tls: Option<Arc<rustls::ClientConfig>>,
    pub(crate) request_timeout: Duration,
    pub(crate) retry_for: Duration,
    owner: Vec<u8>,
    connections: Mutex<HashMap<String, Arc<Connection>>>,
    /// The endpoint that last answered successfully: where calls start.
    preferred: Mutex<Option<String>>,
    pub(crate) renewer: Renewer,
    /// Told while a call keeps retrying ([`Client::on_retrying`]).
    retrying: Mutex<Option<RetryObserver>>,
}

/// What [`Client::on_retrying`] is told while a call keeps retrying.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retrying {
    /// How long the call has been trying.
    pub elapsed: Duration,
    /// How long it goes on before giving up (`retry_for`).
    pub left: Duration,
    /// Why the last attempt failed.
    pub last_error: String,
}

#[derive(Clone)]
struct RetryObserver(Arc<dyn Fn(&Retrying) + Send + Sync>);

impl std::fmt::Debug for RetryObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RetryObserver")
    }
}

/// A call that still retries after this long tells the observer, and then
/// again every [`RETRY_NOTICE_EVERY`].
pub const RETRY_NOTICE_AFTER: Duration = Duration::from_secs(1);
const RETRY_NOTICE_EVERY: Duration = Duration::from_secs(5);

/// The answer to one renew request.
pub(crate) struct Renewal {
    /// `(key, token, renewed)` per lock.
    pub(crate) results: Vec<(Vec<u8>, u64, bool)>,
    /// Per lock not renewed, the token that holds its key (0: free).
    pub(crate) holders: Vec<u64>,
    /// When the attempt that got the answer was sent: the renewed leases
    /// count from then.
    pub(crate) sent: Instant,
    /// The lease the server renewed to.
    pub(crate) lease: Duration,
}

/// How one attempt (one request to one node) ended.
pub(crate) enum Attempt {
    Done(Response_oneof_kind),
    /// `NOT_LEADER` naming the leader's client address.
    Redirect {
        leader: String,
        reason: String,
    },
    /// Worth trying again elsewhere: the reason is kept for the final error.
    Retry(String),
    /// Final: retrying will not help.
    Fail(ClientError),
}

impl Client {
    /// Builds a client. Connections are opened on first use, so this does
    /// not fail when the cluster is down; it fails only on an empty endpoint
    /// list (or an empty owner) with [`ClientError::InvalidArgument`].
    pub fn connect(config: ClientConfig) -> Result<Client, ClientError> {
        let endpoints: Vec<String> = config
            .endpoints
            .iter()
            .map(|endpoint| endpoint.trim().to_owned())
            .filter(|e| !e.is_empty())
            .collect();
        if endpoints.is_empty() {
            return Err(ClientError::InvalidArgument("no endpoints given".to_owned()));
        }
        if config.owner.as_ref().is_some_and(Vec::is_empty) {
            return Err(ClientError::InvalidArgument("owner is empty".to_owned()));
        }
        let tls = match &config.tls {
            Some(tls) => Some(
                fencelock_tls::client_tls(&fencelock_tls::Layout::new(&tls.certs_dir), &tls.user)
                    .map_err(|err| ClientError::InvalidArgument(format!("TLS: {err}")))?,
            ),
            None => None,
        };
        let inner = Inner {
            endpoints,
            tls,
            request_timeout: config.request_timeout,
            retry_for: config.retry_for,
            // Over TLS an owner is bound to the user: `user/suffix`.
            owner: config.owner.unwrap_or_else(|| match &config.tls {
                Some(tls) => [tls.user.as_bytes(), b"/", &default_owner()].concat(),
                None => default_owner(),
            }),
            connections: Mutex::new(HashMap::new()),
            preferred: Mutex::new(None),
            renewer: Renewer::default(),
            retrying: Mutex::new(None),
        };
        Ok(Client { inner: Arc::new(inner) })
    }

    /// The owner identity this client's acquires carry.
    pub fn owner(&self) -> &[u8] {
        &self.inner.owner
    }

    /// Calls `observer` when a call has kept retrying (no node answered,
    /// no leader) for [`RETRY_NOTICE_AFTER`], and every 5 s after, with the
    /// last error: a command-line tool says so instead of waiting
    /// silently. Every call of this client is reported, the background
    /// renewer's included.
    pub fn on_retrying(&self, observer: impl Fn(&Retrying) + Send + Sync + 'static) {
        *lock(&self.inner.retrying) = Some(RetryObserver(Arc::new(observer)));
    }

    /// Acquires `key` for `lease`, waiting up to `wait` in the leader's queue
    /// if another owner holds it (`Duration::ZERO` answers at once). The
    /// returned guard is renewed in the background and released on drop.
    pub fn acquire(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        let owner = self.inner.owner.clone();
        self.acquire_as(&owner, key, lease, wait)
    }

    /// [`Client::acquire`] under an explicit owner identity.
    pub fn acquire_as(
        &self,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        let key = key.as_ref();
        // Started before the request, so that a lock is never granted with
        // nothing to renew it.
        self.inner.renewer.start(&self.inner).map_err(ClientError::Internal)?;
        // A guard of this process that holds the key for the same owner is
        // waited for first: the server would hand its lock over (crate::local).
        let started = Instant::now();
        let local = LocalHold::take(owner, key, wait)?;
        let (grant, sent) = self.inner.acquire(owner, key, lease, wait.saturating_sub(started.elapsed()))?;
        local.granted(grant.token);
        let lock = Arc::new(HeldLock::new(key.to_vec(), grant.token, grant.lease, sent));
        self.inner.renewer.add(Arc::clone(&lock));
        Ok(LockGuard::new(self.clone(), lock, local))
    }

    /// Acquires `key` for `owner` without a guard: nothing renews the lock and
    /// nothing releases it, so it lives until its lease runs out or someone
    /// releases it by token. For tools that exit while holding a lock (such
    /// as `fencelock acquire`).
    pub fn acquire_raw(
        &self,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Duration,
    ) -> Result<Grant, ClientError> {
        self.inner.acquire(owner, key.as_ref(), lease, wait).map(|(grant, _)| grant)
    }

    /// Releases `key` if `token` holds it. False: it did not (any more).
    pub fn release(&self, key: impl AsRef<[u8]>, token: u64) -> Result<bool, ClientError> {
        self.release_outcome(key, token).map(|outcome| outcome.released)
    }

    /// As [`Client::release`], saying also, when the lock was not released,
    /// which token holds the key (if any).
    pub fn release_outcome(&self, key: impl AsRef<[u8]>, token: u64) -> Result<Released, ClientError> {
        self.inner.release(key.as_ref(), token, false, self.inner.retry_for)
    }

    /// Releases `key` whoever holds it. False: it was free.
    pub fn force_release(&self, key: impl AsRef<[u8]>) -> Result<bool, ClientError> {
        self.inner.release(key.as_ref(), 0, true, self.inner.retry_for).map(|outcome| outcome.released)
    }

    /// Renews every `(key, token)` to `lease` in one request. Each result says
    /// whether that token still held its key and was renewed.
    pub fn renew(
        &self,
        locks: &[(Vec<u8>, u64)],
        lease: Duration,
    ) -> Result<Vec<(Vec<u8>, u64, bool)>, ClientError> {
        self.inner.renew(locks, lease, self.inner.retry_for).map(|renewal| renewal.results)
    }

    /// Renews `key` held under `token` to `lease`, saying, when it was not
    /// renewed, which token holds the key (if any).
    pub fn renew_outcome(
        &self,
        key: impl AsRef<[u8]>,
        token: u64,
        lease: Duration,
    ) -> Result<Renewed, ClientError> {
        let renewal = self.inner.renew(&[(key.as_ref().to_vec(), token)], lease, self.inner.retry_for)?;
        let renewed = renewal.results.first().is_some_and(|(_, _, renewed)| *renewed);
        let holder_token = renewal.holders.first().copied().filter(|holder| *holder != 0 && !renewed);
        Ok(Renewed { renewed, lease: renewal.lease, holder_token })
    }

    /// Who holds `key`, or `None` when it is free. Linearizable reads ask the
    /// leader; others take the answering node's (maybe stale) table.
    pub fn get(&self, key: impl AsRef<[u8]>, linearizable: bool) -> Result<Option<LockInfo>, ClientError> {
        let request = GetRequest { key: key.as_ref().to_vec(), linearizable, ..Default::default() };
        match self.inner.call_simple(Request_oneof_kind::get(request))? {
            Response_oneof_kind::get(response) => Ok(response.holder.into_option().map(LockInfo::from)),
            other => Err(unexpected("get", &other)),
        }
    }

    /// Whether `token` holds `key` now (linearizable).
    pub fn check(&self, key: impl AsRef<[u8]>, token: u64) -> Result<bool, ClientError> {
        let request = CheckRequest { key: key.as_ref().to_vec(), token, ..Default::default() };
        match self.inner.call_simple(Request_oneof_kind::check(request))? {
            Response_oneof_kind::check(response) => Ok(response.holds),
            other => Err(unexpected("check", &other)),
        }
    }

    /// Up to `limit` locks whose keys start with `prefix`, in key order
    /// (linearizable). A `limit` of 0 means the server's maximum.
    pub fn list(&self, prefix: impl AsRef<[u8]>, limit: u32) -> Result<Vec<LockInfo>, ClientError> {
        let request = ListRequest { prefix: prefix.as_ref().to_vec(), limit, ..Default::default() };
        match self.inner.call_simple(Request_oneof_kind::list(request))? {
            Response_oneof_kind::list(response) => {
                Ok(response.locks.into_iter().map(LockInfo::from).collect())
            }
            other => Err(unexpected("list", &other)),
        }
    }

    /// Asks the node at `endpoint` (which need not be in the configured
    /// endpoints) for its status. One attempt, no retries elsewhere.
    pub fn status(&self, endpoint: &str) -> Result<NodeStatus, ClientError> {
        let kind = Request_oneof_kind::status(StatusRequest::default());
        match self.inner.attempt(endpoint, kind, self.inner.request_timeout) {
            Attempt::Done(Response_oneof_kind::status(status)) => Ok(NodeStatus::from(status)),
            Attempt::Done(other) => Err(unexpected("status", &other)),
            Attempt::Redirect { reason, .. } | Attempt::Retry(reason) => {
                Err(ClientError::Unavailable(reason))
            }
            Attempt::Fail(error) => Err(error),
        }
    }
}

impl Inner {
    /// One acquire, retried as needed; also returns when the successful
    /// attempt was sent, which is when the lease starts on the client's side.
    pub(crate) fn acquire(
        &self,
        owner: &[u8],
        key: &[u8],
        lease: Duration,
        wait: Duration,
    ) -> Result<(Grant, Instant), ClientError> {
        let lease_ms = millis(lease);
        let wait_until = Instant::now() + wait;
        let request_timeout = self.request_timeout;
        let make = || {
            // A retry (say, after a leader change) waits only for what is
            // left of the caller's wait.
            let wait_left = wait_until.saturating_duration_since(Instant::now());
            let request = AcquireRequest {
                key: key.to_vec(),
                lease_ms,
                owner: owner.to_vec(),
                wait_ms: millis(wait_left),
                ..Default::default()
            };
            (Request_oneof_kind::acquire(request), wait_left + request_timeout)
        };
        let (kind, sent) = self.call(make, self.retry_for + wait)?;
        let Response_oneof_kind::acquire(response) = kind else {
            return Err(unexpected("acquire", &kind));
        };
        let holder_token = (response.holder_token != 0).then_some(response.holder_token);
        match response.outcome {
            AcquireOutcome::GRANTED if response.token != 0 => {
                let lease_ms = if response.lease_ms == 0 { lease_ms } else { response.lease_ms };
                let lease = Duration::from_millis(lease_ms);
                Ok((Grant { token: response.token, lease, existing: response.existing }, sent))
            }
            AcquireOutcome::GRANTED => Err(ClientError::Internal("granted without a token".to_owned())),
            AcquireOutcome::HELD => Err(ClientError::Held { holder_token }),
            AcquireOutcome::WAIT_TIMED_OUT => Err(ClientError::WaitTimedOut { holder_token }),
            AcquireOutcome::ACQUIRE_OUTCOME_UNSPECIFIED => {
                Err(ClientError::Internal("acquire answered without an outcome".to_owned()))
            }
        }
    }

    pub(crate) fn release(
        &self,
        key: &[u8],
        token: u64,
        force: bool,
        budget: Duration,
    ) -> Result<Released, ClientError> {
        let request = ReleaseRequest { key: key.to_vec(), token, force, ..Default::default() };
        let timeout = self.request_timeout;
        match self.call(|| (Request_oneof_kind::release(request.clone()), timeout), budget)?.0 {
            Response_oneof_kind::release(response) => Ok(Released {
                released: response.released,
                holder_token: Some(response.holder_token).filter(|holder| *holder != 0 && !response.released),
            }),
            other => Err(unexpected("release", &other)),
        }
    }

    /// One renew request, retried within `budget`.
    pub(crate) fn renew(
        &self,
        locks: &[(Vec<u8>, u64)],
        lease: Duration,
        budget: Duration,
    ) -> Result<Renewal, ClientError> {
        let request = RenewRequest {
            locks: locks
                .iter()
                .map(|(key, token)| LockRef { key: key.clone(), token: *token, ..Default::default() })
                .collect::<Vec<_>>()
                .into(),
            lease_ms: millis(lease),
            ..Default::default()
        };
        let timeout = self.request_timeout;
        let (kind, sent) = self.call(|| (Request_oneof_kind::renew(request.clone()), timeout), budget)?;
        let Response_oneof_kind::renew(response) = kind else {
            return Err(unexpected("renew", &kind));
        };
        let granted = if response.lease_ms == 0 { lease } else { Duration::from_millis(response.lease_ms) };
        let holders = response.results.iter().map(|result| result.holder_token).collect();
        let results =
            response.results.into_iter().map(|result| (result.key, result.token, result.renewed)).collect();
        Ok(Renewal { results, holders, sent, lease: granted })
    }

    pub(crate) fn call_simple(&self, kind: Request_oneof_kind) -> Result<Response_oneof_kind, ClientError> {
        let timeout = self.request_timeout;
        self.call(|| (kind.clone(), timeout), self.retry_for).map(|(kind, _)| kind)
    }

    /// The retry loop. `make` builds each attempt's request and its timeout;
    /// `budget` bounds the whole call. Returns the answer and when the
    /// attempt that got it was sent.
    fn call(
        &self,
        make: impl FnMut() -> (Request_oneof_kind, Duration),
        budget: Duration,
    ) -> Result<(Response_oneof_kind, Instant), ClientError> {
        self.call_to(make, budget).map(|(kind, sent, _)| (kind, sent))
    }

    /// [`Inner::call`], also returning the endpoint that answered.
    pub(crate) fn call_to(
        &self,
        mut make: impl FnMut() -> (Request_oneof_kind, Duration),
        budget: Duration,
    ) -> Result<(Response_oneof_kind, Instant, String), ClientError> {
        let started = Instant::now();
        let deadline = started + budget;
        let mut next_notice = started + RETRY_NOTICE_AFTER;
        let mut target = self.start_endpoint();
        // Where "the next endpoint" continues from; a leader address outside
        // the list continues from the top.
        let mut index = self.endpoints.iter().position(|e| *e == target).unwrap_or(self.endpoints.len() - 1);
        let mut backoff = BACKOFF_MIN;
        let mut redirected = false;
        let mut last_reason = "no node answered in time".to_owned();
        let mut attempted = false;
        // Endpoints that refused this client's TLS connection (or its lack
        // of one) in this call: when all have, waiting will not help.
        let mut refused: Vec<String> = Vec::new();
        loop {
            let sent = Instant::now();
            let left = deadline.saturating_duration_since(sent);
            // Every call makes at least one attempt, even when a busy machine
            // ate its budget before it started.
            if left.is_zero() && attempted {
                return Err(ClientError::Unavailable(last_reason));
            }
            attempted = true;
            let (kind, attempt_timeout) = make();
            let pause = match self.attempt(&target, kind, attempt_timeout.min(left.max(ATTEMPT_MIN))) {
                Attempt::Done(kind) => {
                    *lock(&self.preferred) = Some(target.clone());
                    return Ok((kind, sent, target));
                }
                Attempt::Fail(error) => return Err(error),
                Attempt::Redirect { leader, reason } if leader != target => {
                    last_reason = reason;
                    target = leader;
                    // The first redirect is followed at once; a chain of them
                    // (stale views during an election) backs off.
                    let pause = redirected;
                    redirected = true;
                    pause
                }
                Attempt::Redirect { reason, .. } | Attempt::Retry(reason) => {
                    if refuses_this_client(&reason) {
                        if !refused.contains(&target) {
                            refused.push(target.clone());
                        }
                        if self.endpoints.iter().all(|endpoint| refused.contains(endpoint)) {
                            return Err(ClientError::InvalidArgument(format!(
                                "every endpoint refused this client's connection; last: {reason}"
                            )));
                        }
                    }
                    last_reason = reason;
                    index = (index + 1) % self.endpoints.len();
                    target = self.endpoints[index].clone();
                    true
                }
            };
            if pause {
                std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            let now = Instant::now();
            if now >= next_notice && now < deadline {
                next_notice = now + RETRY_NOTICE_EVERY;
                let observer = lock(&self.retrying).clone();
                if let Some(observer) = observer {
                    (observer.0)(&Retrying {
                        elapsed: now - started,
                        left: deadline - now,
                        last_error: last_reason.clone(),
                    });
                }
            }
        }
    }

    fn start_endpoint(&self) -> String {
        lock(&self.preferred).clone().unwrap_or_else(|| self.endpoints[0].clone())
    }

    /// One request to one node, connecting first if needed, all within
    /// `timeout`.
    pub(crate) fn attempt(&self, addr: &str, kind: Request_oneof_kind, timeout: Duration) -> Attempt {
        let started = Instant::now();
        let connection = match self.connection(addr, timeout) {
            Ok(connection) => connection,
            Err(reason) => return Attempt::Retry(format!("{addr}: {reason}")),
        };
        let request = Request { kind: Some(kind), ..Default::default() };
        let left = timeout.saturating_sub(started.elapsed());
        match connection.call(request, left) {
            Ok(response) => classify(addr, response),
            Err(CallError::TimedOut) => Attempt::Retry(format!("{addr}: no answer within {timeout:?}")),
            Err(CallError::Closed(reason)) => {
                self.forget(addr, &connection);
                Attempt::Retry(format!("{addr}: {reason}"))
            }
        }
    }

    /// The open connection to `addr`, or a new one.
    fn connection(&self, addr: &str, timeout: Duration) -> Result<Arc<Connection>, String> {
        if let Some(connection) = lock(&self.connections).get(addr).filter(|c| !c.is_closed()) {
            return Ok(Arc::clone(connection));
        }
        // Connecting happens outside the pool's lock, so that one slow node
        // does not hold up calls to the others.
        let fresh = Connection::open(addr, timeout, self.request_timeout, self.tls.as_ref())?;
        let mut connections = lock(&self.connections);
        match connections.get(addr) {
            // Another caller connected meanwhile: share theirs.
            Some(existing) if !existing.is_closed() => Ok(Arc::clone(existing)),
            _ => {
                connections.insert(addr.to_owned(), Arc::clone(&fresh));
                Ok(fresh)
            }
        }
    }

    fn forget(&self, addr: &str, connection: &Arc<Connection>) {
        let mut connections = lock(&self.connections);
        if connections.get(addr).is_some_and(|current| Arc::ptr_eq(current, connection)) {
            connections.remove(addr);
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.renewer.stop();
    }
}

/// Whether a failed attempt means that the node will not talk to this
/// client as it is configured (a certificate either side refuses, plain TCP
/// against TLS or the other way round), rather than that it is down or
/// busy. Worded by `connection.rs` and rustls.
fn refuses_this_client(reason: &str) -> bool {
    ["TLS handshake failed", "the server speaks TLS", "received fatal alert", "invalid peer certificate"]
        .iter()
        .any(|sign| reason.contains(sign))
}

#[cfg(test)]
#[test]
fn a_call_that_keeps_retrying_is_reported_with_its_last_error() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port());
    let endpoint = format!("127.0.0.1:{}", port.unwrap_or(9));
    let mut config = ClientConfig::new([endpoint.clone()]);
    config.retry_for = Duration::from_millis(2_500);
    let Ok(client) = Client::connect(config) else { panic!("a client") };
    let seen: Arc<Mutex<Vec<Retrying>>> = Arc::default();
    let sink = Arc::clone(&seen);
    client.on_retrying(move |retrying| lock(&sink).push(retrying.clone()));
    assert!(matches!(client.get(b"k", true), Err(ClientError::Unavailable(_))));
    let seen = lock(&seen).clone();
    // Once, after a second (the next would come 5 s later, past the budget).
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].elapsed >= RETRY_NOTICE_AFTER && seen[0].left <= Duration::from_millis(1_500),
        "{seen:?}"
    );
    assert!(seen[0].last_error.starts_with(&format!("{endpoint}: cannot connect")), "{seen:?}");
}

#[cfg(test)]
#[test]
fn refusals_of_this_client_are_told_from_a_node_that_is_down_or_busy() {
    for refusal in [
        "127.0.0.1:7101: TLS handshake failed: invalid peer certificate: UnknownIssuer",
        "127.0.0.1:7101: read failed: received fatal alert: UnknownCA",
        "127.0.0.1:7101: the server speaks TLS: connect with certificates",
    ] {
        assert!(refuses_this_client(refusal), "{refusal}");
    }
    for transient in [
        "127.0.0.1:7101: cannot connect: Connection refused (os error 111)",
        "127.0.0.1:7101: no answer within 5s",
        "127.0.0.1:7101: not the leader",
    ] {
        assert!(!refuses_this_client(transient), "{transient}");
    }
}

fn classify(addr: &str, response: Response) -> Attempt {
    if let Some(error) = response.error.into_option() {
        let reason = format!("{addr}: {}", error.message);
        match error.code {
            ErrorCode::OK => {}
            ErrorCode::NOT_LEADER if !error.leader_addr.is_empty() => {
                return Attempt::Redirect { leader: error.leader_addr, reason };
            }
            ErrorCode::NOT_LEADER | ErrorCode::TIMEOUT | ErrorCode::UNAVAILABLE => {
                return Attempt::Retry(reason)
            }
            ErrorCode::INVALID_ARGUMENT => return Attempt::Fail(ClientError::InvalidArgument(error.message)),
            ErrorCode::INTERNAL => return Attempt::Fail(ClientError::Internal(error.message)),
            ErrorCode::PERMISSION_DENIED => {
                return Attempt::Fail(ClientError::PermissionDenied(error.message))
            }
            ErrorCode::RESOURCE_EXHAUSTED => {
                return Attempt::Fail(ClientError::ResourceExhausted(error.message))
            }
        }
    }
    match response.kind {
        Some(kind) => Attempt::Done(kind),
        None => Attempt::Fail(ClientError::Internal(format!("{addr}: answered without a result"))),
    }
}

pub(crate) fn unexpected(call: &str, kind: &Response_oneof_kind) -> ClientError {
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
    };
    ClientError::Internal(format!("a {call} request was answered with a {got} response"))
}

/// Milliseconds, saturating: a lease too long for the wire is refused by the
/// server's bounds rather than wrapped.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Locks a mutex whose data stays consistent across a panic (each update is a
/// single assignment or map operation).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
