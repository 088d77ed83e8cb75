//! The fencelock state machine: a lock table that applies committed commands
//! in order and issues fencing tokens.
//!
//! This is the crate to reuse on its own. [`LockTable::apply`] is a pure
//! function of the table and one command: no clock, no I/O, no raft, no
//! threads, no randomness. Replicas that apply the same commands in the same
//! order hold equal tables and produce byte-identical snapshots.
//!
//! Architecture invariants:
//! - Fencing tokens come from a counter that is part of the table (and of its
//!   snapshot). Every Granted token is greater than every token issued before
//!   it, and a token is never issued twice, across snapshot and restore too.
//! - A key has at most one holder. Expire, and Release or Renew with a token,
//!   act only while that token holds the key, so a late or duplicated command
//!   never touches a newer lock.
//! - The first Bootstrap applied names the cluster and raises the token
//!   counter to its floor, never lowering it; later ones change nothing.
//! - The table has a command level ([`fencelock_types::LEVEL`]): a command
//!   of a higher level applies as Invalid (`LevelNotReached`), changing
//!   nothing, as a build too old to know it does. The first Bootstrap and
//!   RaiseLevel raise it, never lower it; it is in the snapshot.
//! - A Release or Renew that names a user (the authenticated caller, with
//!   TLS) acts only on a lock whose owner is that user or `user/...`, and
//!   such a Renew never shortens a lease.
//! - Lock outcomes are values in [`ApplyResult`]; `apply` never fails and
//!   never panics on a command, however it was decoded. Bytes that are not a
//!   valid command give [`ApplyResult::Invalid`], the same on every replica.
//! - The member directory (where each member added by a membership change is
//!   reached) is data the replica records as it applies those changes; the
//!   table never interprets it. It travels in the snapshot.
//! - Leases are lengths here, not deadlines: this crate never reads a clock.
//!   A lock leaves the table only by a committed Release or Expire.
//! - A lock carries a value (an election leader's): set by the Grant that
//!   made it (a retried Grant keeps it), replaced by a Proclaim of its token
//!   (with a user: only that user's lock), kept while held back by
//!   lock-delay, and in the snapshot.
//! - A key is one kind at a time: a plain lock (Grant), a read-write lock
//!   or a semaphore (GrantShared, [`Shared`]). A read-write lock has
//!   readers or one writer; a semaphore at most its permits, fixed by its
//!   first acquire (an acquire naming other permits, or the other kind, is
//!   answered Mismatch). Each holder has a token of its own from the one
//!   counter, and Release, Renew and Expire act on the holder of their
//!   token; a force-release frees every holder. The key leaves the table
//!   with its last holder. Lock-delay holds a holder back as it does a
//!   plain lock (its place stays taken until the delay's end); values are
//!   for plain locks: a Proclaim of a live shared holder's token is Invalid
//!   (`SharedHolderHasNoValue`), of any other token NotFound, and neither
//!   changes the key.
//! - Sessions: an OpenSession issues a token from the one counter as the
//!   session's id. A Grant or GrantShared under a session (of the same
//!   owner, open) is held by it instead of a lease of its own ([`Lock::session`]);
//!   a retry by the holder must name the same session (or none, as it
//!   was granted), else it is GrantRejected by its own token;
//!   a Renew of it renews the session (answered with the session's TTL);
//!   a CloseSession releases everything the session holds, an
//!   ExpireSession expires it (held back where a rule of its delays
//!   covers the key, leaving the session), each in that one command. A
//!   session counts as one lock in its owner's quota; it is in the
//!   snapshot, its holdings derived from the locks that name it.
//! - Lock-delay: an Expire that carries a delay does not remove a live lock
//!   but holds it back ([`Lock::delayed`], same token, `lease_ms` the
//!   delay): it is granted to no one (a Grant is rejected naming its
//!   token), renewed by no one, released only by force, not counted in its
//!   owner's quota, until a later Expire of the same token without a delay
//!   removes it. A repeated Expire with a delay changes nothing, so every
//!   Expire stays idempotent.
//!
//! Using the state machine alone:
//!
//! ```
//! use fencelock_fsm::LockTable;
//! use fencelock_types::{ApplyResult, Command, Key, LeaseMs, Owner, Value};
//!
//! let mut table = LockTable::new();
//! let key = Key::new(b"jobs/nightly".to_vec())?;
//! let grant = |owner: &[u8]| Command::Grant {
//!     key: key.clone(),
//!     lease_ms: LeaseMs::new(10_000).unwrap(),
//!     owner: Owner::new(owner.to_vec()).unwrap(),
//!     value: Value::none(),
//!     session: None,
//! };
//!
//! let ApplyResult::Granted { token, .. } = table.apply(grant(b"worker-1")) else {
//!     panic!("a free key is granted");
//! };
//! // Another owner is turned away; the holder's retry gets its own token back.
//! assert_eq!(table.apply(grant(b"worker-2")), ApplyResult::GrantRejected { holder_token: token });
//! assert!(matches!(table.apply(grant(b"worker-1")), ApplyResult::Granted { existing: true, .. }));
//!
//! // The lease runs out: the leader's Expire removes the lock, and the next
//! // holder gets a greater token, which the protected resource can check.
//! table.apply(Command::Expire { key: key.clone(), token, delay: None });
//! let ApplyResult::Granted { token: next, .. } = table.apply(grant(b"worker-2")) else {
//!     panic!("an expired key is granted again");
//! };
//! assert!(next > token);
//!
//! // A replica restored from a snapshot carries on exactly the same way.
//! let replica = LockTable::restore(&table.snapshot())?;
//! assert_eq!(replica, table);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod change;
mod snapshot;

