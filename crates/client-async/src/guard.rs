//! [`AsyncLockGuard`]: a held lock, renewed by a task of its own, with a
//! lost-lock signal and the time left.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use fencelock_client::sansio::{calls, Lease};
use fencelock_client::{ClientError, Grant, LocalHold};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::{AsyncClient, Inner};

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

/// What the guard and its renewal task share; for a session, what its
/// guard, its keep-alive task and the guards of its locks share.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<Lease>,
    /// `Some(reason)` once the lock is lost.
    lost: watch::Sender<Option<String>>,
    /// For a session: why it is lost when its TTL passes unrenewed.
    expired_reason: Option<&'static str>,
}

impl Shared {
    pub(crate) fn new(state: Lease, expired_reason: Option<&'static str>) -> Shared {
        let (lost, _) = watch::channel(None);
        Shared { state: Mutex::new(state), lost, expired_reason }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, Lease> {
        // Each update of the lease is complete under the lock.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Checks the lease at `now`; once lost, tells the watchers and returns
    /// why.
    pub(crate) fn check(&self, now: Instant) -> Option<String> {
        let reason = {
            let mut state = self.state();
            if let Some(reason) = self.expired_reason {
                if state.lost_reason().is_none() && now >= state.valid_until() {
                    state.lose(reason.to_owned());
                }
            }
            state.check(now);
            state.lost_reason().map(str::to_owned)
        }?;
        self.lost.send_if_modified(|lost| {
            let first = lost.is_none();
            if first {
                *lost = Some(reason.clone());
            }
            first
        });
        Some(reason)
    }

    pub(crate) fn lose(&self, reason: String) {
        self.state().lose(reason);
        self.check(Instant::now());
    }

    /// The time left at now: zero once lost.
    pub(crate) fn time_left(&self) -> Duration {
        let now = Instant::now();
        self.check(now);
        self.state().time_left(now)
    }

    /// Resolves with the reason once lost.
    pub(crate) async fn lost(&self) -> String {
        let mut changes = self.lost.subscribe();
        loop {
            if let Some(reason) = self.check(Instant::now()) {
                return reason;
            }
            let until = self.state().valid_until();
            tokio::select! {
                _ = changes.changed() => {}
                () = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }

    pub(crate) fn lost_signal(&self) -> watch::Receiver<Option<String>> {
        self.lost.subscribe()
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
