//! [`Shared`]: a held lock's lease state and its lost-lock signal, shared by
//! its guard and the task that renews it; for a session, by the session's
//! guard, its keep-alive task and the guards of the locks held under it.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use fencelock_client::sansio::Lease;
use tokio::sync::watch;

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
