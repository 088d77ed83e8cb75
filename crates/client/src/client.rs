//! [`Client`]: the connection pool, the retry loop and the calls.
//!
//! Every call goes through one retry loop. It starts at the node that last
//! answered, follows `NOT_LEADER` to the leader's address, moves on to the
//! next endpoint (with backoff) when a node is unavailable, times out or
//! cannot be reached, and gives up with [`ClientError::Unavailable`] once the
//! call's budget is spent. Retrying is safe: an acquire carries the owner, and
//! a retried acquire by the same owner gets the same token, never a second
//! grant.
//!
//! The calls that hand out a guard or a watch are beside what they hand out
//! (`guard.rs`, `session.rs`, `watch.rs`), as `backup.rs` and `members.rs`
//! hold theirs: every one of them uses this module, and it uses none of
//! them.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock_types::client_pb::{Request, Request_oneof_kind, Response_oneof_kind};

use crate::config::ClientConfig;
use crate::connection::{CallError, Connection};
use crate::renewer::{Renew, Renewer};
use crate::sansio::calls::{self, RenewAnswer, SessionAnswer};
use crate::sansio::pool::Pool;
use crate::sansio::retry::check_node;
use crate::sansio::{Drift, Outcome, RetryLoop, Retrying, Verdict};
use crate::sync::lock;
use crate::types::{Grant, LockInfo, NodeStatus, Released, Renewed, Session};
use crate::ClientError;
use fencelock_types::Share;

pub(crate) use crate::sansio::calls::unexpected;
use crate::sansio::calls::Acquiring;

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
    pub(crate) owner: Vec<u8>,
    connections: Pool<Connection>,
    /// The endpoint that last answered successfully: where calls start.
    preferred: Mutex<Option<String>>,
    pub(crate) renewer: Renewer,
    /// Told while a call keeps retrying ([`Client::on_retrying`]).
    retrying: Mutex<Option<RetryObserver>>,
    /// ρ: how much of each lease the client counts on.
    pub(crate) drift: Drift,
    /// Seeds each call's jitter.
    seeds: AtomicU64,
}

#[derive(Clone)]
struct RetryObserver(Arc<dyn Fn(&Retrying) + Send + Sync>);

impl std::fmt::Debug for RetryObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RetryObserver")
    }
}

impl Client {
    /// Builds a client. Connections are opened on first use, so this does
    /// not fail when the cluster is down; it fails only on an empty endpoint
    /// list (or an empty owner) with [`ClientError::InvalidArgument`].
    pub fn connect(config: ClientConfig) -> Result<Client, ClientError> {
        let endpoints = config.checked_endpoints()?;
        let tls = config.rustls()?;
        let owner = config.owner_or_default();
        let inner = Inner {
            endpoints,
            tls,
            request_timeout: config.request_timeout,
            retry_for: config.retry_for,
            // Over TLS an owner is bound to the user: `user/suffix`.
            owner,
            connections: Pool::default(),
            preferred: Mutex::new(None),
            renewer: Renewer::default(),
            retrying: Mutex::new(None),
            drift: config.drift,
            seeds: AtomicU64::new(crate::config::jitter_seed()),
        };
        Ok(Client { inner: Arc::new(inner) })
    }

    /// The owner identity this client's acquires carry.
    pub fn owner(&self) -> &[u8] {
        &self.inner.owner
    }

    /// Calls `observer` when a call has kept retrying (no node answered,
    /// no leader) for [`RETRY_NOTICE_AFTER`](crate::RETRY_NOTICE_AFTER), and every 5 s after, with the
    /// last error: a command-line tool says so instead of waiting
    /// silently. Every call of this client is reported, the background
    /// renewer's included.
    pub fn on_retrying(&self, observer: impl Fn(&Retrying) + Send + Sync + 'static) {
        *lock(&self.inner.retrying) = Some(RetryObserver(Arc::new(observer)));
    }

