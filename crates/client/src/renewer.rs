//! The background renewer: one thread per [`Client`](crate::Client), started
//! with the first acquire, keeping every lock held through that client alive.
//!
//! Each round (about a third of the shortest lease held, and at once when a
//! new lock arrives) sends one `RenewRequest` per distinct lease with every
//! lock of that lease. A lock is lost when a renewal answers that its token
//! no longer holds the key, or when the usable part of a lease (less the
//! drift margin ρ) passed since the last successful grant or renewal was
//! *sent* (`docs/leases.md`). Each lock's lease is the sans-IO core's
//! [`Lease`]; this module is its thread. Lost locks are not renewed again. The thread holds the client only weakly, so it ends once
//! the client and every guard are gone, and knows it only as [`Renew`] (one
//! renew call): the client owns the renewer, so the renewer's code does not
//! name the client's.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use crate::sansio::calls::{self, RenewAnswer};
use crate::sansio::{Drift, Lease};
use crate::sync::lock;
use crate::ClientError;

/// What the renewer's thread asks of its client: one renew request,
/// retried within a budget. The client's shared state (`client::Inner`)
/// answers it through its retry loop; the renewer, which that state owns,
/// knows it by this alone.
pub(crate) trait Renew: Send + Sync + 'static {
    /// How long one call may keep retrying: the most a round may take.
    fn retry_for(&self) -> Duration;

    /// Renews every `(key, token)` to `lease` in one request, retried
    /// within `budget`; also says when the attempt that got the answer was
    /// sent (the renewed leases count from then).
    fn renew(
        &self,
        locks: &[(Vec<u8>, u64)],
        lease: Duration,
        budget: Duration,
    ) -> Result<(RenewAnswer, Instant), ClientError>;
}

/// One lock held through a guard, shared by the guard and the renewer: its
/// name and token, and its [`Lease`] (the sans-IO core's) behind a mutex.
#[derive(Debug)]
pub(crate) struct HeldLock {
    pub(crate) key: Vec<u8>,
    pub(crate) token: u64,
    pub(crate) lease: Duration,
    drift: Drift,
    /// Set once lost; read without the mutex so that guards see loss cheaply.
    lost: AtomicBool,
    state: Mutex<Lease>,
    /// For a lock held under a session: the session's own `HeldLock` (the
    /// [`SessionGuard`](crate::SessionGuard)'s), whose keep-alives are the
    /// lock's. Such a lock is not renewed by itself, and is lost when the
    /// session is.
    under: Option<Arc<HeldLock>>,
    /// For a session: why it is lost when its TTL passes unrenewed.
    expired_reason: Option<&'static str>,
}

impl HeldLock {
    /// A lock granted for `lease` by a request sent at `sent`.
    pub(crate) fn new(key: Vec<u8>, token: u64, lease: Duration, sent: Instant, drift: Drift) -> HeldLock {
        HeldLock {
            key,
            token,
            lease,
            drift,
            lost: AtomicBool::new(false),
            state: Mutex::new(Lease::granted(sent, lease, drift)),
            under: None,
            expired_reason: None,
        }
    }

    /// A session opened for `ttl` by a request sent at `sent`: kept alive
    /// like a lock's lease, with `session` as its token.
    pub(crate) fn session(session: u64, ttl: Duration, sent: Instant, drift: Drift) -> HeldLock {
        HeldLock {
            expired_reason: Some("the session's TTL passed without a successful keep-alive"),
            ..HeldLock::new(Vec::new(), session, ttl, sent, drift)
        }
    }

    /// A lock granted under `session` (a session's `HeldLock`): it lives as
    /// long as the session does.
    pub(crate) fn under(key: Vec<u8>, token: u64, session: Arc<HeldLock>) -> HeldLock {
        let (lease, drift) = (session.lease, session.drift);
        HeldLock { under: Some(session), ..HeldLock::new(key, token, lease, Instant::now(), drift) }
    }

    /// True once lost: refused by a renewal, or its usable lease ran out
    /// unrenewed; under a session, once the session is lost.
    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.load(Ordering::SeqCst) {
            return true;
        }
        if let Some(session) = &self.under {
            return session.is_lost();
        }
        let now = Instant::now();
        let lost = {
            let mut state = lock(&self.state);
            if let Some(reason) = self.expired_reason {
                if state.lost_reason().is_none() && now >= state.valid_until() {
                    state.lose(reason.to_owned());
                }
            }
            state.check(now)
        };
        if lost {
            self.lost.store(true, Ordering::SeqCst);
        }
        lost
    }

    pub(crate) fn lost_reason(&self) -> Option<String> {
        if !self.is_lost() {
            return None;
        }
        match &self.under {
            Some(session) if !self.lost.load(Ordering::SeqCst) => session.lost_reason(),
            _ => lock(&self.state).lost_reason().map(str::to_owned),
        }
    }

    /// The time the holder may still count on the lock: zero once lost.
    pub(crate) fn time_left(&self) -> Duration {
        if let Some(session) = &self.under {
            return if self.lost.load(Ordering::SeqCst) { Duration::ZERO } else { session.time_left() };
        }
        if self.is_lost() {
            return Duration::ZERO;
        }
        let mut state = lock(&self.state);
        state.check(Instant::now());
        state.time_left(Instant::now())
    }

    pub(crate) fn mark_lost(&self, reason: String) {
        lock(&self.state).lose(reason);
        self.lost.store(true, Ordering::SeqCst);
    }

    pub(crate) fn renew_at(&self) -> Instant {
        lock(&self.state).renew_at()
    }

    /// How long a renewal starting now may retry; also puts the next try a
    /// little later unless this one succeeds.
    pub(crate) fn start_renewal(&self, now: Instant, retry_for: Duration) -> Duration {
        let mut state = lock(&self.state);
        state.renewing(now);
        state.renew_budget(now, retry_for)
    }

    /// A renewal sent at `sent` succeeded with `lease`.
    pub(crate) fn renewed(&self, sent: Instant, lease: Duration) {
        lock(&self.state).renewed(sent, lease, self.drift);
    }
}

