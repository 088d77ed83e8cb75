//! [`AsyncSessionGuard`]: a session kept alive by a task of its own, and
//! closed when the guard is closed or dropped ([`AsyncClient::session`]
//! opens one).
//!
//! The async face of `fencelock_client::SessionGuard`: a keep-alive every
//! third of the TTL (the sans-IO [`Lease`] with the drift margin ρ), the
//! session lost once a keep-alive answers that it is not open any more or
//! the usable TTL passed without a successful one, and every guard of a
//! lock acquired under it ([`AsyncClient::acquire_in`] and the other
//! `*_in` methods) lost with it: they share its state.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock_client::sansio::{calls, Lease};
use fencelock_client::{ClientError, Session};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::{AsyncClient, Inner};
use crate::shared::Shared;

/// Why a session is lost when its TTL passes without a keep-alive.
const EXPIRED: &str = "the session's TTL passed without a successful keep-alive";

/// A session opened by [`AsyncClient::session`] and kept alive by a
/// background task (etcd's `concurrency.Session` is the model). Acquire
/// under it with [`AsyncClient::acquire_in`], [`AsyncClient::campaign_in`]
/// or [`AsyncClient::acquire_shared_in`]: their guards hold no lease of
/// their own, and [`AsyncLockGuard::lost`](crate::AsyncLockGuard::lost)
/// resolves when the session is lost.
///
/// Dropping it stops the keep-alives and closes the session in a task
/// (best effort, one request timeout; an unclosed session lapses after its
/// TTL), which releases everything held under it;
/// [`AsyncSessionGuard::close`] closes and says how it went.
#[derive(Debug)]
pub struct AsyncSessionGuard {
    client: AsyncClient,
    session: Session,
    pub(crate) shared: Arc<Shared>,
    keeper: JoinHandle<()>,
    closed: bool,
}

impl AsyncClient {
    /// Opens a session for this client's owner with `ttl` and keeps it
    /// alive from a task, every third of the TTL, until the guard is closed
    /// or dropped (which closes the session).
    pub async fn session(&self, ttl: Duration) -> Result<AsyncSessionGuard, ClientError> {
        let (session, sent) = self.inner.open_session(&self.inner.owner, ttl).await?;
        Ok(AsyncSessionGuard::start(self.clone(), session, sent))
    }
}

impl AsyncSessionGuard {
    /// Starts keeping `session`, opened by a request sent at `sent`, alive.
    pub(crate) fn start(client: AsyncClient, session: Session, sent: Instant) -> AsyncSessionGuard {
        let state = Lease::granted(sent, session.ttl, client.inner.drift);
        let shared = Arc::new(Shared::new(state, Some(EXPIRED)));
        let keeper =
            tokio::spawn(keep_alive_loop(Arc::clone(&client.inner), session.id, Arc::clone(&shared)));
        AsyncSessionGuard { client, session, shared, keeper, closed: false }
    }

    /// The session's id.
    pub fn id(&self) -> u64 {
        self.session.id
    }

    /// The session's TTL: each keep-alive renews it for this long.
    pub fn ttl(&self) -> Duration {
        self.session.ttl
    }

    /// The session as a plain value, for the calls that take its id.
    pub fn session(&self) -> Session {
        self.session
    }

    /// True once lost: a keep-alive answered that the session is not open
    /// any more, or the usable part of its TTL passed without a successful
    /// keep-alive, or it was closed.
    pub fn is_lost(&self) -> bool {
        self.shared.check(Instant::now()).is_some()
    }

    /// Why the session was lost, once it is.
    pub fn lost_reason(&self) -> Option<String> {
        self.shared.check(Instant::now())
    }

    /// The time the holder may still count on the session (and everything
    /// held under it). Zero once lost.
    pub fn time_left(&self) -> Duration {
        self.shared.time_left()
    }

    /// Resolves with the reason once the session is lost.
    pub async fn lost(&self) -> String {
        self.shared.lost().await
    }

    /// A receiver that changes to `Some(reason)` when the session is lost.
    pub fn lost_signal(&self) -> watch::Receiver<Option<String>> {
        self.shared.lost_signal()
    }

    /// Stops the keep-alives and closes the session: everything held under
    /// it is released at once. False: it was not open any more. The guards
    /// of its locks are lost from now on.
    pub async fn close(mut self) -> Result<bool, ClientError> {
        self.closed = true;
        self.keeper.abort();
        // Lost first: its locks' guards stop counting on them before they
        // are released.
        self.shared.lose(calls::session_closed_reason(self.session.id));
        self.client.close_session(self.session.id).await
    }
}

impl Drop for AsyncSessionGuard {
    fn drop(&mut self) {
        self.keeper.abort();
        if self.closed {
            return;
        }
        let lost = self.is_lost();
        self.shared.lose(calls::session_closed_reason(self.session.id));
        if lost {
            return;
        }
        // Best effort within one request timeout, in a task: a drop cannot
        // wait. Without a runtime the session simply lapses.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = Arc::clone(&self.client.inner);
        let session = self.session.id;
        runtime.spawn(async move {
            let _ = inner.close_session(session, inner.request_timeout).await;
        });
    }
}

/// Keeps the session alive until it is lost or the guard goes (which
/// aborts this).
async fn keep_alive_loop(inner: Arc<Inner>, session: u64, shared: Arc<Shared>) {
    loop {
        let (renew_at, until, ttl) = {
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
        let answer = tokio::select! {
            answer = inner.keep_alive(session, budget) => answer,
            // The TTL ran out while the keep-alive was still trying.
            () = tokio::time::sleep_until(until.into()) => continue,
        };
        match answer {
            Ok((answer, sent)) if answer.found => {
                let ttl = if answer.ttl.is_zero() { ttl } else { answer.ttl };
                shared.state().renewed(sent, ttl, inner.drift);
            }
            Ok(_) => return shared.lose(calls::session_gone_reason(session)),
            Err(error) => {
                if let Some(reason) = calls::renew_error_loses(&error) {
                    return shared.lose(reason);
                }
            }
        }
    }
}
