//! [`AsyncLockGuard`]: a held lock, renewed by a task of its own, with a
//! lost-lock signal and the time left; and the acquires that make one
//! ([`AsyncClient::acquire`], [`AsyncClient::campaign`],
//! [`AsyncClient::acquire_shared`], their `_as` forms, and their `_in`
//! forms under a session).

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock_client::sansio::calls::{self, Acquiring};
use fencelock_client::sansio::lease::needs_fresh_start;
use fencelock_client::sansio::Lease;
use fencelock_client::{ClientError, Grant, LocalHold, Share};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::{AsyncClient, Inner};
use crate::session::AsyncSessionGuard;
use crate::shared::Shared;

/// A lock held through an [`AsyncClient`]. While it lives, a background
/// task renews the lease every third of it; [`AsyncLockGuard::lost`]
/// resolves (and [`AsyncLockGuard::lost_signal`]'s receivers change) when a
/// renewal is refused or the usable lease runs out unrenewed. Dropping it
/// stops the renewals and releases the lock in a task (best effort, one
/// request timeout); [`AsyncLockGuard::release`] releases and says how it
/// went.
///
/// Pass [`AsyncLockGuard::token`] with every write to the protected
/// resource: a lease can always run out during a pause the client does not
/// see.
#[derive(Debug)]
pub struct AsyncLockGuard {
    client: AsyncClient,
    key: Vec<u8>,
    grant: Grant,
    shared: Arc<Shared>,
    /// `None` under a session: the session's task keeps it alive.
    renewal: Option<JoinHandle<()>>,
    /// The key held in this process; moved into the release on drop, so
    /// that another guard of the same owner waits until the release is done.
    local: Option<LocalHold>,
    released: bool,
}

/// How often an acquire waiting for a guard of this process (same owner,
/// same key) looks again. Such waits are rare: two tasks of one process
/// contending for one key.
const LOCAL_POLL: Duration = Duration::from_millis(10);

impl AsyncClient {
    /// Acquires `key` for `lease`, waiting up to `wait` if another owner
    /// holds it (`Duration::ZERO` answers at once). The guard's lock is
    /// renewed by a background task; [`AsyncLockGuard::lost`] resolves when
    /// it is lost. Within this process, a key that a guard of the same owner
    /// holds (from this client or a blocking one) is waited for first, up
    /// to `wait`; it is never shared. A lock granted after a wait in the
    /// queue longer than half its usable lease is renewed once before it is
    /// handed over, since its lease counts from the request's send time.
    pub async fn acquire(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        let owner = self.inner.owner.clone();
        self.acquire_as(&owner, key, lease, wait).await
    }

    /// [`AsyncClient::acquire`] under an explicit owner identity.
    pub async fn acquire_as(
        &self,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        self.acquire_guarded(owner, key.as_ref(), Acquiring::Exclusive(b""), lease, wait).await
    }

    /// Campaigns in `election` with `value` (what this candidate says of
    /// itself: its address, say): waits up to `wait` in the leader's FIFO
    /// queue of candidates, and leads once granted, with a fencing token,
    /// for as long as the guard is renewed. [`AsyncLockGuard::proclaim`]
    /// changes the value; releasing or dropping the guard resigns, and
    /// [`AsyncLockGuard::lost`] resolves when the lead is lost. Observers
    /// ([`AsyncClient::observe`]) see each leader and value.
    pub async fn campaign(
        &self,
        election: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        lease: Duration,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        let owner = self.inner.owner.clone();
        let acquiring = Acquiring::Exclusive(value.as_ref());
        self.acquire_guarded(&owner, election.as_ref(), acquiring, lease, wait).await
    }

    /// Acquires `key` shared: as a reader ([`Share::Read`]) or the writer
    /// ([`Share::Write`]) of a read-write lock, or as one permit of a
    /// semaphore of N ([`Share::Permit`]`(N)`, N fixed by the key's first
    /// acquire; another N, or another kind, is
    /// [`ClientError::InvalidArgument`]). Waits up to `wait`, FIFO (a
    /// reader does not pass a waiting writer). Each holder has a token of
    /// its own; the guard is renewed, released and lost like a plain
    /// lock's, and a grant answered after a long wait is renewed before it
    /// is handed over, as [`AsyncClient::acquire`]'s. One guard per key and
    /// owner in a process: for two permits, use two owners
    /// ([`AsyncClient::acquire_shared_as`]).
    pub async fn acquire_shared(
        &self,
        key: impl AsRef<[u8]>,
        share: Share,
        lease: Duration,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        let owner = self.inner.owner.clone();
        self.acquire_shared_as(&owner, key, share, lease, wait).await
    }

