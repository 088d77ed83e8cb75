//! What applying a command changed: [`Change`], the table's own account of
//! who gained, kept or lost a key, so that a replica fans the changes out
//! (to its leases, watchers and waiters) without reading the table before
//! and after.

use fencelock_types::{FencingToken, Key, LeaseMs, Owner, Value};

/// One change to who holds what, made by one applied command, in the order
/// the command made them: a command changes nothing, one holder, or (a
/// force-release of a shared key, the end of a session) several, and a
/// session's end comes after its holders'.
///
/// `shared` says the holder is one of a read-write lock's or a semaphore's
/// (tracked by key and token), not a plain lock. A holder that leaves hands
/// over its owner and value (none for a shared holder), taken out of the
/// table, not copied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// `key` is held under `token` for `lease_ms`: by a new holder, or
    /// (`existing`) its holder's retried Grant restarted the lease. Under a
    /// `session`, the lease is the session's.
    Granted {
        key: Key,
        token: FencingToken,
        lease_ms: LeaseMs,
        existing: bool,
        shared: bool,
        session: Option<FencingToken>,
    },
    /// The lease of holder `token` of `key` now lasts `lease_ms`; under a
    /// `session`, the Renew renewed the session, and `lease_ms` is its TTL.
    Renewed { key: Key, token: FencingToken, lease_ms: LeaseMs, shared: bool, session: Option<FencingToken> },
    /// Holder `token` left `key` by a Release, its session's close, or
    /// (`forced`) an administrative release naming no token.
    Released { key: Key, token: FencingToken, shared: bool, forced: bool, owner: Owner, value: Value },
    /// Holder `token` left `key` by an Expire, or its session's expiry.
    Expired { key: Key, token: FencingToken, shared: bool, owner: Owner, value: Value },
    /// Holder `token`'s lock on `key` ended, and lock-delay holds its place
    /// for `delay_ms`: it stays in the table, granted to no one.
    Delayed { key: Key, token: FencingToken, shared: bool, delay_ms: LeaseMs },
    /// The place `token` held back on `key` is free: by the Expire at the
    /// delay's end, or (`forced`) by an administrative release.
    DelayLifted { key: Key, token: FencingToken, shared: bool, forced: bool, owner: Owner, value: Value },
    /// The lock `token` holds on `key` carries a new value.
    Proclaimed { key: Key, token: FencingToken },
    /// A session opened under the id `session`, for `ttl_ms` per renewal.
    SessionOpened { session: FencingToken, ttl_ms: LeaseMs },
    /// A RenewSession renewed `session` for `ttl_ms`.
    SessionRenewed { session: FencingToken, ttl_ms: LeaseMs },
    /// `session` ended, closed or (`expired`) expired, after each of its
    /// holders' own change.
    SessionEnded { session: FencingToken, expired: bool },
}