    /// [`Client::acquire_raw`] in a shared mode: no guard, nothing renews
    /// or releases it (for tools that exit while holding it).
    pub fn acquire_shared_raw(
        &self,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        share: Share,
        lease: Duration,
        wait: Duration,
    ) -> Result<Grant, ClientError> {
        let acquiring = Acquiring::Shared(share);
        self.inner.acquire(None, owner, key.as_ref(), &acquiring, lease, wait).map(|(grant, _)| grant)
    }

    /// Every holder of `key`: a read-write lock's readers or writer, a
    /// semaphore's permits, or a plain lock's holder (empty: free).
    pub fn holders(&self, key: impl AsRef<[u8]>, linearizable: bool) -> Result<Vec<LockInfo>, ClientError> {
        calls::holders_answer(self.inner.call_simple(calls::get(key.as_ref(), linearizable))?)
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
        self.inner
            .acquire(None, owner, key.as_ref(), &Acquiring::Exclusive(b""), lease, wait)
            .map(|(grant, _)| grant)
    }

    /// [`Client::acquire_raw`] with the lock's `value` (shown by `get`,
    /// `list` and watches).
    pub fn acquire_raw_with_value(
        &self,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        lease: Duration,
        wait: Duration,
    ) -> Result<Grant, ClientError> {
        let acquiring = Acquiring::Exclusive(value.as_ref());
        self.inner.acquire(None, owner, key.as_ref(), &acquiring, lease, wait).map(|(grant, _)| grant)
    }

    /// Opens a session for this client's owner with a time to live of
    /// `ttl` (within the cluster's lease bounds). Nothing keeps it alive:
    /// call [`Client::keep_alive`] within every TTL, or use
    /// [`Client::session`], whose guard does. A session counts as one lock
    /// in its owner's quota. Not idempotent: a retry after a lost answer
    /// may open a second session (the first lapses unused).
    pub fn open_session(&self, ttl: Duration) -> Result<Session, ClientError> {
        let owner = self.inner.owner.clone();
        self.open_session_as(&owner, ttl)
    }

    /// [`Client::open_session`] under an explicit owner identity: acquires
    /// under the session must carry the same owner.
    pub fn open_session_as(&self, owner: &[u8], ttl: Duration) -> Result<Session, ClientError> {
        self.inner.open_session(owner, ttl).map(|(session, _)| session)
    }

    /// Renews `session` (its id) for another TTL, from now, and with it
    /// everything held under it. False: it is not open any more (closed,
    /// or it lapsed and everything it held is free); nothing was done.
    pub fn keep_alive(&self, session: u64) -> Result<bool, ClientError> {
        self.inner.keep_alive(session, self.inner.retry_for).map(|(answer, _)| answer.found)
    }

    /// As [`Client::keep_alive`], saying the session's TTL when it was kept
    /// alive (`None`: it is not open any more).
    pub fn keep_alive_outcome(&self, session: u64) -> Result<Option<Duration>, ClientError> {
        let (answer, _) = self.inner.keep_alive(session, self.inner.retry_for)?;
        Ok(answer.found.then_some(answer.ttl))
    }

    /// Closes `session`: everything held under it is released at once (no
    /// lock-delay). False: it was not open (any more).
    pub fn close_session(&self, session: u64) -> Result<bool, ClientError> {
        self.inner.close_session(session, self.inner.retry_for).map(|answer| answer.found)
    }

    /// [`Client::acquire_raw`] under `session` (its id): no guard, and no
    /// lease of its own; it lives until the session ends or someone
    /// releases it by token. `owner` must be the session's.
    pub fn acquire_raw_in(
        &self,
        session: u64,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        wait: Duration,
    ) -> Result<Grant, ClientError> {
        self.acquire_raw_with_value_in(session, owner, key, b"", wait)
    }

