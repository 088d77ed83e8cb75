//! [`AsyncClient`]: connections, the retry loop's shell, and the calls.
//!
//! Every decision is the sans-IO core's ([`fencelock_client::sansio`]):
//! which node to try, how long to pause, when to give up, what a request
//! holds and what its answer means. This module sends, awaits and sleeps.
//!
//! The calls that hand out a guard or a watch are beside what they hand out
//! (`guard.rs`, `session.rs`, `watch.rs`): each of them uses this module,
//! and it uses none of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use fencelock_client::sansio::calls::{self, Acquiring, RenewAnswer, SessionAnswer};
use fencelock_client::sansio::pool::Pool;
use fencelock_client::sansio::{Drift, Outcome, RetryLoop, Retrying, Verdict};
use fencelock_client::{
    ClientConfig, ClientError, Grant, LockInfo, NodeStatus, Released, Renewed, Session, Share, WatchBatch,
};
use fencelock_types::client_pb::{Request, Request_oneof_kind, Response_oneof_kind};

use crate::connection::{CallError, Connection};

/// An async fencelock client. Clones share connections and the owner.
/// Every guard renews its lock in a task of its own, on the runtime the
/// acquire ran on.
#[derive(Clone)]
pub struct AsyncClient {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for AsyncClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncClient")
            .field("endpoints", &self.inner.endpoints)
            .field("owner", &String::from_utf8_lossy(&self.inner.owner))
            .finish_non_exhaustive()
    }
}

type Observer = Arc<dyn Fn(&Retrying) + Send + Sync>;

