//! Apply results: the checked [`ApplyResult`] enum.
//!
//! Lock outcomes (held by another owner, stale token, not found) are values
//! here, never errors: applying a command always yields a result. Results
//! never cross the wire: each replica computes its own, and a server
//! answers its clients in the client protocol's own terms.

use crate::{FencingToken, InvalidReason, LeaseMs};

/// What applying one command did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyResult {
    /// The key is held under `token` with a lease of `lease_ms`. `existing`
    /// says the owner already held it and kept its token (a retried acquire).
    Granted { token: FencingToken, lease_ms: LeaseMs, existing: bool },
    /// Another owner holds the key under `holder_token`.
    GrantRejected { holder_token: FencingToken },
    /// The lock held under `token` was removed.
    Released { token: FencingToken },
    /// No lock to release or renew: the key is free (`holder_token`
    /// `None`), or held under another token, `holder_token`.
    NotFound { holder_token: Option<FencingToken> },
    /// An Expire was processed; `existed` says whether it removed a lock.
    Expired { existed: bool },
    /// An Expire with a lock-delay ended the live lock under `token`: its
    /// key is held back for `delay_ms`, granted to no one, until a later
    /// Expire of the same token removes it.
    Delayed { token: FencingToken, delay_ms: LeaseMs },
    /// Nothing happened, by design.
    Noop,
    /// The lease of the lock held under `token` now lasts `lease_ms`.
    Renewed { token: FencingToken, lease_ms: LeaseMs },
    /// The command was refused before it touched the table.
    Invalid { reason: InvalidReason },
    /// A Release or Renew with a user, of the lock `token` holds for
    /// another user: nothing changed.
    Denied { token: FencingToken },
    /// The lock held under `token` now carries the value of the Proclaim.
    Proclaimed { token: FencingToken },
    /// A GrantShared of another kind than the key is: the key is a
    /// semaphore of `permits`, or a read-write lock (`permits` 0).
    Mismatch { permits: u32 },
    /// A command named a session that is not open (closed, lapsed, or
    /// never opened): nothing changed.
    NoSession { session: FencingToken },
}