    /// [`Client::acquire_raw_with_value`] under `session` (its id).
    pub fn acquire_raw_with_value_in(
        &self,
        session: u64,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        wait: Duration,
    ) -> Result<Grant, ClientError> {
        let acquiring = Acquiring::Exclusive(value.as_ref());
        let inner = &self.inner;
        inner
            .acquire(Some(session), owner, key.as_ref(), &acquiring, Duration::ZERO, wait)
            .map(|(grant, _)| grant)
    }

    /// [`Client::acquire_shared_raw`] under `session` (its id).
    pub fn acquire_shared_raw_in(
        &self,
        session: u64,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        share: Share,
        wait: Duration,
    ) -> Result<Grant, ClientError> {
        let acquiring = Acquiring::Shared(share);
        let inner = &self.inner;
        inner
            .acquire(Some(session), owner, key.as_ref(), &acquiring, Duration::ZERO, wait)
            .map(|(grant, _)| grant)
    }

    /// The holder of `key` under `token` replaces its lock's value (an
    /// election leader proclaims). False: that token does not hold the key
    /// (any more); `holder_token` then says which does.
    pub fn proclaim(
        &self,
        key: impl AsRef<[u8]>,
        token: u64,
        value: impl AsRef<[u8]>,
    ) -> Result<Released, ClientError> {
        let request = calls::proclaim(key.as_ref(), token, value.as_ref());
        let timeout = self.inner.request_timeout;
        calls::proclaim_answer(self.inner.call(|| (request.clone(), timeout), self.inner.retry_for)?.0)
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
        self.inner.renew(locks, lease, self.inner.retry_for).map(|(answer, _)| answer.results)
    }

    /// Renews `key` held under `token` to `lease`, saying, when it was not
    /// renewed, which token holds the key (if any).
    pub fn renew_outcome(
        &self,
        key: impl AsRef<[u8]>,
        token: u64,
        lease: Duration,
    ) -> Result<Renewed, ClientError> {
        let (answer, _) = self.inner.renew(&[(key.as_ref().to_vec(), token)], lease, self.inner.retry_for)?;
        Ok(calls::renewed_one(&answer))
    }

    /// Who holds `key`, or `None` when it is free. Linearizable reads ask the
    /// leader; others take the answering node's (maybe stale) table.
    pub fn get(&self, key: impl AsRef<[u8]>, linearizable: bool) -> Result<Option<LockInfo>, ClientError> {
        calls::get_answer(self.inner.call_simple(calls::get(key.as_ref(), linearizable))?)
    }

    /// Whether `token` holds `key` now (linearizable).
    pub fn check(&self, key: impl AsRef<[u8]>, token: u64) -> Result<bool, ClientError> {
        calls::check_answer(self.inner.call_simple(calls::check(key.as_ref(), token))?)
    }

    /// Up to `limit` locks whose keys start with `prefix`, in key order
    /// (linearizable). A `limit` of 0 means the server's maximum.
    pub fn list(&self, prefix: impl AsRef<[u8]>, limit: u32) -> Result<Vec<LockInfo>, ClientError> {
        calls::list_answer(self.inner.call_simple(calls::list(prefix.as_ref(), limit))?)
    }

    /// Asks the node at `endpoint` (which need not be in the configured
    /// endpoints) for its status. One attempt, no retries elsewhere.
    pub fn status(&self, endpoint: &str) -> Result<NodeStatus, ClientError> {
        match self.inner.attempt(endpoint, calls::status(), self.inner.request_timeout) {
            Outcome::Done(kind) => calls::status_answer(kind),
            Outcome::Redirect { reason, .. } | Outcome::Retry(reason) => {
                Err(ClientError::Unavailable(reason))
            }
            Outcome::Fail(error) => Err(error),
        }
    }
}

