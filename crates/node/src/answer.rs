//! Typed answers, one type per operation: what a client's acquire,
//! release, renewal, proclaim or session command gets back, in place of the
//! state machine's general result list. [`crate::reply`] builds them.
//!
//! It owns only the vocabulary: no state, and nothing of the node.

use fencelock_types::{FencingToken, LeaseMs};

/// How an acquire (plain, shared, or under a session) ended as the state
/// machine decided it. A key held when the leader looked, a lock-delay and
/// a wait that ran out are [`RequestError`]s (`Held`, `Delayed`,
/// `WaitTimedOut`), decided before proposing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// The key is held under `token` for `lease_ms`; `existing`: the owner
    /// held it already and kept its token (a retried acquire).
    Granted { token: FencingToken, lease_ms: LeaseMs, existing: bool },
    /// Another holder had the key when the Grant applied.
    Held { holder_token: FencingToken },
    /// A shared acquire of another kind than the key: a semaphore of
    /// `permits`, or a read-write lock (`permits` 0).
    Mismatch { permits: u32 },
    /// The session named is not open.
    NoSession { session: FencingToken },
    /// The session named is another owner's.
    NotSessionOwner { session: FencingToken },
}

/// How a release ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The lock held under `token` is gone.
    Released { token: FencingToken },
    /// No lock of that token: the key is free (`None`) or held under
    /// another token.
    NotHeld { holder_token: Option<FencingToken> },
    /// The lock held under `token` is another user's.
    NotYours { token: FencingToken },
}

/// How the renewal of one lock ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The lease of the lock held under `token` now lasts `lease_ms` (a
    /// lock under a session: the session's TTL).
    Renewed { token: FencingToken, lease_ms: LeaseMs },
    /// No lock of that token: the key is free (`None`) or held under
    /// another token.
    NotHeld { holder_token: Option<FencingToken> },
    /// The lock held under `token` is another user's.
    NotYours { token: FencingToken },
}

/// How a proclaim ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proclaimed {
    /// The lock held under `token` carries the new value.
    Proclaimed { token: FencingToken },
    /// No lock of that token: the key is free (`None`) or held under
    /// another token.
    NotHeld { holder_token: Option<FencingToken> },
    /// The lock held under `token` is another user's.
    NotYours { token: FencingToken },
    /// The token holds the key as a reader, the writer or a permit, which
    /// carry no value.
    SharedHolder,
}

/// A session opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    pub session: FencingToken,
    pub ttl_ms: LeaseMs,
}

/// How a session's keep-alive ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionKept {
    /// Open for `ttl_ms` more.
    Kept { ttl_ms: LeaseMs },
    /// Closed, lapsed, or never opened.
    NotOpen,
    /// Another owner's.
    NotYours,
}

/// How a session's close ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionClosed {
    /// Closed now: what it held is released.
    Closed,
    /// Closed before, lapsed, or never opened.
    NotOpen,
    /// Another owner's.
    NotYours,
}