pub(crate) struct Inner {
    endpoints: Vec<String>,
    tls: Option<Arc<rustls::ClientConfig>>,
    pub(crate) request_timeout: Duration,
    pub(crate) retry_for: Duration,
    pub(crate) owner: Vec<u8>,
    pub(crate) drift: Drift,
    connections: Pool<Connection>,
    preferred: Mutex<Option<String>>,
    retrying: Mutex<Option<Observer>>,
    seeds: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each update is a single assignment or map operation.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl AsyncClient {
    /// Builds a client. Nothing is connected until the first call, so this
    /// does not fail when the cluster is down; it fails only on a
    /// configuration that can never work (no endpoints, an empty owner,
    /// unreadable certificates).
    pub fn connect(config: ClientConfig) -> Result<AsyncClient, ClientError> {
        let endpoints = config.checked_endpoints()?;
        let tls = config.rustls()?;
        let inner = Inner {
            endpoints,
            tls,
            request_timeout: config.request_timeout,
            retry_for: config.retry_for,
            owner: config.owner_or_default(),
            drift: config.drift,
            connections: Pool::default(),
            preferred: Mutex::new(None),
            retrying: Mutex::new(None),
            seeds: AtomicU64::new(fencelock_client::jitter_seed()),
        };
        Ok(AsyncClient { inner: Arc::new(inner) })
    }

    /// The owner identity this client's acquires carry.
    pub fn owner(&self) -> &[u8] {
        &self.inner.owner
    }

    /// Calls `observer` when a call has kept retrying for
    /// [`RETRY_NOTICE_AFTER`](fencelock_client::RETRY_NOTICE_AFTER), and
    /// every 5 s after, with the last error.
    pub fn on_retrying(&self, observer: impl Fn(&Retrying) + Send + Sync + 'static) {
        *lock(&self.inner.retrying) = Some(Arc::new(observer));
    }

    /// [`AsyncClient::acquire_raw`] in a shared mode: no guard, nothing
    /// renews or releases it.
    pub async fn acquire_shared_raw(
        &self,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        share: Share,
        lease: Duration,
        wait: Duration,
    ) -> Result<Grant, ClientError> {
        let acquiring = Acquiring::Shared(share);
        self.inner.acquire(None, owner, key.as_ref(), acquiring, lease, wait).await.map(|(grant, _)| grant)
    }

    /// Every holder of `key`: a read-write lock's readers or writer, a
    /// semaphore's permits, or a plain lock's holder (empty: free).
    /// Linearizable reads ask the leader; others take the answering node's
    /// (maybe stale) table.
    pub async fn holders(
        &self,
        key: impl AsRef<[u8]>,
        linearizable: bool,
    ) -> Result<Vec<LockInfo>, ClientError> {
        calls::holders_answer(self.inner.call_simple(calls::get(key.as_ref(), linearizable)).await?)
    }

    /// Opens a session for this client's owner with a time to live of
    /// `ttl` (within the cluster's lease bounds). Nothing keeps it alive:
    /// call [`AsyncClient::keep_alive`] within every TTL, or use
    /// [`AsyncClient::session`], whose guard does. Not idempotent: a retry
    /// after a lost answer may open a second session (the first lapses).
    pub async fn open_session(&self, ttl: Duration) -> Result<Session, ClientError> {
        let owner = self.inner.owner.clone();
        self.open_session_as(&owner, ttl).await
    }

    /// [`AsyncClient::open_session`] under an explicit owner identity.
    pub async fn open_session_as(&self, owner: &[u8], ttl: Duration) -> Result<Session, ClientError> {
        self.inner.open_session(owner, ttl).await.map(|(session, _)| session)
    }

    /// Renews `session` (its id) for another TTL, from now. False: it is
    /// not open any more (closed, or it lapsed and everything it held is
    /// free); nothing was done.
    pub async fn keep_alive(&self, session: u64) -> Result<bool, ClientError> {
        self.inner.keep_alive(session, self.inner.retry_for).await.map(|(answer, _)| answer.found)
    }

    /// As [`AsyncClient::keep_alive`], saying the session's TTL when it
    /// was kept alive (`None`: it is not open any more).
    pub async fn keep_alive_outcome(&self, session: u64) -> Result<Option<Duration>, ClientError> {
        let (answer, _) = self.inner.keep_alive(session, self.inner.retry_for).await?;
        Ok(answer.found.then_some(answer.ttl))
    }

    /// Closes `session`: everything held under it is released at once.
    /// False: it was not open (any more).
    pub async fn close_session(&self, session: u64) -> Result<bool, ClientError> {
        self.inner.close_session(session, self.inner.retry_for).await.map(|answer| answer.found)
    }

    /// [`AsyncClient::acquire_raw`] under `session` (its id): no guard, no
    /// lease of its own. `owner` must be the session's.
    pub async fn acquire_raw_in(
        &self,
        session: u64,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        wait: Duration,
    ) -> Result<Grant, ClientError> {
        self.acquire_raw_with_value_in(session, owner, key, b"", wait).await
    }

    /// [`AsyncClient::acquire_raw_with_value`] under `session` (its id).
    pub async fn acquire_raw_with_value_in(
        &self,
        session: u64,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        wait: Duration,
    ) -> Result<Grant, ClientError> {
        let acquiring = Acquiring::Exclusive(value.as_ref());
        let acquired =
            self.inner.acquire(Some(session), owner, key.as_ref(), acquiring, Duration::ZERO, wait);
        acquired.await.map(|(grant, _)| grant)
    }

    /// [`AsyncClient::acquire_shared_raw`] under `session` (its id).
    pub async fn acquire_shared_raw_in(
        &self,
        session: u64,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        share: Share,
        wait: Duration,
    ) -> Result<Grant, ClientError> {
        let acquiring = Acquiring::Shared(share);
        let acquired =
            self.inner.acquire(Some(session), owner, key.as_ref(), acquiring, Duration::ZERO, wait);
        acquired.await.map(|(grant, _)| grant)
    }

    /// Acquires `key` for `owner` without a guard: nothing renews or
    /// releases it.
    pub async fn acquire_raw(
        &self,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Duration,
    ) -> Result<Grant, ClientError> {
        let acquiring = Acquiring::Exclusive(b"");
        self.inner.acquire(None, owner, key.as_ref(), acquiring, lease, wait).await.map(|(grant, _)| grant)
    }

    /// [`AsyncClient::acquire_raw`] with the lock's `value` (shown by
    /// `get`, `list` and watches).
    pub async fn acquire_raw_with_value(
        &self,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        lease: Duration,
        wait: Duration,
    ) -> Result<Grant, ClientError> {
        let acquiring = Acquiring::Exclusive(value.as_ref());
        self.inner.acquire(None, owner, key.as_ref(), acquiring, lease, wait).await.map(|(grant, _)| grant)
    }

    /// The holder of `key` under `token` replaces its lock's value (an
    /// election leader proclaims). False: that token does not hold the key
    /// (any more); `holder_token` then says which does.
    pub async fn proclaim(
        &self,
        key: impl AsRef<[u8]>,
        token: u64,
        value: impl AsRef<[u8]>,
    ) -> Result<Released, ClientError> {
        let request = calls::proclaim(key.as_ref(), token, value.as_ref());
        let timeout = self.inner.request_timeout;
        let (kind, _) = self.inner.call(|| (request.clone(), timeout), self.inner.retry_for).await?;
        calls::proclaim_answer(kind)
    }

    /// Releases `key` if `token` holds it. False: it did not (any more).
    pub async fn release(&self, key: impl AsRef<[u8]>, token: u64) -> Result<bool, ClientError> {
        self.release_outcome(key, token).await.map(|outcome| outcome.released)
    }

    /// As [`AsyncClient::release`], saying also which token holds the key
    /// when it was not released.
    pub async fn release_outcome(&self, key: impl AsRef<[u8]>, token: u64) -> Result<Released, ClientError> {
        self.inner.release(key.as_ref(), token, false, self.inner.retry_for).await
    }

    /// Releases `key` whoever holds it. False: it was free.
    pub async fn force_release(&self, key: impl AsRef<[u8]>) -> Result<bool, ClientError> {
        let budget = self.inner.retry_for;
        self.inner.release(key.as_ref(), 0, true, budget).await.map(|outcome| outcome.released)
    }

    /// Renews `key` held under `token` to `lease`, saying, when it was not
    /// renewed, which token holds the key.
    pub async fn renew_outcome(
        &self,
        key: impl AsRef<[u8]>,
        token: u64,
        lease: Duration,
    ) -> Result<Renewed, ClientError> {
        let locks = [(key.as_ref().to_vec(), token)];
        let (answer, _) = self.inner.renew(&locks, lease, self.inner.retry_for).await?;
        Ok(calls::renewed_one(&answer))
    }

    /// Who holds `key`, or `None` when it is free.
    pub async fn get(
        &self,
        key: impl AsRef<[u8]>,
        linearizable: bool,
    ) -> Result<Option<LockInfo>, ClientError> {
        calls::get_answer(self.inner.call_simple(calls::get(key.as_ref(), linearizable)).await?)
    }

    /// Whether `token` holds `key` now (linearizable).
    pub async fn check(&self, key: impl AsRef<[u8]>, token: u64) -> Result<bool, ClientError> {
        calls::check_answer(self.inner.call_simple(calls::check(key.as_ref(), token)).await?)
    }

    /// Up to `limit` locks whose keys start with `prefix`, in key order.
    pub async fn list(&self, prefix: impl AsRef<[u8]>, limit: u32) -> Result<Vec<LockInfo>, ClientError> {
        calls::list_answer(self.inner.call_simple(calls::list(prefix.as_ref(), limit)).await?)
    }

    /// Asks the node at `endpoint` for its status: one attempt.
    pub async fn status(&self, endpoint: &str) -> Result<NodeStatus, ClientError> {
        match self.inner.attempt(endpoint, calls::status(), self.inner.request_timeout).await {
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
    /// attempt was sent, which is when the lease starts on the client's
    /// side.
    /// Under `session` (`Some`), the lease is the session's: `lease` is not
    /// sent, and only stands for the answer's lease if it says none.
    pub(crate) async fn acquire(
        &self,
        session: Option<u64>,
        owner: &[u8],
        key: &[u8],
        acquiring: Acquiring<'_>,
        lease: Duration,
        wait: Duration,
    ) -> Result<(Grant, Instant), ClientError> {
        let wait_until = Instant::now() + wait;
        let request_timeout = self.request_timeout;
        let make = || {
            // A retry waits only for what is left of the caller's wait.
            let wait_left = wait_until.saturating_duration_since(Instant::now());
            (acquiring.request_in(session, owner, key, lease, wait_left), wait_left + request_timeout)
        };
        let (kind, sent) = self.call(make, self.retry_for + wait).await?;
        calls::acquire_answer(kind, lease).map(|grant| (grant, sent))
    }

    pub(crate) async fn release(
        &self,
        key: &[u8],
        token: u64,
        force: bool,
        budget: Duration,
    ) -> Result<Released, ClientError> {
        let request = calls::release(key, token, force);
        let timeout = self.request_timeout;
        calls::release_answer(self.call(|| (request.clone(), timeout), budget).await?.0)
    }

    /// One renew request, retried within `budget`; also returns when the
    /// attempt that got the answer was sent.
    pub(crate) async fn renew(
        &self,
        locks: &[(Vec<u8>, u64)],
        lease: Duration,
        budget: Duration,
    ) -> Result<(RenewAnswer, Instant), ClientError> {
        let request = calls::renew(locks, lease);
        let timeout = self.request_timeout;
        let (kind, sent) = self.call(|| (request.clone(), timeout), budget).await?;
        Ok((calls::renew_answer(kind, lease)?, sent))
    }

    /// A session open, retried within the client's budget; also returns
    /// when the attempt that got the answer was sent.
    pub(crate) async fn open_session(
        &self,
        owner: &[u8],
        ttl: Duration,
    ) -> Result<(Session, Instant), ClientError> {
        let request = calls::session_open(owner, ttl);
        let timeout = self.request_timeout;
        let (kind, sent) = self.call(|| (request.clone(), timeout), self.retry_for).await?;
        Ok((calls::session_opened(kind, ttl)?, sent))
    }

    /// One keep-alive of `session`, retried within `budget`; also returns
    /// when the attempt that got the answer was sent.
    pub(crate) async fn keep_alive(
        &self,
        session: u64,
        budget: Duration,
    ) -> Result<(SessionAnswer, Instant), ClientError> {
        let request = calls::session_keep_alive(session);
        let timeout = self.request_timeout;
        let (kind, sent) = self.call(|| (request.clone(), timeout), budget).await?;
        Ok((calls::session_answer(kind, session)?, sent))
    }

    pub(crate) async fn close_session(
        &self,
        session: u64,
        budget: Duration,
    ) -> Result<SessionAnswer, ClientError> {
        let request = calls::session_close(session);
        let timeout = self.request_timeout;
        calls::session_answer(self.call(|| (request.clone(), timeout), budget).await?.0, session)
    }

    /// One watch request: the changes under `prefix` after `after`
    /// (`None`: the current holders), waiting up to `wait` for one. An
    /// attempt may take the wait and a request timeout; the call, its
    /// budget and the wait.
    pub(crate) async fn watch(
        &self,
        prefix: &[u8],
        after: Option<u64>,
        wait: Duration,
    ) -> Result<WatchBatch, ClientError> {
        let request = calls::watch(prefix, after, wait, 0);
        let timeout = wait + self.request_timeout;
        let (kind, _) = self.call(|| (request.clone(), timeout), self.retry_for + wait).await?;
        calls::watch_answer(kind, after)
    }

    async fn call_simple(&self, kind: Request_oneof_kind) -> Result<Response_oneof_kind, ClientError> {
        let timeout = self.request_timeout;
        self.call(|| (kind.clone(), timeout), self.retry_for).await.map(|(kind, _)| kind)
    }

    /// The retry loop's shell: the core decides, this sends and sleeps.
    async fn call(
        &self,
        mut make: impl FnMut() -> (Request_oneof_kind, Duration),
        budget: Duration,
    ) -> Result<(Response_oneof_kind, Instant), ClientError> {
        let preferred = lock(&self.preferred).clone();
        let seed = self.seeds.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        let mut retry = RetryLoop::new(&self.endpoints, preferred.as_deref(), Instant::now(), budget, seed);
        loop {
            let sent = Instant::now();
            let attempt = retry.next_try(sent)?;
            let (kind, request_timeout) = make();
            let outcome = self
                .attempt_at(&attempt.endpoint, attempt.node, kind, request_timeout.min(attempt.timeout))
                .await;
            match retry.finish(Instant::now(), outcome) {
                Verdict::Done { kind, endpoint } => {
                    *lock(&self.preferred) = Some(endpoint);
                    return Ok((*kind, sent));
                }
                Verdict::Fail(error) => return Err(error),
                Verdict::Pause(pause) if pause.is_zero() => {}
                Verdict::Pause(pause) => tokio::time::sleep(pause).await,
            }
            if let Some(notice) = retry.notice(Instant::now()) {
                let observer = lock(&self.retrying).clone();
                if let Some(observer) = observer {
                    observer(&notice);
                }
            }
        }
    }

    /// One request to one node, connecting first if needed, within
    /// `timeout` in all.
    async fn attempt(&self, addr: &str, kind: Request_oneof_kind, timeout: Duration) -> Outcome {
        self.attempt_at(addr, None, kind, timeout).await
    }

    /// [`Inner::attempt`], sent only if the node's certificate names node
    /// `node` when given (a redirect named it).
    async fn attempt_at(
        &self,
        addr: &str,
        node: Option<u64>,
        kind: Request_oneof_kind,
        timeout: Duration,
    ) -> Outcome {
        let started = Instant::now();
        let connection = match self.connection(addr, timeout).await {
            Ok(connection) => connection,
            Err(reason) => return Outcome::Retry(format!("{addr}: {reason}")),
        };
        if let Some(refused) =
            fencelock_client::sansio::retry::check_node(addr, node, connection.node(), self.tls.is_some())
        {
            return refused;
        }
        let request = Request { kind: Some(kind), ..Default::default() };
        let left = timeout.saturating_sub(started.elapsed());
        match connection.call(request, left).await {
            Ok(response) => Outcome::of_response(addr, response),
            Err(CallError::TimedOut) => Outcome::Retry(format!("{addr}: no answer within {timeout:?}")),
            Err(CallError::Closed(reason)) => {
                self.connections.forget(addr, &connection);
                Outcome::Retry(format!("{addr}: {reason}"))
            }
        }
    }

    async fn connection(&self, addr: &str, timeout: Duration) -> Result<Arc<Connection>, String> {
        if let Some(connection) = self.connections.get(addr) {
            return Ok(connection);
        }
        let fresh = Connection::open(addr, timeout, self.tls.as_ref()).await?;
        Ok(self.connections.share(addr, fresh))
    }
}