impl Inner {
    /// One acquire, retried as needed; also returns when the successful
    /// attempt was sent, which is when the lease starts on the client's side.
    /// Under `session` (`Some`), the lease is the session's: `lease` is not
    /// sent, and only stands for the answer's lease if it says none.
    pub(crate) fn acquire(
        &self,
        session: Option<u64>,
        owner: &[u8],
        key: &[u8],
        acquiring: &Acquiring<'_>,
        lease: Duration,
        wait: Duration,
    ) -> Result<(Grant, Instant), ClientError> {
        let wait_until = Instant::now() + wait;
        let request_timeout = self.request_timeout;
        let make = || {
            // A retry (say, after a leader change) waits only for what is
            // left of the caller's wait.
            let wait_left = wait_until.saturating_duration_since(Instant::now());
            (acquiring.request_in(session, owner, key, lease, wait_left), wait_left + request_timeout)
        };
        let (kind, sent) = self.call(make, self.retry_for + wait)?;
        calls::acquire_answer(kind, lease).map(|grant| (grant, sent))
    }

    pub(crate) fn release(
        &self,
        key: &[u8],
        token: u64,
        force: bool,
        budget: Duration,
    ) -> Result<Released, ClientError> {
        let request = calls::release(key, token, force);
        let timeout = self.request_timeout;
        calls::release_answer(self.call(|| (request.clone(), timeout), budget)?.0)
    }

    /// One renew request, retried within `budget`; also returns when the
    /// attempt that got the answer was sent: the renewed leases count from
    /// then.
    pub(crate) fn renew(
        &self,
        locks: &[(Vec<u8>, u64)],
        lease: Duration,
        budget: Duration,
    ) -> Result<(RenewAnswer, Instant), ClientError> {
        let request = calls::renew(locks, lease);
        let timeout = self.request_timeout;
        let (kind, sent) = self.call(|| (request.clone(), timeout), budget)?;
        Ok((calls::renew_answer(kind, lease)?, sent))
    }

    /// A session open, retried within the client's budget; also returns
    /// when the attempt that got the answer was sent (the TTL counts from
    /// then).
    pub(crate) fn open_session(
        &self,
        owner: &[u8],
        ttl: Duration,
    ) -> Result<(Session, Instant), ClientError> {
        let request = calls::session_open(owner, ttl);
        let timeout = self.request_timeout;
        let (kind, sent) = self.call(|| (request.clone(), timeout), self.retry_for)?;
        Ok((calls::session_opened(kind, ttl)?, sent))
    }

    /// One keep-alive of `session`, retried within `budget`; also returns
    /// when the attempt that got the answer was sent.
    pub(crate) fn keep_alive(
        &self,
        session: u64,
        budget: Duration,
    ) -> Result<(SessionAnswer, Instant), ClientError> {
        let request = calls::session_keep_alive(session);
        let timeout = self.request_timeout;
        let (kind, sent) = self.call(|| (request.clone(), timeout), budget)?;
        Ok((calls::session_answer(kind, session)?, sent))
    }

    pub(crate) fn close_session(&self, session: u64, budget: Duration) -> Result<SessionAnswer, ClientError> {
        let request = calls::session_close(session);
        let timeout = self.request_timeout;
        calls::session_answer(self.call(|| (request.clone(), timeout), budget)?.0, session)
    }

    pub(crate) fn call_simple(&self, kind: Request_oneof_kind) -> Result<Response_oneof_kind, ClientError> {
        let timeout = self.request_timeout;
        self.call(|| (kind.clone(), timeout), self.retry_for).map(|(kind, _)| kind)
    }

    /// The retry loop. `make` builds each attempt's request and its timeout;
    /// `budget` bounds the whole call. Returns the answer and when the
    /// attempt that got it was sent.
    pub(crate) fn call(
        &self,
        make: impl FnMut() -> (Request_oneof_kind, Duration),
        budget: Duration,
    ) -> Result<(Response_oneof_kind, Instant), ClientError> {
        self.call_to(make, budget).map(|(kind, sent, _)| (kind, sent))
    }

