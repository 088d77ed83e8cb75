//! The background renewer: one thread per [`Client`](crate::Client), started
//! with the first acquire, keeping every lock held through that client alive.
//!
//! Each round (about a third of the shortest lease held, and at once when a
//! new lock arrives) sends one `RenewRequest` per distinct lease with every
//! lock of that lease. A lock is lost when a renewal answers that its token
//! no longer holds the key, or when a whole lease passed since the last
//! successful grant or renewal was *sent* (`docs/leases.md`: the server keeps
//! the lock at least that long, no longer promised). Lost locks are not
//! renewed again. The thread holds the client only weakly, so it ends once
//! the client and every guard are gone.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use crate::client::{lock, Inner};
use crate::ClientError;

/// The shortest round, so that a tiny lease cannot turn the renewer into a
/// busy loop.
const ROUND_MIN: Duration = Duration::from_millis(10);

/// The time between renewals of a lock with `lease`.
fn round_for(lease: Duration) -> Duration {
    (lease / 3).max(ROUND_MIN)
}

/// One lock held through a guard, shared by the guard and the renewer.
#[derive(Debug)]
pub(crate) struct HeldLock {
    pub(crate) key: Vec<u8>,
    pub(crate) token: u64,
    pub(crate) lease: Duration,
    /// Set once lost; read without the mutex so that guards see loss cheaply.
    lost: AtomicBool,
    state: Mutex<HeldState>,
}

#[derive(Debug)]
struct HeldState {
    /// When the lease runs out unless renewed: the last successful request's
    /// send time plus its lease.
    valid_until: Instant,
    /// When the renewer should next renew it.
    renew_at: Instant,
    lost_reason: Option<String>,
}

impl HeldLock {
    /// A lock granted for `lease` by a request sent at `sent`.
    pub(crate) fn new(key: Vec<u8>, token: u64, lease: Duration, sent: Instant) -> HeldLock {
        HeldLock {
            key,
            token,
            lease,
            lost: AtomicBool::new(false),
            state: Mutex::new(HeldState {
                valid_until: sent + lease,
                renew_at: sent + round_for(lease),
                lost_reason: None,
            }),
        }
    }

    /// True once lost: refused by a renewal, or its lease ran out unrenewed.
    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.load(Ordering::SeqCst) {
            return true;
        }
        let mut state = lock(&self.state);
        if Instant::now() >= state.valid_until {
            self.lose(&mut state, "the lease ran out before a renewal succeeded".to_owned());
            return true;
        }
        false
    }

    pub(crate) fn lost_reason(&self) -> Option<String> {
        if !self.is_lost() {
            return None;
        }
        lock(&self.state).lost_reason.clone()
    }

    pub(crate) fn mark_lost(&self, reason: String) {
        let mut state = lock(&self.state);
        self.lose(&mut state, reason);
    }

    fn lose(&self, state: &mut HeldState, reason: String) {
        // The first reason is the true one; later ones follow from it.
        if state.lost_reason.is_none() {
            state.lost_reason = Some(reason);
        }
        self.lost.store(true, Ordering::SeqCst);
    }

    fn valid_until(&self) -> Instant {
        lock(&self.state).valid_until
    }

    fn renew_at(&self) -> Instant {
        lock(&self.state).renew_at
    }

    /// A renewal sent at `sent` succeeded with `lease`.
    fn renewed(&self, sent: Instant, lease: Duration) {
        let mut state = lock(&self.state);
        // A lock already seen lost stays lost: its holder may have acted on it.
        if state.lost_reason.is_none() {
            state.valid_until = state.valid_until.max(sent + lease);
            state.renew_at = sent + round_for(lease);
        }
    }

    fn retry_at(&self, at: Instant) {
        lock(&self.state).renew_at = at;
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
    pub(crate) fn start(&self, inner: &Arc<Inner>) -> Result<(), String> {
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

fn run(client: &Weak<Inner>, registry: &Registry, wake: &Receiver<()>) {
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
        renew_round(&inner, registry);
    }
}

/// Renews every active lock: one request per distinct lease.
fn renew_round(inner: &Inner, registry: &Registry) {
    let mut by_lease: BTreeMap<Duration, Vec<Arc<HeldLock>>> = BTreeMap::new();
    for held in registry.active() {
        by_lease.entry(held.lease).or_default().push(held);
    }
    for (lease, group) in by_lease {
        let now = Instant::now();
        // Past the first expiry nothing is left to save in time for it, and
        // the others get their own rounds soon after.
        let Some(first_expiry) = group.iter().map(|held| held.valid_until()).min() else {
            continue;
        };
        let budget = first_expiry.saturating_duration_since(now).min(inner.retry_for);
        if budget.is_zero() {
            continue;
        }
        // Unless a lock is renewed below, try it again a little later rather
        // than at once, so that a failing cluster is not hammered.
        let retry = now + (lease / 10).max(ROUND_MIN);
        for held in &group {
            held.retry_at(retry);
        }
        let refs: Vec<(Vec<u8>, u64)> = group.iter().map(|held| (held.key.clone(), held.token)).collect();
        match inner.renew(&refs, lease, budget) {
            Ok(renewal) => {
                let by_ref: HashMap<(&[u8], u64), &Arc<HeldLock>> =
                    group.iter().map(|held| ((held.key.as_slice(), held.token), held)).collect();
                for (key, token, renewed) in renewal.results {
                    let Some(held) = by_ref.get(&(key.as_slice(), token)) else {
                        continue;
                    };
                    if renewed {
                        held.renewed(renewal.sent, renewal.lease);
                    } else {
                        held.mark_lost(format!("renewal refused: token {token} no longer holds the lock"));
                    }
                }
            }
            // Permission denied: the user lost its `lock` right on a key (the
            // rules changed), or the renewal named another user's lock; either
            // way, retrying will not help.
            Err(ClientError::InvalidArgument(message) | ClientError::PermissionDenied(message)) => {
                for held in &group {
                    held.mark_lost(format!("renewal refused: {message}"));
                }
            }
            // Unavailable or internal: the locks stay held until their
            // leases run out, and are tried again at `retry`.
            Err(_) => {}
        }
    }
}