pub use change::Change;
pub use snapshot::{SnapshotError, MEMBER_ADDR_MAX, SNAPSHOT_VERSION};

use imbl::{OrdMap, OrdSet};
use std::ops::Bound;

use fencelock_types::{
    decode_batch, ApplyResult, ClusterId, Command, FencingToken, InvalidReason, Key, LeaseMs, Owner, Share,
    Value, LEVEL,
};

/// One held lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lock {
    pub token: FencingToken,
    pub owner: Owner,
    /// The lease of the last Grant or Renew, as a length: each node turns it
    /// into a deadline on its own clock. For a lock held back by lock-delay,
    /// the delay.
    pub lease_ms: LeaseMs,
    /// Held back by lock-delay: the lock expired; nobody holds it, and
    /// nobody is granted the key until an Expire of `token` removes it.
    pub delayed: bool,
    /// What the holder says of itself (an election leader's value): from
    /// its Grant, replaced by its Proclaims.
    pub value: Value,
    /// The session it is held under (its lease is the session's; never
    /// for a lock held back), `None` for a lease of its own.
    pub session: Option<FencingToken>,
}

impl Lock {
    /// Whether `token` holds the key through this lock now: the lock's
    /// token, and not held back by lock-delay.
    pub fn is_held_by(&self, token: FencingToken) -> bool {
        self.token == token && !self.delayed
    }
}

/// One holder of a read-write lock or a semaphore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub owner: Owner,
    /// As [`Lock::lease_ms`].
    pub lease_ms: LeaseMs,
    /// A reader, the writer, or a permit (of the key's permits).
    pub share: Share,
    /// Held back by lock-delay, as [`Lock::delayed`]: the holder's lease
    /// ran out; it holds nothing, but its place stays taken (a writer's,
    /// a permit) until an Expire of its token without a delay removes it.
    pub delayed: bool,
    /// As [`Lock::session`].
    pub session: Option<FencingToken>,
}

/// An open session: what is held under it lives as long as it does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub owner: Owner,
    /// How long each renewal keeps it open, as a length: each node turns it
    /// into a deadline on its own clock.
    pub ttl_ms: LeaseMs,
    /// What it holds: each key with the holder's token (a plain lock's, or
    /// a shared key's holder's). Derived from the locks: not in the
    /// snapshot.
    pub holds: OrdSet<(Key, FencingToken)>,
}

/// A read-write lock (`permits` 0) or a semaphore of `permits`, and its
/// holders by token: never empty (the key leaves the table with its last
/// holder); a semaphore's hold permits and at most `permits` of them; a
/// read-write lock's, readers, or one writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shared {
    pub permits: u32,
    pub holders: OrdMap<FencingToken, Holder>,
}

impl Shared {
    /// The lowest token holding the key: what an acquire turned away is
    /// told.
    pub fn first_token(&self) -> Option<FencingToken> {
        self.holders.keys().next().copied()
    }

    /// The lowest token that holds the key and is not held back.
    pub fn first_live_token(&self) -> Option<FencingToken> {
        self.holders.iter().find(|(_, holder)| !holder.delayed).map(|(token, _)| *token)
    }

    /// The token `owner` holds the key under, if it does.
    pub fn token_of(&self, owner: &Owner) -> Option<FencingToken> {
        self.holders.iter().find(|(_, holder)| holder.owner == *owner).map(|(token, _)| *token)
    }
}

/// What a shared acquire would meet, as [`LockTable::shared_decision`]
/// tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedDecision {
    /// A new holder, under a new token.
    Grant,
    /// The owner holds the key already, under this token, in this share.
    Existing(FencingToken),
    /// Turned away: the key is held (by this token, among others) in a way
    /// this share cannot join, or it is a plain lock.
    Rejected(FencingToken),
    /// The key is another kind: a semaphore of these permits, or a
    /// read-write lock (0).
    Mismatch(u32),
}

/// Where a member is reached: its peer port and its client port, each
/// `HOST:PORT`, as the membership change that added it said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberAddrs {
    pub peer_addr: String,
    pub client_addr: String,
}

/// The replicated lock table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockTable {
    // An ordered map, so that listings and snapshots come out in one order
    // on every replica; a persistent one (imbl's B-tree, with shared
    // nodes), so that cloning the table costs O(1) and a snapshot can be
    // encoded from the clone on another thread while this one changes.
    locks: OrdMap<Key, Lock>,
    last_token: Option<FencingToken>,
    /// The cluster's name, from the first Bootstrap applied.
    cluster_id: Option<ClusterId>,
    /// Locks held per owner identity ([`Owner::identity`]), for quotas.
    /// Derived from `locks`: not in the snapshot.
    identities: OrdMap<Vec<u8>, usize>,
    /// The member directory, by node id.
    members: OrdMap<u64, MemberAddrs>,
    /// The read-write locks and semaphores; no key is both here and in
    /// `locks`.
    shared: OrdMap<Key, Shared>,
    /// Holders in `shared`, all keys together. Derived: not in the snapshot.
    shared_holders: usize,
    /// The command level: commands of a higher one apply as Invalid.
    level: u32,
    /// The open sessions, by id.
    sessions: OrdMap<FencingToken, Session>,
}