/// The renewer's side of a client: the locks to renew and the thread's
/// wake-up line.
#[derive(Debug, Default)]
pub(crate) struct Renewer {
    pub(crate) registry: Arc<Registry>,
    /// `Some` once the thread runs. Dropping it ends the thread.
    wake: Mutex<Option<Sender<()>>>,
}

/// The locks held through one client.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    locks: Mutex<Vec<Arc<HeldLock>>>,
}

impl Registry {
    /// Forgets lost locks and says when the next round is due (`None`: no
    /// lock to renew).
    fn next_round(&self) -> Option<Instant> {
        let mut locks = lock(&self.locks);
        locks.retain(|held| !held.is_lost());
        locks.iter().map(|held| held.renew_at()).min()
    }

    fn active(&self) -> Vec<Arc<HeldLock>> {
        lock(&self.locks).iter().filter(|held| !held.is_lost()).cloned().collect()
    }
}

impl Renewer {
    /// Starts the renewer thread unless it runs already.
    pub(crate) fn start(&self, inner: &Arc<impl Renew>) -> Result<(), String> {
        let mut wake = lock(&self.wake);
        if wake.is_some() {
            return Ok(());
        }
        let (sender, receiver) = bounded(1);
        let client = Arc::downgrade(inner);
        let registry = Arc::clone(&self.registry);
        std::thread::Builder::new()
            .name("fencelock-renewer".into())
            .spawn(move || run(&client, &registry, &receiver))
            .map_err(|err| format!("cannot start the renewer thread: {err}"))?;
        *wake = Some(sender);
        Ok(())
    }

    /// Renews `held` from now on, and has the thread look at it at once.
    pub(crate) fn add(&self, held: Arc<HeldLock>) {
        lock(&self.registry.locks).push(held);
        if let Some(wake) = lock(&self.wake).as_ref() {
            // A full line already holds a wake-up, which is all it takes.
            let _ = wake.try_send(());
        }
    }

    /// Stops renewing `held` (released or dropped).
    pub(crate) fn remove(&self, held: &Arc<HeldLock>) {
        lock(&self.registry.locks).retain(|other| !Arc::ptr_eq(other, held));
    }

    /// Ends the thread (the client is gone).
    pub(crate) fn stop(&self) {
        lock(&self.wake).take();
    }
}

fn run(client: &Weak<impl Renew>, registry: &Registry, wake: &Receiver<()>) {
    loop {
        let woke = match registry.next_round() {
            Some(at) => wake.recv_deadline(at),
            None => wake.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match woke {
            // New lock: its round may come sooner than the one waited for.
            Ok(()) => continue,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let Some(inner) = client.upgrade() else {
            return;
        };
        renew_round(&*inner, registry);
    }
}

/// Renews every active lock: one request per distinct lease.
fn renew_round(inner: &impl Renew, registry: &Registry) {
    let mut by_lease: BTreeMap<Duration, Vec<Arc<HeldLock>>> = BTreeMap::new();
    for held in registry.active() {
        by_lease.entry(held.lease).or_default().push(held);
    }
    for (lease, group) in by_lease {
        let now = Instant::now();
        // Past the first expiry nothing is left to save in time for it, and
        // the others get their own rounds soon after.
        let Some(budget) = group.iter().map(|held| held.start_renewal(now, inner.retry_for())).min() else {
            continue;
        };
        if budget.is_zero() {
            continue;
        }
        let refs: Vec<(Vec<u8>, u64)> = group.iter().map(|held| (held.key.clone(), held.token)).collect();
        match inner.renew(&refs, lease, budget) {
            Ok((renewal, sent)) => {
                let by_ref: HashMap<(&[u8], u64), &Arc<HeldLock>> =
                    group.iter().map(|held| ((held.key.as_slice(), held.token), held)).collect();
                for ((key, token, renewed), holder) in renewal.results.into_iter().zip(renewal.holders) {
                    let Some(held) = by_ref.get(&(key.as_slice(), token)) else {
                        continue;
                    };
                    if renewed {
                        held.renewed(sent, renewal.lease);
                    } else {
                        held.mark_lost(calls::refused_reason(token, holder));
                    }
                }
            }
            Err(error) => {
                // Lost for good when retrying cannot help; otherwise the
                // locks stay held until their leases run out, and are tried
                // again a little later.
                if let Some(reason) = calls::renew_error_loses(&error) {
                    for held in &group {
                        held.mark_lost(reason.clone());
                    }
                }
            }
        }
    }
}