    /// [`AsyncClient::acquire_shared`] under an explicit owner identity.
    pub async fn acquire_shared_as(
        &self,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        share: Share,
        lease: Duration,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        self.acquire_guarded(owner, key.as_ref(), Acquiring::Shared(share), lease, wait).await
    }

    async fn acquire_guarded(
        &self,
        owner: &[u8],
        key: &[u8],
        acquiring: Acquiring<'_>,
        lease: Duration,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        let started = Instant::now();
        let local = take_local(owner, key, started + wait, wait.is_zero()).await?;
        let (grant, mut sent) = self
            .inner
            .acquire(None, owner, key, acquiring, lease, wait.saturating_sub(started.elapsed()))
            .await?;
        // Granted after a wait in the queue: the lease the client can prove
        // starts at the send time, long ago. A renewal now starts one it
        // can count on (or finds the lock already gone).
        if needs_fresh_start(sent, grant.lease, self.inner.drift, Instant::now()) {
            let locks = [(key.to_vec(), grant.token)];
            let (answer, renewed_at) = self.inner.renew(&locks, grant.lease, self.inner.retry_for).await?;
            if !calls::renewed_one(&answer).renewed {
                return Err(ClientError::Unavailable(format!(
                    "{} was granted under token {} after a wait, but its lease ran out before it could be \
                     renewed",
                    String::from_utf8_lossy(key),
                    grant.token
                )));
            }
            sent = renewed_at;
        }
        local.granted(grant.token);
        let state = Lease::granted(sent, grant.lease, self.inner.drift);
        Ok(AsyncLockGuard::start(self.clone(), key.to_vec(), grant, state, local))
    }

    /// Acquires under `session`: no lease of its own, nothing renews it,
    /// and its guard shares the session's state (lost with it).
    async fn acquire_guarded_in(
        &self,
        session: &AsyncSessionGuard,
        key: &[u8],
        acquiring: Acquiring<'_>,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        let owner = self.inner.owner.clone();
        let started = Instant::now();
        let local = take_local(&owner, key, started + wait, wait.is_zero()).await?;
        let wait_left = wait.saturating_sub(started.elapsed());
        let (grant, _) =
            self.inner.acquire(Some(session.id()), &owner, key, acquiring, session.ttl(), wait_left).await?;
        local.granted(grant.token);
        let shared = Arc::clone(&session.shared);
        Ok(AsyncLockGuard::start_in(self.clone(), key.to_vec(), grant, shared, local))
    }

    /// [`AsyncClient::acquire`] under `session`: no lease of its own, not
    /// renewed by itself; it lives as long as the session, and its guard
    /// is lost when the session is. Releasing or dropping the guard
    /// releases the lock alone. The session must be this client's owner's
    /// ([`ClientError::PermissionDenied`]) and open
    /// ([`ClientError::NoSession`]).
    pub async fn acquire_in(
        &self,
        session: &AsyncSessionGuard,
        key: impl AsRef<[u8]>,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        self.acquire_guarded_in(session, key.as_ref(), Acquiring::Exclusive(b""), wait).await
    }

    /// [`AsyncClient::campaign`] under `session`.
    pub async fn campaign_in(
        &self,
        session: &AsyncSessionGuard,
        election: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        let acquiring = Acquiring::Exclusive(value.as_ref());
        self.acquire_guarded_in(session, election.as_ref(), acquiring, wait).await
    }

    /// [`AsyncClient::acquire_shared`] under `session`.
    pub async fn acquire_shared_in(
        &self,
        session: &AsyncSessionGuard,
        key: impl AsRef<[u8]>,
        share: Share,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        self.acquire_guarded_in(session, key.as_ref(), Acquiring::Shared(share), wait).await
    }
}

/// Takes `key` for `owner` in this process, polling until `deadline`.
async fn take_local(
    owner: &[u8],
    key: &[u8],
    deadline: Instant,
    no_wait: bool,
) -> Result<LocalHold, ClientError> {
    loop {
        match LocalHold::try_take(owner, key) {
            Ok(hold) => return Ok(hold),
            Err(holder_token) if Instant::now() >= deadline => {
                return Err(if no_wait {
                    ClientError::Held { holder_token }
                } else {
                    ClientError::WaitTimedOut { holder_token }
                });
            }
            Err(_) => tokio::time::sleep(LOCAL_POLL.min(deadline - Instant::now())).await,
        }
    }
}

impl AsyncLockGuard {
    pub(crate) fn start(
        client: AsyncClient,
        key: Vec<u8>,
        grant: Grant,
        state: Lease,
        local: LocalHold,
    ) -> Self {
        let shared = Arc::new(Shared::new(state, None));
        let renewal = tokio::spawn(renew_loop(
            Arc::clone(&client.inner),
            key.clone(),
            grant.token,
            Arc::clone(&shared),
        ));
        AsyncLockGuard {
            client,
            key,
            grant,
            shared,
            renewal: Some(renewal),
            local: Some(local),
            released: false,
        }
    }