impl Default for LockTable {
    fn default() -> LockTable {
        LockTable::new()
    }
}

impl LockTable {
    /// An empty table that has issued no token, at this build's command
    /// level: every command applies. For a table used on its own.
    pub fn new() -> LockTable {
        LockTable::at_level(LEVEL)
    }

    /// An empty table at command `level` (at least 1). A replicated log
    /// starts from level 1, as every build before levels did: its
    /// Bootstrap or a RaiseLevel raises it.
    pub fn at_level(level: u32) -> LockTable {
        LockTable {
            locks: OrdMap::new(),
            last_token: None,
            cluster_id: None,
            identities: OrdMap::new(),
            members: OrdMap::new(),
            shared: OrdMap::new(),
            shared_holders: 0,
            level: level.max(1),
            sessions: OrdMap::new(),
        }
    }

    /// The command level: commands above it apply as Invalid.
    pub fn level(&self) -> u32 {
        self.level
    }

    /// Applies one committed command.
    pub fn apply(&mut self, command: Command) -> ApplyResult {
        self.apply_changes(command, &mut Vec::new())
    }

    /// Applies one committed command, as [`LockTable::apply`], and appends
    /// to `changes` what it changed, in order ([`Change`]): what a replica
    /// fans out to its leases, watchers and waiters.
    pub fn apply_changes(&mut self, command: Command, changes: &mut Vec<Change>) -> ApplyResult {
        if command.level() > self.level {
            return ApplyResult::Invalid { reason: InvalidReason::LevelNotReached };
        }
        match command {
            Command::Grant { key, lease_ms, owner, value, session } => {
                match self.session_for(session, &owner) {
                    Ok(lease_ms_of_session) => self.grant(
                        key,
                        lease_ms_of_session.unwrap_or(lease_ms),
                        owner,
                        value,
                        session,
                        changes,
                    ),
                    Err(refused) => refused,
                }
            }
            Command::GrantShared { key, lease_ms, owner, share, session } => {
                match self.session_for(session, &owner) {
                    Ok(lease_ms_of_session) => {
                        let lease_ms = lease_ms_of_session.unwrap_or(lease_ms);
                        self.grant_shared(key, lease_ms, owner, share, session, changes)
                    }
                    Err(refused) => refused,
                }
            }
            Command::OpenSession { owner, ttl_ms } => {
                let Some(session) = self.next_token() else {
                    return ApplyResult::Invalid { reason: InvalidReason::TokensExhausted };
                };
                self.count(&owner, true);
                self.sessions.insert(session, Session { owner, ttl_ms, holds: OrdSet::new() });
                changes.push(Change::SessionOpened { session, ttl_ms });
                ApplyResult::Granted { token: session, lease_ms: ttl_ms, existing: false }
            }
            Command::RenewSession { session, user } => match self.owned_session(session, user.as_ref()) {
                Ok(open) => {
                    let ttl_ms = open.ttl_ms;
                    changes.push(Change::SessionRenewed { session, ttl_ms });
                    ApplyResult::Renewed { token: session, lease_ms: ttl_ms }
                }
                Err(refused) => refused,
            },
            Command::CloseSession { session, user } => {
                if let Err(refused) = self.owned_session(session, user.as_ref()) {
                    return refused;
                }
                self.end_session(session, &[], Gone::Released { forced: false }, changes);
                ApplyResult::Released { token: session }
            }
            Command::ExpireSession { session, delays } => {
                if !self.sessions.contains_key(&session) {
                    return ApplyResult::Expired { existed: false };
                }
                self.end_session(session, &delays, Gone::Expired, changes);
                ApplyResult::Expired { existed: true }
            }
            Command::Proclaim { key, token, value, user } => {
                self.proclaim(key, token, value, user.as_ref(), changes)
            }
            Command::Release { key, token, user } => self.release(&key, token, user.as_ref(), changes),
            Command::Expire { key, token, delay } => self.expire(&key, token, delay, Gone::Expired, changes),
            Command::Renew { key, token, lease_ms, user } => {
                self.renew(key, token, lease_ms, user.as_ref(), changes)
            }
            Command::Noop => ApplyResult::Noop,
            Command::Bootstrap { cluster_id, token_floor, level } => {
                // The first one stays: a later leader's proposal, made
                // before it applied the first, changes nothing.
                if self.cluster_id.is_none() {
                    self.cluster_id = Some(cluster_id);
                    self.level = self.level.max(level);
                    // Raised, never lowered: tokens never go backwards.
                    let floor = FencingToken::new(token_floor);
                    if floor > self.last_token {
                        self.last_token = floor;
                    }
                }
                ApplyResult::Noop
            }
            Command::RaiseLevel { level } => {
                // Never lowered. Raised above this build's level, the
                // replica stops (it checks `level` after each entry).
                self.level = self.level.max(level);
                ApplyResult::Noop
            }
        }
    }