    /// [`Inner::call`], also returning the endpoint that answered. The
    /// decisions are the sans-IO [`RetryLoop`]'s; this sends and sleeps.
    pub(crate) fn call_to(
        &self,
        mut make: impl FnMut() -> (Request_oneof_kind, Duration),
        budget: Duration,
    ) -> Result<(Response_oneof_kind, Instant, String), ClientError> {
        let preferred = lock(&self.preferred).clone();
        let seed = self.seeds.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        let mut retry = RetryLoop::new(&self.endpoints, preferred.as_deref(), Instant::now(), budget, seed);
        loop {
            let sent = Instant::now();
            let attempt = retry.next_try(sent)?;
            let (kind, request_timeout) = make();
            let outcome =
                self.attempt_at(&attempt.endpoint, attempt.node, kind, request_timeout.min(attempt.timeout));
            match retry.finish(Instant::now(), outcome) {
                Verdict::Done { kind, endpoint } => {
                    *lock(&self.preferred) = Some(endpoint.clone());
                    return Ok((*kind, sent, endpoint));
                }
                Verdict::Fail(error) => return Err(error),
                Verdict::Pause(pause) => std::thread::sleep(pause),
            }
            if let Some(notice) = retry.notice(Instant::now()) {
                let observer = lock(&self.retrying).clone();
                if let Some(observer) = observer {
                    (observer.0)(&notice);
                }
            }
        }
    }

    /// One request to one node, connecting first if needed, all within
    /// `timeout`.
    pub(crate) fn attempt(&self, addr: &str, kind: Request_oneof_kind, timeout: Duration) -> Outcome {
        self.attempt_at(addr, None, kind, timeout)
    }

    /// [`Inner::attempt`], sent only if the node's certificate names node
    /// `node` when given (a redirect named it).
    pub(crate) fn attempt_at(
        &self,
        addr: &str,
        node: Option<u64>,
        kind: Request_oneof_kind,
        timeout: Duration,
    ) -> Outcome {
        let started = Instant::now();
        let connection = match self.connection(addr, timeout) {
            Ok(connection) => connection,
            Err(reason) => return Outcome::Retry(format!("{addr}: {reason}")),
        };
        if let Some(refused) = check_node(addr, node, connection.node(), self.tls.is_some()) {
            return refused;
        }
        let request = Request { kind: Some(kind), ..Default::default() };
        let left = timeout.saturating_sub(started.elapsed());
        match connection.call(request, left) {
            Ok(response) => Outcome::of_response(addr, response),
            Err(CallError::TimedOut) => Outcome::Retry(format!("{addr}: no answer within {timeout:?}")),
            Err(CallError::Closed(reason)) => {
                self.connections.forget(addr, &connection);
                Outcome::Retry(format!("{addr}: {reason}"))
            }
        }
    }

    /// The open connection to `addr`, or a new one. Connecting happens
    /// outside the pool's lock, so that one slow node does not hold up
    /// calls to the others.
    fn connection(&self, addr: &str, timeout: Duration) -> Result<Arc<Connection>, String> {
        if let Some(connection) = self.connections.get(addr) {
            return Ok(connection);
        }
        let fresh = Connection::open(addr, timeout, self.request_timeout, self.tls.as_ref())?;
        Ok(self.connections.share(addr, fresh))
    }
}

/// The renewer's thread renews through the client's retry loop.
impl Renew for Inner {
    fn retry_for(&self) -> Duration {
        self.retry_for
    }

    fn renew(
        &self,
        locks: &[(Vec<u8>, u64)],
        lease: Duration,
        budget: Duration,
    ) -> Result<(RenewAnswer, Instant), ClientError> {
        Inner::renew(self, locks, lease, budget)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.renewer.stop();
    }
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
        seen[0].elapsed >= crate::RETRY_NOTICE_AFTER && seen[0].left <= Duration::from_millis(1_500),
        "{seen:?}"
    );
    assert!(seen[0].last_error.starts_with(&format!("{endpoint}: cannot connect")), "{seen:?}");
}