    /// A guard of a lock held under a session, whose `session` state it
    /// shares: nothing renews it but the session's keep-alives, and it is
    /// lost when the session is.
    pub(crate) fn start_in(
        client: AsyncClient,
        key: Vec<u8>,
        grant: Grant,
        session: Arc<Shared>,
        local: LocalHold,
    ) -> Self {
        AsyncLockGuard {
            client,
            key,
            grant,
            shared: session,
            renewal: None,
            local: Some(local),
            released: false,
        }
    }

    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The fencing token.
    pub fn token(&self) -> u64 {
        self.grant.token
    }

    /// The lease granted; each renewal extends it by this much.
    pub fn lease(&self) -> Duration {
        self.grant.lease
    }

    /// The time the holder may still count on the lock: what is left of the
    /// usable part (less the drift margin) of the last lease granted or
    /// renewed, from that request's send time. Zero once lost.
    pub fn time_left(&self) -> Duration {
        self.shared.time_left()
    }

    /// True once lost: a renewal was refused, or the usable lease ran out
    /// before a renewal succeeded.
    pub fn is_lost(&self) -> bool {
        self.shared.check(Instant::now()).is_some()
    }

    /// Why the lock was lost, once it is.
    pub fn lost_reason(&self) -> Option<String> {
        self.shared.check(Instant::now())
    }

    /// Resolves with the reason once the lock is lost. Use it beside the
    /// work the lock protects (`tokio::select!`), and stop that work when
    /// it resolves.
    pub async fn lost(&self) -> String {
        self.shared.lost().await
    }

    /// A receiver that changes to `Some(reason)` when the lock is lost, for
    /// a task that does not own the guard.
    pub fn lost_signal(&self) -> watch::Receiver<Option<String>> {
        self.shared.lost_signal()
    }

    /// Replaces the lock's value (an election leader proclaims a new one).
    /// False: the token no longer holds the key.
    pub async fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<bool, ClientError> {
        self.client.proclaim(&self.key, self.grant.token, value).await.map(|outcome| outcome.released)
    }

    /// Stops renewing and releases the lock. False: the token no longer
    /// held the key.
    pub async fn release(mut self) -> Result<bool, ClientError> {
        self.released = true;
        if let Some(renewal) = &self.renewal {
            renewal.abort();
        }
        let released = self.client.release(&self.key, self.grant.token).await;
        self.local.take();
        released
    }
}

impl Drop for AsyncLockGuard {
    fn drop(&mut self) {
        if let Some(renewal) = &self.renewal {
            renewal.abort();
        }
        if self.released || self.is_lost() {
            return;
        }
        // Best effort within one request timeout, in a task: a drop cannot
        // wait. Without a runtime the lock simply expires.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = Arc::clone(&self.client.inner);
        let key = std::mem::take(&mut self.key);
        let token = self.grant.token;
        let local = self.local.take();
        runtime.spawn(async move {
            let _ = inner.release(&key, token, false, inner.request_timeout).await;
            drop(local);
        });
    }
}

/// Renews one lock until it is lost or the guard goes (which aborts this).
async fn renew_loop(inner: Arc<Inner>, key: Vec<u8>, token: u64, shared: Arc<Shared>) {
    let locks = [(key, token)];
    loop {
        let (renew_at, until, lease) = {
            let state = shared.state();
            (state.renew_at(), state.valid_until(), state.lease())
        };
        tokio::time::sleep_until(renew_at.min(until).into()).await;
        let now = Instant::now();
        if shared.check(now).is_some() {
            return;
        }
        let budget = {
            let mut state = shared.state();
            if now < state.renew_at() {
                continue;
            }
            state.renewing(now);
            state.renew_budget(now, inner.retry_for)
        };
        let renewed = tokio::select! {
            renewed = inner.renew(&locks, lease, budget) => renewed,
            // The lease ran out while the renewal was still trying.
            () = tokio::time::sleep_until(until.into()) => continue,
        };
        match renewed {
            Ok((answer, sent)) => match answer.results.first() {
                Some((_, _, true)) => shared.state().renewed(sent, answer.lease, inner.drift),
                Some((_, _, false)) => {
                    let holder = answer.holders.first().copied().unwrap_or(0);
                    return shared.lose(calls::refused_reason(token, holder));
                }
                // Nothing said about the lock: try again at the next round.
                None => {}
            },
            Err(error) => {
                if let Some(reason) = calls::renew_error_loses(&error) {
                    return shared.lose(reason);
                }
            }
        }
    }
}