    /// Applies the payload of one committed log entry: a command batch, one
    /// result per command, in order. Bytes that are not a batch give a single
    /// [`InvalidReason::Undecodable`] result and change nothing.
    pub fn apply_entry(&mut self, data: &[u8]) -> Vec<ApplyResult> {
        let mut results = Vec::new();
        self.apply_entry_into(data, &mut results);
        results
    }

    /// Like [`LockTable::apply_entry`], appending to `results` so that a
    /// caller can reuse one buffer.
    pub fn apply_entry_into(&mut self, data: &[u8], results: &mut Vec<ApplyResult>) {
        match decode_batch(data) {
            Ok(commands) => results.extend(commands.into_iter().map(|command| match command {
                Ok(command) => self.apply(command),
                Err(reason) => ApplyResult::Invalid { reason },
            })),
            Err(reason) => results.push(ApplyResult::Invalid { reason }),
        }
    }

    /// The lock on `key`, if one is held.
    pub fn holder(&self, key: &[u8]) -> Option<&Lock> {
        self.locks.get(key)
    }

    /// Up to `limit` held locks whose keys start with `prefix`, in key order.
    pub fn list<'a>(
        &'a self,
        prefix: &'a [u8],
        limit: usize,
    ) -> impl Iterator<Item = (&'a Key, &'a Lock)> + 'a {
        self.locks
            .range::<_, [u8]>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |(key, _)| key.as_bytes().starts_with(prefix))
            .take(limit)
    }

    /// The read-write lock or semaphore on `key`, if it has holders.
    pub fn shared(&self, key: &[u8]) -> Option<&Shared> {
        self.shared.get(key)
    }

    /// Up to `limit` read-write locks and semaphores whose keys start with
    /// `prefix`, in key order.
    pub fn list_shared<'a>(
        &'a self,
        prefix: &'a [u8],
        limit: usize,
    ) -> impl Iterator<Item = (&'a Key, &'a Shared)> + 'a {
        self.shared
            .range::<_, [u8]>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |(key, _)| key.as_bytes().starts_with(prefix))
            .take(limit)
    }

    /// Whether `token` holds `key` now, alone or shared.
    pub fn holds(&self, key: &[u8], token: FencingToken) -> bool {
        match self.locks.get(key) {
            Some(lock) => lock.is_held_by(token),
            None => self
                .shared
                .get(key)
                .is_some_and(|shared| shared.holders.get(&token).is_some_and(|holder| !holder.delayed)),
        }
    }

    /// The number of locks held: plain locks (held back by lock-delay
    /// included) and holders of read-write locks and semaphores.
    pub fn len(&self) -> usize {
        self.locks.len() + self.shared_holders
    }

    pub fn is_empty(&self) -> bool {
        self.locks.is_empty() && self.shared.is_empty()
    }

    /// What a shared acquire of `key` by `owner` would meet now.
    pub fn shared_decision(&self, key: &[u8], owner: &Owner, share: Share) -> SharedDecision {
        if let Some(lock) = self.locks.get(key) {
            return SharedDecision::Rejected(lock.token);
        }
        let Some(shared) = self.shared.get(key) else { return SharedDecision::Grant };
        let kind_matches = match share {
            Share::Permit(permits) => shared.permits == permits,
            Share::Read | Share::Write => shared.permits == 0,
        };
        if !kind_matches {
            return SharedDecision::Mismatch(shared.permits);
        }
        if let Some((token, holder)) = shared.holders.iter().find(|(_, holder)| holder.owner == *owner) {
            // The owner's retry in the share it holds; in another (a reader
            // asking to write), or held back by lock-delay, it is turned
            // away like anyone.
            return if holder.share == share && !holder.delayed {
                SharedDecision::Existing(*token)
            } else {
                SharedDecision::Rejected(*token)
            };
        }
        let first = shared.first_token().expect("a shared key has holders");
        let fits = match share {
            Share::Permit(permits) => shared.holders.len() < permits as usize,
            Share::Read => shared.holders.values().all(|holder| holder.share == Share::Read),
            Share::Write => false,
        };
        if fits {
            SharedDecision::Grant
        } else {
            SharedDecision::Rejected(first)
        }
    }

    /// The open session `session`, if it is.
    pub fn session(&self, session: FencingToken) -> Option<&Session> {
        self.sessions.get(&session)
    }

    /// The open sessions, by ascending id.
    pub fn sessions(&self) -> impl Iterator<Item = (FencingToken, &Session)> + '_ {
        self.sessions.iter().map(|(id, session)| (*id, session))
    }

    /// The number of open sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Whether a lock or a holder on `key` is held under a session.
    pub fn has_session_holder(&self, key: &[u8]) -> bool {
        match self.locks.get(key) {
            Some(lock) => lock.session.is_some(),
            None => self
                .shared
                .get(key)
                .is_some_and(|shared| shared.holders.values().any(|holder| holder.session.is_some())),
        }
    }

    /// The session `token`'s lock or holder on `key` is held under, if
    /// any.
    pub fn session_of(&self, key: &[u8], token: FencingToken) -> Option<FencingToken> {
        match self.locks.get(key) {
            Some(lock) if lock.token == token => lock.session,
            Some(_) => None,
            None => self.shared.get(key)?.holders.get(&token)?.session,
        }
    }

    /// The number of locks held by owners of `identity` ([`Owner::identity`]).
    pub fn locks_of(&self, identity: &[u8]) -> usize {
        self.identities.get(identity).copied().unwrap_or(0)
    }

    /// The cluster's id, `None` until a Bootstrap is applied.
    pub fn cluster_id(&self) -> Option<ClusterId> {
        self.cluster_id
    }

    /// The last token issued, `None` before the first grant.
    pub fn last_token(&self) -> Option<FencingToken> {
        self.last_token
    }

    /// Records where member `id` is reached (a membership change applied).
    pub fn set_member(&mut self, id: u64, addrs: MemberAddrs) {
        self.members.insert(id, addrs);
    }

    /// Forgets member `id` (its removal applied).
    pub fn remove_member(&mut self, id: u64) {
        self.members.remove(&id);
    }

    /// Where member `id` is reached, if a membership change said.
    pub fn member(&self, id: u64) -> Option<&MemberAddrs> {
        self.members.get(&id)
    }

    /// The member directory, by ascending id.
    pub fn members(&self) -> impl Iterator<Item = (u64, &MemberAddrs)> + '_ {
        self.members.iter().map(|(id, addrs)| (*id, addrs))
    }

    /// This table as a new cluster starts from it (`fencelockd --restore`):
    /// the locks and the token counter, without the old cluster's id (the
    /// new cluster's first leader names it, and raises the counter to its
    /// token floor) and without its member directory (the new cluster's
    /// members are its own).
    pub fn for_restore(&self) -> LockTable {
        LockTable { cluster_id: None, members: OrdMap::new(), ..self.clone() }
    }

    /// Checks the session a Grant names: `Ok(None)` without one, the
    /// session's TTL (the lock's lease) when it is open and `owner`'s,
    /// else the answer.
    fn session_for(
        &self,
        session: Option<FencingToken>,
        owner: &Owner,
    ) -> Result<Option<LeaseMs>, ApplyResult> {
        let Some(session) = session else { return Ok(None) };
        match self.sessions.get(&session) {
            None => Err(ApplyResult::NoSession { session }),
            Some(open) if open.owner != *owner => Err(ApplyResult::Denied { token: session }),
            Some(open) => Ok(Some(open.ttl_ms)),
        }
    }

    /// The open session `session`, if `user` (when there is one) owns it,
    /// else the answer.
    fn owned_session(&self, session: FencingToken, user: Option<&Owner>) -> Result<&Session, ApplyResult> {
        match self.sessions.get(&session) {
            None => Err(ApplyResult::NoSession { session }),
            Some(open) if user.is_some_and(|user| !open.owner.is_of_user(user.as_bytes())) => {
                Err(ApplyResult::Denied { token: session })
            }
            Some(open) => Ok(open),
        }
    }

    /// Ends `session`: each of its holders goes, or is held back if a rule
    /// of `delays` covers its key (an expiry's lock-delay); the session
    /// leaves the table and its owner's quota.
    /// `gone` says how a holder that goes went (released at a close,
    /// expired at an expiry), for `changes`.
    fn end_session(
        &mut self,
        session: FencingToken,
        delays: &[(Vec<u8>, LeaseMs)],
        gone: Gone,
        changes: &mut Vec<Change>,
    ) {
        let Some(ended) = self.sessions.remove(&session) else { return };
        self.count(&ended.owner, false);
        for (key, token) in ended.holds {
            let delay = fencelock_types::lock_delay_for(delays, key.as_bytes());
            // The session is gone: a holder held back is on its own.
            if let Some(lock) = self.locks.get_mut(&key).filter(|lock| lock.token == token) {
                lock.session = None;
            } else if let Some(holder) =
                self.shared.get_mut(&key).and_then(|shared| shared.holders.get_mut(&token))
            {
                holder.session = None;
            }
            self.expire(&key, token, delay, gone, changes);
        }
        changes.push(Change::SessionEnded { session, expired: gone == Gone::Expired });
    }

    /// Takes `key`'s holder `token` out of the holdings of `session`.
    fn leave_session(&mut self, session: Option<FencingToken>, key: &Key, token: FencingToken) {
        if let Some(open) = session.and_then(|session| self.sessions.get_mut(&session)) {
            open.holds.remove(&(key.clone(), token));
        }
    }

    fn grant(
        &mut self,
        key: Key,
        lease_ms: LeaseMs,
        owner: Owner,
        value: Value,
        session: Option<FencingToken>,
        changes: &mut Vec<Change>,
    ) -> ApplyResult {
        // A read-write lock or a semaphore is held, for a plain lock.
        if let Some(first) = self.shared.get(&key).and_then(Shared::first_token) {
            return ApplyResult::GrantRejected { holder_token: first };
        }
        if let Some(lock) = self.locks.get_mut(&key) {
            // Held back by lock-delay: for its own former owner too. And
            // an owner holds a key once: asked under another session (or
            // none) than it holds it under, it is turned away by its own
            // token, as a reader asking to write is: a lock the asker would
            // believe its session's must never live on a lease of its own.
            if lock.owner != owner || lock.delayed || lock.session != session {
                return ApplyResult::GrantRejected { holder_token: lock.token };
            }
            // A retry by the holder: same token, lease restarted, never
            // shortened (a stale retry must not cut a newer grant's lease).
            // A lock under a session keeps the session's lease.
            if lock.session.is_none() {
                lock.lease_ms = lock.lease_ms.max(lease_ms);
            }
            let (token, lease_ms) = (lock.token, lock.lease_ms);
            changes.push(Change::Granted { key, token, lease_ms, existing: true, shared: false, session });
            return ApplyResult::Granted { token, lease_ms, existing: true };
        }
        let Some(token) = self.next_token() else {
            return ApplyResult::Invalid { reason: InvalidReason::TokensExhausted };
        };
        self.count(&owner, true);
        if let Some(open) = session.and_then(|session| self.sessions.get_mut(&session)) {
            open.holds.insert((key.clone(), token));
        }
        self.locks.insert(key.clone(), Lock { token, owner, lease_ms, delayed: false, value, session });
        changes.push(Change::Granted { key, token, lease_ms, existing: false, shared: false, session });
        ApplyResult::Granted { token, lease_ms, existing: false }
    }

    /// Issues the next token, or `None` when every one has been issued.
    fn next_token(&mut self) -> Option<FencingToken> {
        let token = match self.last_token {
            None => FencingToken::FIRST,
            Some(last) => last.next()?,
        };
        assert!(self.last_token < Some(token), "fencing tokens never go backwards");
        self.last_token = Some(token);
        Some(token)
    }

    fn grant_shared(
        &mut self,
        key: Key,
        lease_ms: LeaseMs,
        owner: Owner,
        share: Share,
        session: Option<FencingToken>,
        changes: &mut Vec<Change>,
    ) -> ApplyResult {
        match self.shared_decision(key.as_bytes(), &owner, share) {
            SharedDecision::Rejected(holder_token) => ApplyResult::GrantRejected { holder_token },
            SharedDecision::Mismatch(permits) => ApplyResult::Mismatch { permits },
            SharedDecision::Existing(token) => {
                let holder = self
                    .shared
                    .get_mut(&key)
                    .and_then(|shared| shared.holders.get_mut(&token))
                    .expect("an existing holder is in the table");
                // Under another session, or none: turned away, as a Grant.
                if holder.session != session {
                    return ApplyResult::GrantRejected { holder_token: token };
                }
                // Never shortened, as a plain lock's retry; a session's
                // holder keeps the session's.
                if holder.session.is_none() {
                    holder.lease_ms = holder.lease_ms.max(lease_ms);
                }
                let lease_ms = holder.lease_ms;
                changes.push(Change::Granted { key, token, lease_ms, existing: true, shared: true, session });
                ApplyResult::Granted { token, lease_ms, existing: true }
            }
            SharedDecision::Grant => {
                let Some(token) = self.next_token() else {
                    return ApplyResult::Invalid { reason: InvalidReason::TokensExhausted };
                };
                self.count(&owner, true);
                self.shared_holders += 1;
                if let Some(open) = session.and_then(|session| self.sessions.get_mut(&session)) {
                    open.holds.insert((key.clone(), token));
                }
                let shared = self
                    .shared
                    .entry(key.clone())
                    .or_insert_with(|| Shared { permits: share.permits(), holders: OrdMap::new() });
                shared.holders.insert(token, Holder { owner, lease_ms, share, delayed: false, session });
                changes.push(Change::Granted {
                    key,
                    token,
                    lease_ms,
                    existing: false,
                    shared: true,
                    session,
                });
                ApplyResult::Granted { token, lease_ms, existing: false }
            }
        }
    }

    /// Removes holder `token` of the shared key `key`, and the key with its
    /// last holder, saying for `changes` that it went as `gone` says (a
    /// holder held back: that its delay was lifted). Whether there was one.
    fn remove_holder(
        &mut self,
        key: &Key,
        token: FencingToken,
        gone: Gone,
        changes: &mut Vec<Change>,
    ) -> bool {
        let Some(shared) = self.shared.get_mut(key) else { return false };
        let Some(holder) = shared.holders.remove(&token) else { return false };
        if shared.holders.is_empty() {
            self.shared.remove(key);
        }
        self.shared_holders -= 1;
        // A holder held back was counted out when it was.
        if !holder.delayed {
            self.count(&holder.owner, false);
        }
        self.leave_session(holder.session, key, token);
        changes.push(gone.change(key.clone(), token, true, holder.delayed, holder.owner, Value::none()));
        true
    }

    /// Release, Renew, Expire or Proclaim of a shared key's holder.
    fn shared_command(
        &mut self,
        key: &Key,
        command: SharedCommand<'_>,
        changes: &mut Vec<Change>,
    ) -> ApplyResult {
        let Some(shared) = self.shared.get_mut(key) else {
            return match command {
                SharedCommand::Expire(..) => ApplyResult::Expired { existed: false },
                _ => ApplyResult::NotFound { holder_token: None },
            };
        };
        let first = shared.first_live_token();
        match command {
            SharedCommand::Release(None, _) => {
                // The administrative force-release: every holder goes.
                let tokens: Vec<FencingToken> = shared.holders.keys().copied().collect();
                let last = tokens.last().copied();
                for token in tokens {
                    self.remove_holder(key, token, Gone::Released { forced: true }, changes);
                }
                match last {
                    Some(token) => ApplyResult::Released { token },
                    None => ApplyResult::NotFound { holder_token: None },
                }
            }
            SharedCommand::Release(Some(token), user) => {
                // Held back by lock-delay: no one's to release but by force.
                let Some(holder) = shared.holders.get(&token).filter(|holder| !holder.delayed) else {
                    return ApplyResult::NotFound { holder_token: first };
                };
                if user.is_some_and(|user| !holder.owner.is_of_user(user.as_bytes())) {
                    return ApplyResult::Denied { token };
                }
                self.remove_holder(key, token, Gone::Released { forced: false }, changes);
                ApplyResult::Released { token }
            }
            SharedCommand::Expire(token, delay, gone) => {
                let Some(holder) = shared.holders.get_mut(&token) else {
                    return ApplyResult::Expired { existed: false };
                };
                match (holder.delayed, delay) {
                    // Held back, as a plain lock is: the place stays taken.
                    (false, Some(delay_ms)) => {
                        holder.delayed = true;
                        holder.lease_ms = delay_ms;
                        let owner = holder.owner.clone();
                        let session = holder.session.take();
                        self.count(&owner, false);
                        self.leave_session(session, key, token);
                        changes.push(Change::Delayed { key: key.clone(), token, shared: true, delay_ms });
                        ApplyResult::Delayed { token, delay_ms }
                    }
                    // A repeat of the Expire that held it back.
                    (true, Some(_)) => ApplyResult::Expired { existed: false },
                    (_, None) => {
                        ApplyResult::Expired { existed: self.remove_holder(key, token, gone, changes) }
                    }
                }
            }
            SharedCommand::Renew(token, lease_ms, user) => {
                let Some(holder) = shared.holders.get_mut(&token).filter(|holder| !holder.delayed) else {
                    return ApplyResult::NotFound { holder_token: first };
                };
                if let Some(session) = holder.session {
                    // Renews the session it is held under.
                    if user.is_some_and(|user| !holder.owner.is_of_user(user.as_bytes())) {
                        return ApplyResult::Denied { token };
                    }
                    let lease_ms = self.sessions.get(&session).map_or(holder.lease_ms, |open| open.ttl_ms);
                    let session = Some(session);
                    changes.push(Change::Renewed {
                        key: key.clone(),
                        token,
                        lease_ms,
                        shared: true,
                        session,
                    });
                    return ApplyResult::Renewed { token, lease_ms };
                }
                match user {
                    None => holder.lease_ms = lease_ms,
                    Some(user) if holder.owner.is_of_user(user.as_bytes()) => {
                        holder.lease_ms = holder.lease_ms.max(lease_ms);
                    }
                    Some(_) => return ApplyResult::Denied { token },
                }
                let lease_ms = holder.lease_ms;
                changes.push(Change::Renewed {
                    key: key.clone(),
                    token,
                    lease_ms,
                    shared: true,
                    session: None,
                });
                ApplyResult::Renewed { token, lease_ms }
            }
            // Shared holders carry no value. A live holder is told so
            // (NotFound would tell it that it lost the key, and name another
            // holder); any other token is told who holds the key, as for a
            // plain lock. Either way nothing changes.
            SharedCommand::Proclaim(token) => match shared.holders.get(&token) {
                Some(holder) if !holder.delayed => {
                    ApplyResult::Invalid { reason: InvalidReason::SharedHolderHasNoValue }
                }
                _ => ApplyResult::NotFound { holder_token: first },
            },
        }
    }

    /// Counts a lock of `owner` in (`added`) or out of its identity's total.
    fn count(&mut self, owner: &Owner, added: bool) {
        let identity = owner.identity();
        if added {
            match self.identities.get_mut(identity) {
                Some(count) => *count += 1,
                None => {
                    self.identities.insert(identity.to_vec(), 1);
                }
            }
        } else if let Some(count) = self.identities.get_mut(identity) {
            *count -= 1;
            if *count == 0 {
                self.identities.remove(identity);
            }
        }
    }

    fn release(
        &mut self,
        key: &Key,
        token: Option<FencingToken>,
        user: Option<&Owner>,
        changes: &mut Vec<Change>,
    ) -> ApplyResult {
        if self.shared.contains_key(key) {
            return self.shared_command(key, SharedCommand::Release(token, user), changes);
        }
        match self.locks.get(key) {
            // A lock held back by lock-delay is no one's to release: only
            // the administrative force-release (no token) lifts it.
            Some(lock) if lock.delayed && token.is_some() => ApplyResult::NotFound { holder_token: None },
            Some(lock) if token.is_none_or(|token| token == lock.token) => {
                let forced = token.is_none();
                let token = lock.token;
                if user.is_some_and(|user| !lock.owner.is_of_user(user.as_bytes())) {
                    return ApplyResult::Denied { token };
                }
                self.remove(key, Gone::Released { forced }, changes);
                ApplyResult::Released { token }
            }
            other => ApplyResult::NotFound { holder_token: other.map(|lock| lock.token) },
        }
    }

    /// Removes the lock on `key`, counting it out of its owner's total
    /// unless lock-delay already did, and saying for `changes` that it went
    /// as `gone` says (held back: that its delay was lifted).
    fn remove(&mut self, key: &Key, gone: Gone, changes: &mut Vec<Change>) {
        if let Some(lock) = self.locks.remove(key) {
            if !lock.delayed {
                self.count(&lock.owner, false);
            }
            self.leave_session(lock.session, key, lock.token);
            changes.push(gone.change(key.clone(), lock.token, false, lock.delayed, lock.owner, lock.value));
        }
    }

    /// An Expire of `token` on `key`, or a session's end (`gone` says
    /// which way a holder that goes went: released at a close).
    fn expire(
        &mut self,
        key: &Key,
        token: FencingToken,
        delay: Option<LeaseMs>,
        gone: Gone,
        changes: &mut Vec<Change>,
    ) -> ApplyResult {
        if self.shared.contains_key(key) {
            return self.shared_command(key, SharedCommand::Expire(token, delay, gone), changes);
        }
        let Some(lock) = self.locks.get_mut(key).filter(|lock| lock.token == token) else {
            return ApplyResult::Expired { existed: false };
        };
        match (lock.delayed, delay) {
            (false, Some(delay_ms)) => {
                lock.delayed = true;
                lock.lease_ms = delay_ms;
                let owner = lock.owner.clone();
                let session = lock.session.take();
                self.count(&owner, false);
                self.leave_session(session, key, token);
                changes.push(Change::Delayed { key: key.clone(), token, shared: false, delay_ms });
                ApplyResult::Delayed { token, delay_ms }
            }
            // A repeat of the Expire that held it back (say, proposed again
            // by a new leader before it applied the first): the delay
            // stands. Only an Expire without a delay lifts it.
            (true, Some(_)) => ApplyResult::Expired { existed: false },
            (_, None) => {
                self.remove(key, gone, changes);
                ApplyResult::Expired { existed: true }
            }
        }
    }

    fn proclaim(
        &mut self,
        key: Key,
        token: FencingToken,
        value: Value,
        user: Option<&Owner>,
        changes: &mut Vec<Change>,
    ) -> ApplyResult {
        if self.shared.contains_key(&key) {
            return self.shared_command(&key, SharedCommand::Proclaim(token), changes);
        }
        match self.locks.get_mut(&key) {
            // Held back by lock-delay: the key is free of holders.
            Some(lock) if lock.delayed => ApplyResult::NotFound { holder_token: None },
            Some(lock) if lock.token == token => {
                if user.is_some_and(|user| !lock.owner.is_of_user(user.as_bytes())) {
                    return ApplyResult::Denied { token };
                }
                lock.value = value;
                changes.push(Change::Proclaimed { key, token });
                ApplyResult::Proclaimed { token }
            }
            other => ApplyResult::NotFound { holder_token: other.map(|lock| lock.token) },
        }
    }

    fn renew(
        &mut self,
        key: Key,
        token: FencingToken,
        lease_ms: LeaseMs,
        user: Option<&Owner>,
        changes: &mut Vec<Change>,
    ) -> ApplyResult {
        if self.shared.contains_key(&key) {
            return self.shared_command(&key, SharedCommand::Renew(token, lease_ms, user), changes);
        }
        match self.locks.get_mut(&key) {
            // Held back by lock-delay: the key is free of holders.
            Some(lock) if lock.delayed => ApplyResult::NotFound { holder_token: None },
            Some(lock) if lock.token == token && lock.session.is_some() => {
                // Renews the session it is held under.
                if user.is_some_and(|user| !lock.owner.is_of_user(user.as_bytes())) {
                    return ApplyResult::Denied { token };
                }
                let (lease_ms, session) = (lock.lease_ms, lock.session);
                changes.push(Change::Renewed { key, token, lease_ms, shared: false, session });
                ApplyResult::Renewed { token, lease_ms }
            }
            Some(lock) if lock.token == token => {
                match user {
                    None => lock.lease_ms = lease_ms,
                    // Never shorter: a renew extends a lease, it cannot cut it.
                    Some(user) if lock.owner.is_of_user(user.as_bytes()) => {
                        lock.lease_ms = lock.lease_ms.max(lease_ms);
                    }
                    Some(_) => return ApplyResult::Denied { token },
                }
                let lease_ms = lock.lease_ms;
                changes.push(Change::Renewed { key, token, lease_ms, shared: false, session: None });
                ApplyResult::Renewed { token, lease_ms }
            }
            other => ApplyResult::NotFound { holder_token: other.map(|lock| lock.token) },
        }
    }
}

/// How a holder that leaves the table went, for its [`Change`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gone {
    /// By a Release (`forced`: one naming no token) or a session's close.
    Released { forced: bool },
    /// By an Expire or a session's expiry.
    Expired,
}

impl Gone {
    /// The change of holder `token` of `key` leaving this way; a holder
    /// held back (`delayed`) had its delay lifted.
    fn change(
        self,
        key: Key,
        token: FencingToken,
        shared: bool,
        delayed: bool,
        owner: Owner,
        value: Value,
    ) -> Change {
        match self {
            _ if delayed => {
                let forced = matches!(self, Gone::Released { .. });
                Change::DelayLifted { key, token, shared, forced, owner, value }
            }
            Gone::Released { forced } => Change::Released { key, token, shared, forced, owner, value },
            Gone::Expired => Change::Expired { key, token, shared, owner, value },
        }
    }
}

/// What a command does to a shared key's holder.
enum SharedCommand<'a> {
    Release(Option<FencingToken>, Option<&'a Owner>),
    Expire(FencingToken, Option<LeaseMs>, Gone),
    Renew(FencingToken, LeaseMs, Option<&'a Owner>),
    Proclaim(FencingToken),
}

#[cfg(test)]
mod change_tests;
#[cfg(test)]
mod tests;
