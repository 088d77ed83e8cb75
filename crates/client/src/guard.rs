//! [`LockGuard`]: a held lock, renewed in the background and released on
//! drop.

use std::sync::Arc;
use std::time::Duration;

use crate::client::Client;
use crate::local::LocalHold;
use crate::renewer::HeldLock;
use crate::ClientError;

/// A lock held through a [`Client`]. While it lives, the client's renewer
/// keeps the lease going; dropping it releases the lock (best effort, within
/// one request timeout, and not at all once the lock is lost).
///
/// Check [`LockGuard::is_lost`] before acting on the lock, and pass
/// [`LockGuard::token`] with every write to the protected resource: a lease
/// can always run out during a pause the client does not see.
///
/// One guard per key and owner in a process: a second `acquire` of a key
/// that a guard of the same owner holds waits for that guard to be dropped
/// (up to its `wait`), or fails; it is never handed the same lock.
#[derive(Debug)]
pub struct LockGuard {
    client: Client,
    held: Arc<HeldLock>,
    released: bool,
    /// The key held in this process: another guard of the same owner waits
    /// until this one is dropped (after its release).
    _local: LocalHold,
}

impl LockGuard {
    pub(crate) fn new(client: Client, held: Arc<HeldLock>, local: LocalHold) -> LockGuard {
        LockGuard { client, held, released: false, _local: local }
    }

    pub fn key(&self) -> &[u8] {
        &self.held.key
    }

    /// The fencing token.
    pub fn token(&self) -> u64 {
        self.held.token
    }

    /// The lease granted; each renewal extends it by this much.
    pub fn lease(&self) -> Duration {
        self.held.lease
    }

    /// The time the holder may still count on the lock: what is left of
    /// the usable part (less the drift margin, `ClientConfig::drift`) of the
    /// last lease granted or renewed, counted from that request's send
    /// time. Zero once lost. Act on the lock only with more than the action
    /// takes, and fence it all the same.
    pub fn time_left(&self) -> Duration {
        self.held.time_left()
    }

    /// True once the lock is lost: a renewal was refused (the token no longer
    /// holds the key), or the usable part of a lease passed without a
    /// successful renewal.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Why the lock was lost, once it is.
    pub fn lost_reason(&self) -> Option<String> {
        self.held.lost_reason()
    }

    /// Replaces the lock's value (an election leader proclaims a new one).
    /// False: the token no longer holds the key.
    pub fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<bool, ClientError> {
        self.client.proclaim(&self.held.key, self.held.token, value).map(|outcome| outcome.released)
    }

    /// Stops renewing and releases the lock. False: the token no longer held
    /// the key.
    pub fn release(mut self) -> Result<bool, ClientError> {
        self.released = true;
        self.client.inner.renewer.remove(&self.held);
        self.client.release(&self.held.key, self.held.token)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.client.inner.renewer.remove(&self.held);
        // A lost lock is no longer held under this token (or its lease ran
        // out and the server expires it), so a release could only wait on an
        // unreachable cluster for nothing.
        if self.held.is_lost() {
            return;
        }
        // Best effort within one request timeout, so that a drop never
        // blocks for a whole retry budget; an unreleased lock still expires.
        let inner = &self.client.inner;
        let _ = inner.release(&self.held.key, self.held.token, false, inner.request_timeout);
    }
}
