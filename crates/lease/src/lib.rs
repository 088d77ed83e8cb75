//! Lease deadlines, tracked on each node with its own clock.
//!
//! A [`LeaseTracker`] is fed the lock-table changes as this node applies
//! them, each with the node's monotonic time in milliseconds, and answers
//! "which locks are due at `now_ms`?". The deadline of a lock is the moment
//! this node applied its Grant or Renew plus the lease length, so every node
//! tracks the same leases on its own clock.
//!
//! Architecture invariants:
//! - Pure: no clock, no threads, no I/O; time is always an argument. Feeding
//!   the same changes at the same times gives the same answers.
//! - The tracker decides nothing. Only the leader acts on what is due, by
//!   proposing `Expire { key, token }`; a lock leaves the table only through a
//!   committed Expire or Release, never because a clock said so.
//! - A deadline is never earlier than the apply time plus the lease, and
//!   time going backwards (a caller bug) never brings a deadline closer.
//!
//! ```
//! use fencelock_lease::LeaseTracker;
//! use fencelock_types::{FencingToken, Key, LeaseMs};
//!
//! let mut leases = LeaseTracker::new();
//! let key = Key::new(b"jobs/nightly".to_vec())?;
//! let token = FencingToken::new(7).unwrap();
//! leases.granted(key.clone(), token, LeaseMs::new(1_000)?, 5_000);
//! assert_eq!(leases.due(5_999).count(), 0);
//! assert_eq!(leases.due(6_000).collect::<Vec<_>>(), [(&key, token)]);
//! // A renewal applied at 5,500 moves the deadline to 6,500.
//! leases.renewed(key.clone(), token, LeaseMs::new(1_000)?, 5_500);
//! assert_eq!(leases.due(6_000).count(), 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::hash_map::RandomState;
use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasher, Hash};

use fencelock_types::{FencingToken, Key, LeaseMs};

/// The lease of one lock as this node tracks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub token: FencingToken,
    /// When the lease runs out, on this node's monotonic clock.
    pub deadline_ms: u64,
}

/// Lease deadlines by key, and by deadline for cheap "what is due" scans.
/// `K` is what a lease is known by: the key of a plain lock (one holder per
/// key), or `(Key, FencingToken)` for the holders of a read-write lock or
/// a semaphore (many per key).
#[derive(Clone, Debug)]
pub struct LeaseTracker<K = Key, S = RandomState> {
    /// Looked up by key only, never walked (so its order, which differs
    /// between processes, never shows): a hash map, so that a key is hashed
    /// once instead of compared at each level of a tree. `S` hashes: std's
    /// by default; the node brings a faster one.
    by_key: HashMap<K, Lease, S>,
    by_deadline: BTreeSet<(u64, K)>,
    /// The latest time seen, so that a clock going backwards is clamped.
    latest_ms: u64,
}

impl<K: Ord + Clone + Hash, S: BuildHasher + Default> Default for LeaseTracker<K, S> {
    fn default() -> LeaseTracker<K, S> {
        LeaseTracker { by_key: HashMap::default(), by_deadline: BTreeSet::new(), latest_ms: 0 }
    }
}

impl<K: Ord + Clone + Hash> LeaseTracker<K> {
    /// A tracker hashing with std's hasher (`default()` takes another).
    pub fn new() -> LeaseTracker<K> {
        LeaseTracker::default()
    }
}

impl<K: Ord + Clone + Hash, S: BuildHasher + Default> LeaseTracker<K, S> {
    /// A Grant applied at `now_ms` (a retried Grant by the holder too: its
    /// lease restarts, for the longer of its old and new lease: the state
    /// machine's answer says which, so a stale retry never shortens it).
    pub fn granted(&mut self, key: K, token: FencingToken, lease_ms: LeaseMs, now_ms: u64) {
        self.track(key, token, lease_ms, now_ms);
    }

    /// A Renew applied at `now_ms`.
    pub fn renewed(&mut self, key: K, token: FencingToken, lease_ms: LeaseMs, now_ms: u64) {
        self.track(key, token, lease_ms, now_ms);
    }

    /// A Release or Expire of the lock `key` held under `token` applied. A
    /// token that no longer holds the key changes nothing.
    pub fn removed(&mut self, key: &K, token: FencingToken) {
        if self.by_key.get(key).is_some_and(|lease| lease.token == token) {
            // The key the map held finds its deadline's entry: no copy.
            if let Some((key, lease)) = self.by_key.remove_entry(key) {
                self.by_deadline.remove(&(lease.deadline_ms, key));
            }
        }
    }

    /// Replaces everything with `locks`, each given a full lease from
    /// `now_ms`: after a restart or a snapshot this node cannot know when
    /// the locks were granted, and it must not expire one early.
    pub fn restore(&mut self, locks: impl IntoIterator<Item = (K, FencingToken, LeaseMs)>, now_ms: u64) {
        self.by_key.clear();
        self.by_deadline.clear();
        for (key, token, lease_ms) in locks {
            self.track(key, token, lease_ms, now_ms);
        }
    }

    /// The locks whose deadline is at or before `now_ms`, earliest first.
    pub fn due(&self, now_ms: u64) -> impl Iterator<Item = (&K, FencingToken)> + '_ {
        self.by_deadline.iter().take_while(move |(deadline, _)| *deadline <= now_ms).filter_map(|(_, key)| {
            let lease = self.by_key.get(key)?;
            Some((key, lease.token))
        })
    }

    /// Whether the lock `key` held under `token` is due at `now_ms`.
    pub fn is_due(&self, key: &K, token: FencingToken, now_ms: u64) -> bool {
        self.by_key.get(key).is_some_and(|lease| lease.token == token && lease.deadline_ms <= now_ms)
    }

    pub fn lease(&self, key: &K) -> Option<Lease> {
        self.by_key.get(key).copied()
    }

    /// The earliest deadline tracked.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.by_deadline.first().map(|(deadline, _)| *deadline)
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    fn track(&mut self, key: K, token: FencingToken, lease_ms: LeaseMs, now_ms: u64) {
        self.latest_ms = self.latest_ms.max(now_ms);
        let deadline_ms = self.latest_ms.saturating_add(lease_ms.get());
        let lease = Lease { token, deadline_ms };
        match self.by_key.get_mut(&key) {
            // A lease tracked already (a renewal): its deadline's entry
            // moves, the key in hand finding the old one.
            Some(old) => {
                let mut entry = (old.deadline_ms, key);
                *old = lease;
                self.by_deadline.remove(&entry);
                entry.0 = deadline_ms;
                self.by_deadline.insert(entry);
            }
            None => {
                self.by_key.insert(key.clone(), lease);
                self.by_deadline.insert((deadline_ms, key));
            }
        }
        debug_assert_eq!(self.by_key.len(), self.by_deadline.len());
    }
}

#[cfg(test)]
mod tests;
