//! [`LockGuard`]: a held lock, renewed in the background and released on
//! drop; and the acquires that make one ([`Client::acquire`],
//! [`Client::campaign`], [`Client::acquire_shared`], their `_as` forms, and
//! their `_in` forms under a session).

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock_types::Share;

use crate::client::Client;
use crate::local::LocalHold;
use crate::renewer::HeldLock;
use crate::sansio::calls::{self, Acquiring};
use crate::session::SessionGuard;
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

impl Client {
    /// Acquires `key` for `lease`, waiting up to `wait` in the leader's queue
    /// if another owner holds it (`Duration::ZERO` answers at once). The
    /// returned guard is renewed in the background and released on drop.
    pub fn acquire(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        let owner = self.inner.owner.clone();
        self.acquire_as(&owner, key, lease, wait)
    }

    /// [`Client::acquire`] under an explicit owner identity.
    pub fn acquire_as(
        &self,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        self.acquire_with(owner, key.as_ref(), b"", lease, wait)
    }

    /// Campaigns in `election` with `value` (what this candidate says of
    /// itself: its address, say): waits up to `wait` in the leader's FIFO
    /// queue of candidates, and leads once granted, with a fencing token,
    /// for as long as the guard is renewed. [`LockGuard::proclaim`] changes
    /// the value; dropping or releasing the guard resigns. Observers
    /// ([`Client::observe`]) see each leader and value.
    pub fn campaign(
        &self,
        election: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        let owner = self.inner.owner.clone();
        self.acquire_with(&owner, election.as_ref(), value.as_ref(), lease, wait)
    }

    /// Acquires `key` shared: as a reader ([`Share::Read`]) or the writer
    /// ([`Share::Write`]) of a read-write lock, or as one permit of a
    /// semaphore of N ([`Share::Permit`]`(N)`, N fixed by the key's first
    /// acquire). Waits up to `wait`, FIFO (a reader does not pass a waiting
    /// writer). Each holder has a token of its own; the guard is renewed
    /// and released like a plain lock's. One guard per key and owner in a
    /// process: for two permits, use two owners
    /// ([`Client::acquire_shared_as`]).
    pub fn acquire_shared(
        &self,
        key: impl AsRef<[u8]>,
        share: Share,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        let owner = self.inner.owner.clone();
        self.acquire_shared_as(&owner, key, share, lease, wait)
    }

    /// [`Client::acquire_shared`] under an explicit owner identity.
    pub fn acquire_shared_as(
        &self,
        owner: &[u8],
        key: impl AsRef<[u8]>,
        share: Share,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        self.acquire_guarded(None, owner, key.as_ref(), &Acquiring::Shared(share), lease, wait)
    }

    fn acquire_with(
        &self,
        owner: &[u8],
        key: &[u8],
        value: &[u8],
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        self.acquire_guarded(None, owner, key, &Acquiring::Exclusive(value), lease, wait)
    }

    /// Acquires under `session` (its guard) when given: no lease of its
    /// own, nothing renews it, and it is lost with the session.
    fn acquire_guarded(
        &self,
        session: Option<&SessionGuard>,
        owner: &[u8],
        key: &[u8],
        acquiring: &Acquiring<'_>,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        if let Some(session) = session {
            return self.acquire_guarded_in(session, owner, key, acquiring, wait);
        }
        // Started before the request, so that a lock is never granted with
        // nothing to renew it.
        self.inner.renewer.start(&self.inner).map_err(ClientError::Internal)?;
        // A guard of this process that holds the key for the same owner is
        // waited for first: the server would hand its lock over (crate::local).
        let started = Instant::now();
        let local = LocalHold::take(owner, key, wait)?;
        let (grant, mut sent) =
            self.inner.acquire(None, owner, key, acquiring, lease, wait.saturating_sub(started.elapsed()))?;
        // Granted after a wait in the queue: the lease the client can prove
        // starts at the send time, long ago. A renewal now starts one it
        // can count on (or finds the lock already gone).
        if crate::sansio::lease::needs_fresh_start(sent, grant.lease, self.inner.drift, Instant::now()) {
            let (answer, renewed_at) =
                self.inner.renew(&[(key.to_vec(), grant.token)], grant.lease, self.inner.retry_for)?;
            let renewed = calls::renewed_one(&answer);
            if !renewed.renewed {
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
        let lock = Arc::new(HeldLock::new(key.to_vec(), grant.token, grant.lease, sent, self.inner.drift));
        self.inner.renewer.add(Arc::clone(&lock));
        Ok(LockGuard::new(self.clone(), lock, local))
    }

    fn acquire_guarded_in(
        &self,
        session: &SessionGuard,
        owner: &[u8],
        key: &[u8],
        acquiring: &Acquiring<'_>,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        let started = Instant::now();
        let local = LocalHold::take(owner, key, wait)?;
        let wait_left = wait.saturating_sub(started.elapsed());
        let (grant, _) =
            self.inner.acquire(Some(session.id()), owner, key, acquiring, session.ttl(), wait_left)?;
        local.granted(grant.token);
        // Its lease is the session's, kept alive by the session's guard.
        let lock = Arc::new(HeldLock::under(key.to_vec(), grant.token, Arc::clone(&session.held)));
        Ok(LockGuard::new(self.clone(), lock, local))
    }

    /// [`Client::acquire`] under `session`: the lock has no lease of its
    /// own and is not renewed by itself; it lives as long as the session,
    /// and its guard is lost when the session is. Dropping or releasing the
    /// guard releases the lock alone. The session must be this client's
    /// owner's (else [`ClientError::PermissionDenied`]) and open (else
    /// [`ClientError::NoSession`]).
    pub fn acquire_in(
        &self,
        session: &SessionGuard,
        key: impl AsRef<[u8]>,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        let owner = self.inner.owner.clone();
        self.acquire_guarded(
            Some(session),
            &owner,
            key.as_ref(),
            &Acquiring::Exclusive(b""),
            Duration::ZERO,
            wait,
        )
    }

    /// [`Client::campaign`] under `session`: the candidate leads for as
    /// long as the session lives.
    pub fn campaign_in(
        &self,
        session: &SessionGuard,
        election: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        let owner = self.inner.owner.clone();
        let acquiring = Acquiring::Exclusive(value.as_ref());
        self.acquire_guarded(Some(session), &owner, election.as_ref(), &acquiring, Duration::ZERO, wait)
    }

    /// [`Client::acquire_shared`] under `session`: a reader, the writer or
    /// a permit that lives as long as the session.
    pub fn acquire_shared_in(
        &self,
        session: &SessionGuard,
        key: impl AsRef<[u8]>,
        share: Share,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        let owner = self.inner.owner.clone();
        let acquiring = Acquiring::Shared(share);
        self.acquire_guarded(Some(session), &owner, key.as_ref(), &acquiring, Duration::ZERO, wait)
    }
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
