//! [`SessionGuard`]: a session kept alive by a thread of its own, and
//! closed when the guard is closed or dropped ([`Client::session`] opens
//! one).
//!
//! A session (`docs/recipes.md`, "Sessions") holds any number of locks,
//! shared holds and candidacies: one keep-alive renews them all, and when
//! the session ends, closed or lapsed, everything it held is freed at once.
//! The guard's thread sends a keep-alive every third of the TTL, as the
//! renewer does for a lock's lease (the sans-IO [`Lease`](crate::sansio::Lease),
//! with the same drift margin ρ), and counts the session lost once a
//! keep-alive answers that it is not open any more, or the usable part of
//! the TTL passed without a successful keep-alive. Every guard of a lock
//! acquired under it ([`Client::acquire_in`] and the other `*_in` methods)
//! is lost with it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use crate::client::{Client, Inner};
use crate::renewer::HeldLock;
use crate::sansio::calls;
use crate::types::Session;
use crate::ClientError;

/// A session opened by [`Client::session`] and kept alive in the
/// background (etcd's `concurrency.Session` is the model). Acquire under it
/// with [`Client::acquire_in`], [`Client::campaign_in`] or
/// [`Client::acquire_shared_in`]: their guards hold no lease of their own
/// and are lost when the session is.
///
/// Dropping it stops the keep-alives and closes the session (best effort,
/// within one request timeout; an unclosed session lapses after its TTL),
/// which releases everything held under it; [`SessionGuard::close`] closes
/// and says how it went.
#[derive(Debug)]
pub struct SessionGuard {
    client: Client,
    pub(crate) held: Arc<HeldLock>,
    /// Dropped to end the keep-alive thread.
    stop: Option<Sender<()>>,
    closed: bool,
}

impl Client {
    /// Opens a session for this client's owner with `ttl` and keeps it
    /// alive from a thread of its own, every third of the TTL, until the
    /// guard is closed or dropped (which closes the session). Acquire under
    /// it with [`Client::acquire_in`], [`Client::campaign_in`] and
    /// [`Client::acquire_shared_in`].
    pub fn session(&self, ttl: Duration) -> Result<SessionGuard, ClientError> {
        let (session, sent) = self.inner.open_session(&self.inner.owner, ttl)?;
        SessionGuard::start(self.clone(), session, sent)
    }
}

impl SessionGuard {
    /// Starts keeping `session`, opened by a request sent at `sent`, alive.
    pub(crate) fn start(
        client: Client,
        session: Session,
        sent: Instant,
    ) -> Result<SessionGuard, ClientError> {
        let held = Arc::new(HeldLock::session(session.id, session.ttl, sent, client.inner.drift));
        let (stop, stopped) = bounded(1);
        let inner = Arc::clone(&client.inner);
        let kept = Arc::clone(&held);
        std::thread::Builder::new()
            .name(format!("fencelock-session-{}", session.id))
            .spawn(move || keep_alive_loop(&inner, &kept, &stopped))
            .map_err(|err| ClientError::Internal(format!("cannot start the keep-alive thread: {err}")))?;
        Ok(SessionGuard { client, held, stop: Some(stop), closed: false })
    }

    /// The session's id.
    pub fn id(&self) -> u64 {
        self.held.token
    }

    /// The session's TTL: each keep-alive renews it for this long.
    pub fn ttl(&self) -> Duration {
        self.held.lease
    }

    /// The session as a plain value, for the calls that take its id.
    pub fn session(&self) -> Session {
        Session { id: self.id(), ttl: self.ttl() }
    }

    /// True once lost: a keep-alive answered that the session is not open
    /// any more, or the usable part of its TTL (less the drift margin)
    /// passed without a successful keep-alive, or it was closed. Whatever
    /// was held under it can no longer be counted on.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Why the session was lost, once it is.
    pub fn lost_reason(&self) -> Option<String> {
        self.held.lost_reason()
    }

    /// The time the holder may still count on the session (and everything
    /// held under it): what is left of the usable part of the TTL, from
    /// the last successful keep-alive's send time. Zero once lost.
    pub fn time_left(&self) -> Duration {
        self.held.time_left()
    }

    /// Stops the keep-alives and closes the session: everything held under
    /// it is released at once. False: it was not open any more (it had
    /// lapsed). The guards of its locks are lost from now on.
    pub fn close(mut self) -> Result<bool, ClientError> {
        self.closed = true;
        self.stop.take();
        // Lost first: its locks' guards stop counting on them before they
        // are released.
        self.held.mark_lost(calls::session_closed_reason(self.id()));
        self.client.close_session(self.id())
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.stop.take();
        if self.closed {
            return;
        }
        let lost = self.held.is_lost();
        self.held.mark_lost(calls::session_closed_reason(self.id()));
        if lost {
            return;
        }
        // Best effort within one request timeout, so that a drop never
        // blocks for a whole retry budget; an unclosed session lapses.
        let inner = &self.client.inner;
        let _ = inner.close_session(self.held.token, inner.request_timeout);
    }
}

/// Keeps the session alive every third of its TTL until it is lost or the
/// guard goes.
fn keep_alive_loop(inner: &Inner, held: &HeldLock, stop: &Receiver<()>) {
    loop {
        if held.is_lost() {
            return;
        }
        match stop.recv_deadline(held.renew_at()) {
            Err(RecvTimeoutError::Timeout) => {}
            // Stopped (closed, or the guard dropped).
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        if held.is_lost() {
            return;
        }
        let budget = held.start_renewal(now, inner.retry_for);
        if budget.is_zero() {
            continue;
        }
        match inner.keep_alive(held.token, budget) {
            Ok((answer, sent)) if answer.found => {
                held.renewed(sent, if answer.ttl.is_zero() { held.lease } else { answer.ttl });
            }
            Ok(_) => return held.mark_lost(calls::session_gone_reason(held.token)),
            Err(error) => {
                // Lost for good when retrying cannot help; otherwise tried
                // again a little later, while the TTL lasts.
                if let Some(reason) = calls::renew_error_loses(&error) {
                    return held.mark_lost(reason);
                }
            }
        }
    }
}
