//! Above the log: the lock service's state. The applied table and what a
//! node derives from it (leases on its own clock, the grant behind each
//! held lock, the watch history), and, on the leader, the requests waiting
//! for the log and the reads waiting for a ReadIndex. Nothing here knows
//! raft-rs: [`super::Replica`] feeds it applied commands and takes its next
//! batch.

use std::collections::BTreeMap;
use std::sync::Arc;

use ahash::RandomState;
use slog::Logger;

use fencelock_fsm::{Change, LockTable, SharedDecision};
use fencelock_lease::LeaseTracker;
use fencelock_types::{ApplyResult, Command, FencingToken, Key, Owner, Value};

use super::{GrantRef, Stats};
use crate::queue::{Pending, Requests};
use crate::types::{
    AppliedEvent, Config, HeldLock, MemberChange, NodeId, Query, Quota, Reply, RequestError, RequestId,
    Response,
};
use crate::watch::{WatchKind, Watches};

/// Request ids with this bit set are the leader's own (Expire, ghost
/// Release); the shell numbers client requests below it.
pub(crate) const INTERNAL_REQUEST_BIT: u64 = 1 << 63;

/// The lock service: the applied table and the state derived from it.
pub(crate) struct LockService {
    pub(crate) config: Arc<Config>,
    pub(crate) logger: Logger,
    /// The applied lock table.
    pub(crate) table: LockTable,
    /// The index the table reflects: raft's applied index, or ahead of it
    /// while a snapshot installed from an asynchronous store is persisting.
    pub(crate) table_index: u64,
    /// This node's monotonic time, as last given to `set_now`.
    pub(crate) now_ms: u64,
    /// The leader has applied an entry of its own term: it may propose.
    pub(crate) leader_ready: bool,
    /// Requests accepted while leader, waiting or in flight, in order.
    pub(crate) requests: Requests,
    /// The last id of the leader's own requests (Expire, ghost Release).
    pub(crate) next_internal_id: u64,
    pub(crate) leases: Leases,
    pub(crate) reads: Reads,
    pub(crate) levels: Levels,
    /// Per held lock, by its token (one counter issues every holder's, so
    /// a token names one holder of one key), the index of the entry that
    /// last granted, re-granted or renewed it (absent for locks restored
    /// from a snapshot).
    pub(crate) grant_index: BTreeMap<FencingToken, u64>,
    /// Recent changes, and the watches parked until the next one.
    pub(crate) watches: Watches,
    /// What the command being applied changed: a buffer kept between
    /// commands.
    pub(crate) changes: Vec<Change>,
    pub(crate) out: Outbox,
}

/// What the service hands out: answers, applied changes, the grants that
/// answered requests, and its counters.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    /// Answers to requests, by id.
    pub(crate) replies: Vec<(RequestId, Reply)>,
    /// Lock-table changes, in apply order, each with its entry's index.
    pub(crate) applied: Vec<(u64, AppliedEvent)>,
    /// The new locks that answered requests were granted.
    pub(crate) grants: Vec<(RequestId, GrantRef)>,
    /// Requests and commands proposed, and changes applied.
    pub(crate) stats: Stats,
}

impl Outbox {
    pub(crate) fn is_empty(&self) -> bool {
        self.replies.is_empty() && self.applied.is_empty() && self.grants.is_empty()
    }
}

impl LockService {
    /// A service over `table`, the state as of log index `index`; its
    /// leases are rebuilt at the first time it is given.
    pub(crate) fn new(
        config: Arc<Config>,
        logger: Logger,
        table: LockTable,
        index: u64,
        watches: Watches,
    ) -> LockService {
        LockService {
            config,
            logger,
            table,
            table_index: index,
            now_ms: 0,
            leader_ready: false,
            requests: Requests::default(),
            next_internal_id: 0,
            leases: Leases::new(),
            reads: Reads::default(),
            levels: Levels::default(),
            grant_index: BTreeMap::new(),
            watches,
            changes: Vec::new(),
            out: Outbox::default(),
        }
    }
}

/// Deadlines on this node's clock, fed by applied changes, and the
/// leader's bookkeeping of the expiries it proposes.
pub(crate) struct Leases {
    /// Plain locks, by key.
    pub(crate) plain: LeaseTracker<Key, RandomState>,
    /// The holders of read-write locks and semaphores, by key and token.
    pub(crate) shared: LeaseTracker<(Key, FencingToken), RandomState>,
    /// Sessions, by id: what is held under a session has no lease of its
    /// own here.
    pub(crate) sessions: LeaseTracker<FencingToken, RandomState>,
    /// The leases must be rebuilt from the table at the next `set_now` (the
    /// table came from a snapshot at open, before any time was known).
    pub(crate) need_restore: bool,
    /// When the leader last looked for leases due.
    pub(crate) last_scan_ms: Option<u64>,
    /// On the leader: the sessions with an ExpireSession of its own
    /// pending, and its request.
    pub(crate) sessions_expiring: BTreeMap<FencingToken, RequestId>,
    /// On the leader: the renewals of sessions in flight (a RenewSession,
    /// or a Renew of something a session holds), by request. An
    /// ExpireSession is not proposed while one of its session's is: the
    /// renewal would apply first and be answered alive, and the expiry
    /// then end the session. Answered requests are pruned lazily.
    pub(crate) session_renewals: Vec<(RequestId, FencingToken)>,
}

impl Leases {
    pub(crate) fn new() -> Leases {
        Leases {
            plain: LeaseTracker::default(),
            shared: LeaseTracker::default(),
            sessions: LeaseTracker::default(),
            need_restore: true,
            last_scan_ms: None,
            sessions_expiring: BTreeMap::new(),
            session_renewals: Vec::new(),
        }
    }
}

/// Linearizable reads on their way: waiting for their ReadIndex, then for
/// apply to reach it.
#[derive(Default)]
pub(crate) struct Reads {
    /// Reads waiting for their ReadIndex.
    pub(crate) waiting: BTreeMap<RequestId, Query>,
    /// Reads taken by a leader that has not committed an entry of its term
    /// yet: raft-rs drops a ReadIndex then, so they are asked once it has.
    pub(crate) before_ready: Vec<RequestId>,
    /// Membership requests answered without the log (a retry of a change
    /// that applied, or one the configuration refuses), waiting for a
    /// ReadIndex to confirm this node still leads: a leader deposed
    /// without knowing it would answer from an old configuration.
    pub(crate) member_checks: BTreeMap<RequestId, MemberChange>,
    /// Reads whose ReadIndex is known, waiting for apply to reach it.
    pub(crate) at_index: Vec<(u64, RequestId)>,
}

/// The command levels the cluster's members said they apply.
#[derive(Default)]
pub(crate) struct Levels {
    /// The command level each peer said in its last hello (a build before
    /// levels says 0).
    pub(crate) peers: BTreeMap<u64, u32>,
    /// The term this node last proposed a RaiseLevel in.
    pub(crate) raised_in: Option<u64>,
}

impl LockService {
    pub(crate) fn reply(&mut self, id: RequestId, reply: Reply) {
        if id.0 & INTERNAL_REQUEST_BIT == 0 {
            self.out.replies.push((id, reply));
        }
    }

    /// Forgets an answered request and lets the next request on its keys go.
    pub(crate) fn finish(&mut self, id: RequestId, reply: Reply) {
        self.reply(id, reply);
        let table = &self.table;
        self.requests.remove(id, &|key, waiter| admits(table, key, waiter));
    }

    pub(crate) fn internal_id(&mut self) -> RequestId {
        self.next_internal_id += 1;
        RequestId(INTERNAL_REQUEST_BIT | self.next_internal_id)
    }

    /// Takes a request of the leader's own (an expiry, a ghost release),
    /// if its budget has room: it is proposed as a client's is, and
    /// answered to no one.
    pub(crate) fn submit_internal(&mut self, id: RequestId, commands: Vec<Command>) {
        if self.requests.internal() >= self.config.limits.internal_pending_max || commands.is_empty() {
            return;
        }
        self.requests.insert(id, Pending::new(commands, true, None, None));
    }

    /// Refuses leases outside the configured bounds.
    pub(crate) fn check_leases(&self, commands: &[Command]) -> Result<(), RequestError> {
        let (min_ms, max_ms) = (self.config.leases.lease_min_ms, self.config.leases.lease_max_ms);
        for command in commands {
            // Under a session, a Grant's lease is the session's.
            if let Command::Grant { lease_ms, session: None, .. }
            | Command::GrantShared { lease_ms, session: None, .. }
            | Command::Renew { lease_ms, .. }
            | Command::OpenSession { ttl_ms: lease_ms, .. } = command
            {
                if !(min_ms..=max_ms).contains(&lease_ms.get()) {
                    return Err(RequestError::LeaseOutOfBounds { lease_ms: lease_ms.get(), min_ms, max_ms });
                }
            }
        }
        Ok(())
    }

    /// The holder that a Grant in `commands` would be turned away by. A
    /// shared acquire also waits behind the acquires already waiting for
    /// its key (FIFO: a reader does not pass a waiting writer), unless its
    /// owner holds the key already (a retry) or it is such a waiter, handed
    /// the key (`admitted`).
    pub(crate) fn grant_conflict(&self, commands: &[Command], admitted: bool) -> Option<(Key, FencingToken)> {
        commands.iter().find_map(|command| match command {
            Command::GrantShared { key, owner, share, session, .. } => {
                match self.table.shared_decision(key.as_bytes(), owner, *share) {
                    SharedDecision::Rejected(token) => Some((key.clone(), token)),
                    // Held by this owner under another session (or none):
                    // turned away by its own token, as the table will.
                    SharedDecision::Existing(token)
                        if self.table.session_of(key.as_bytes(), token) != *session =>
                    {
                        Some((key.clone(), token))
                    }
                    // A waiter handed the key goes first: sent back behind
                    // the others, it would hand the key to the next, and
                    // so on, forever.
                    SharedDecision::Grant if !admitted && self.requests.waiters_of(key) > 0 => {
                        first_holder(&self.table, key).map(|token| (key.clone(), token))
                    }
                    SharedDecision::Grant | SharedDecision::Existing(_) | SharedDecision::Mismatch(_) => None,
                }
            }
            Command::Grant { key, owner, session, .. } => match self.table.holder(key.as_bytes()) {
                // Held back by lock-delay: for its former owner too; held
                // by this owner under another session (or none): by its own
                // token, as the table will answer.
                Some(lock) => (lock.owner != *owner || lock.delayed || lock.session != *session)
                    .then(|| (key.clone(), lock.token)),
                // A read-write lock or a semaphore: a plain acquire waits
                // for its last holder to go, like any other.
                None => first_holder(&self.table, key).map(|token| (key.clone(), token)),
            },
            _ => None,
        })
    }

    /// Whether an acquire in `commands` is turned away by its own owner's
    /// hold of the key in another share (a reader asking to write) or
    /// under another session (or none): waiting would wait for itself, so
    /// it is answered at once.
    pub(crate) fn turned_away_by_itself(&self, commands: &[Command]) -> bool {
        commands.iter().any(|command| match command {
            Command::GrantShared { key, owner, share, session, .. } => self
                .table
                .shared(key.as_bytes())
                .and_then(|shared| shared.holders.values().find(|holder| holder.owner == *owner))
                .is_some_and(|holder| {
                    (holder.share != *share || holder.session != *session) && !holder.delayed
                }),
            // Its owner holds it under another session (or none).
            Command::Grant { key, owner, session, .. } => self
                .table
                .holder(key.as_bytes())
                .is_some_and(|lock| lock.owner == *owner && !lock.delayed && lock.session != *session),
            _ => false,
        })
    }

    /// The locks request `id`'s Grants would add to the table, each with its
    /// owner's identity, or the quota one of them would break. A Grant on a
    /// key the table holds adds none (a retry of the holder), except in a
    /// hand-over (`handed_over`), where the same entry frees the key first:
    /// the table keeps its size but the new owner's identity gains a lock.
    /// Locks in flight count as held, so two proposals cannot both take
    /// the last place.
    pub(crate) fn quota_check(
        &self,
        id: RequestId,
        handed_over: bool,
    ) -> Result<Vec<(Vec<u8>, bool)>, RequestError> {
        self.quota_check_in(&self.table, id, handed_over, &[])
    }

    /// [`Replica::quota_check`] against `table`, a clone of the applied
    /// table with proposals in flight applied to it: `in_table`, the locks
    /// those proposals add, are counted in flight too, and once only.
    pub(crate) fn quota_check_in(
        &self,
        table: &LockTable,
        id: RequestId,
        handed_over: bool,
        in_table: &[(Vec<u8>, bool)],
    ) -> Result<Vec<(Vec<u8>, bool)>, RequestError> {
        let Some(pending) = self.requests.get(id) else { return Ok(Vec::new()) };
        let mut new_locks: Vec<(Vec<u8>, bool)> = Vec::new();
        let in_flight =
            self.requests.new_locks().saturating_sub(in_table.iter().filter(|(_, adds)| *adds).count());
        for command in &pending.commands {
            let (key, owner, adds) = match command {
                Command::Grant { key, owner, .. } => {
                    (Some(key), owner, table.holder(key.as_bytes()).is_none())
                }
                Command::GrantShared { key, owner, share, .. } => {
                    let adds = table.shared_decision(key.as_bytes(), owner, *share) == SharedDecision::Grant;
                    (Some(key), owner, adds)
                }
                // A session counts as one lock.
                Command::OpenSession { owner, .. } => (None, owner, true),
                _ => continue,
            };
            let _ = key;
            if !adds && !handed_over {
                continue;
            }
            let identity = owner.identity();
            // This request's earlier Grants count too.
            let total = new_locks.iter().filter(|(_, adds)| *adds).count();
            let of_identity = new_locks.iter().filter(|(other, _)| other == identity).count();
            let table_len = table.len() + table.session_count();
            if adds && table_len + in_flight + total >= self.config.limits.locks_max {
                return Err(RequestError::QuotaExceeded(Quota::Table { max: self.config.limits.locks_max }));
            }
            let in_table_of = in_table.iter().filter(|(other, _)| other == identity).count();
            let held = table.locks_of(identity)
                + self.requests.new_locks_of(identity).saturating_sub(in_table_of)
                + of_identity;
            if held >= self.config.limits.locks_per_identity_max {
                return Err(RequestError::QuotaExceeded(Quota::Identity {
                    identity: String::from_utf8_lossy(identity).into_owned(),
                    max: self.config.limits.locks_per_identity_max,
                }));
            }
            new_locks.push((identity.to_vec(), adds));
        }
        Ok(new_locks)
    }

    /// Answers waiters whose time is up; the queue behind them moves up.
    pub(crate) fn time_out_waiters(&mut self) {
        for (key, id) in self.requests.timed_out(self.now_ms) {
            let holder_token = first_holder(&self.table, &key);
            self.finish(id, Err(RequestError::WaitTimedOut { key, holder_token }));
        }
    }

    pub(crate) fn restore_leases(&mut self) {
        self.leases.need_restore = false;
        // What a session holds has its session's lease.
        let locks = self
            .table
            .list(b"", usize::MAX)
            .filter(|(_, lock)| lock.session.is_none())
            .map(|(key, lock)| (key.clone(), lock.token, lock.lease_ms));
        self.leases.plain.restore(locks, self.now_ms);
        let holders = self.table.list_shared(b"", usize::MAX).flat_map(|(key, shared)| {
            shared
                .holders
                .iter()
                .filter(|(_, holder)| holder.session.is_none())
                .map(move |(token, holder)| ((key.clone(), *token), *token, holder.lease_ms))
        });
        self.leases.shared.restore(holders, self.now_ms);
        let sessions = self.table.sessions().map(|(id, session)| (id, id, session.ttl_ms));
        self.leases.sessions.restore(sessions, self.now_ms);
    }

    /// Drops from an Expire request of the leader's own each Expire no
    /// longer due (the holder was renewed, released or re-granted since it
    /// was decided); the key, when none is left.
    pub(crate) fn stale_expire(&mut self, id: RequestId) -> Option<Key> {
        let (leases, shared_leases, now_ms) = (&self.leases.plain, &self.leases.shared, self.now_ms);
        let shared = |key: &Key| self.table.shared(key.as_bytes()).is_some();
        let pending = self.requests.get_mut(id).filter(|pending| pending.internal)?;
        let Some(Command::Expire { key, .. }) = pending.commands.first() else { return None };
        let key = key.clone();
        let is_shared = shared(&key);
        pending.commands.retain(|command| match command {
            Command::Expire { key, token, .. } if is_shared => {
                shared_leases.is_due(&(key.clone(), *token), *token, now_ms)
            }
            Command::Expire { key, token, .. } => leases.is_due(key, *token, now_ms),
            _ => true,
        });
        pending.commands.is_empty().then_some(key)
    }

    /// Whether request `id` is an ExpireSession of the leader's own that is
    /// no longer due (the session was renewed or ended since).
    pub(crate) fn stale_session_expiry(&self, id: RequestId) -> bool {
        let Some(pending) = self.requests.get(id).filter(|pending| pending.internal) else {
            return false;
        };
        match pending.commands.as_slice() {
            [Command::ExpireSession { session, .. }] => {
                !self.leases.sessions.is_due(session, *session, self.now_ms)
                    || self
                        .leases
                        .session_renewals
                        .iter()
                        .any(|(renewal, of)| of == session && self.requests.contains(*renewal))
            }
            _ => false,
        }
    }

    /// The key of a ghost Release whose lock is no longer the grant nobody
    /// received: released, expired, re-granted to its owner (whose retry was
    /// told it holds the lock) or renewed since.
    pub(crate) fn stale_ghost(&self, id: RequestId) -> Option<Key> {
        let pending = self.requests.get(id).filter(|pending| pending.internal)?;
        let index = pending.ghost_of?;
        match pending.commands.as_slice() {
            [Command::Release { key, token: Some(token), user: None }] => {
                let same_grant =
                    self.grant_index.get(token) == Some(&index) && self.table.holds(key.as_bytes(), *token);
                (!same_grant).then(|| key.clone())
            }
            other => panic!("a ghost release carries one Release with a token, not {other:?}"),
        }
    }

    /// Applies one command of the entry at `index`, and fans out what it
    /// changed, as the table says ([`Change`]), to the leases, the
    /// watchers, the waiters and the applied events.
    pub(crate) fn apply_command(
        &mut self,
        command: Command,
        proposer: Option<NodeId>,
        index: u64,
    ) -> ApplyResult {
        // A session's end frees its holders with nothing in flight on
        // their keys: their waiters are handed on here, on the leader.
        let ends_session = matches!(command, Command::CloseSession { .. } | Command::ExpireSession { .. });
        let mut changes = std::mem::take(&mut self.changes);
        let last_token = self.table.last_token();
        let result = self.table.apply_changes(command, &mut changes);
        assert!(self.table.last_token() >= last_token, "fencing tokens never go backwards");
        for change in changes.drain(..) {
            self.fan_out(change, proposer, index, ends_session);
        }
        self.changes = changes;
        result
    }

    /// Fans one change of the entry at `index` out. Lease deadlines are on
    /// this node's clock, from now; what a session holds has no lease of
    /// its own here (its session's is in `leases.sessions`).
    pub(crate) fn fan_out(
        &mut self,
        change: Change,
        proposer: Option<NodeId>,
        index: u64,
        ends_session: bool,
    ) {
        let now_ms = self.now_ms;
        let event = match change {
            Change::Granted { key, token, lease_ms, existing, shared, session } => {
                self.out.stats.grants_applied += 1;
                if !existing {
                    self.record_holder(index, WatchKind::Granted, &key, token);
                }
                if session.is_none() {
                    if shared {
                        self.leases.shared.granted((key.clone(), token), token, lease_ms, now_ms);
                    } else {
                        self.leases.plain.granted(key.clone(), token, lease_ms, now_ms);
                    }
                }
                self.grant_index.insert(token, index);
                AppliedEvent::Granted { key, token, lease_ms, existing, session }
            }
            Change::Renewed { key, token, lease_ms, shared, session } => {
                self.out.stats.renewals_applied += 1;
                match session {
                    // A renew of what a session holds renews the session.
                    Some(session) => self.leases.sessions.renewed(session, session, lease_ms, now_ms),
                    None if shared => {
                        self.leases.shared.renewed((key.clone(), token), token, lease_ms, now_ms)
                    }
                    None => self.leases.plain.renewed(key.clone(), token, lease_ms, now_ms),
                }
                self.grant_index.insert(token, index);
                AppliedEvent::Renewed { key, token, lease_ms }
            }
            Change::Released { key, token, shared, forced: _, owner, value } => {
                self.out.stats.releases_applied += 1;
                let key = self.holder_gone(index, WatchKind::Released, key, token, shared, &owner, &value);
                AppliedEvent::Released { key, token }
            }
            Change::Expired { key, token, shared, owner, value } => {
                self.out.stats.expiries_applied += 1;
                let key = self.holder_gone(index, WatchKind::Expired, key, token, shared, &owner, &value);
                AppliedEvent::Expired { key, token, proposer }
            }
            Change::Delayed { key, token, shared, delay_ms } => {
                // The holder's lock ended; the key stays held back, and
                // this node tracks the delay as it tracked the lease (the
                // leader lifts it once the delay is over, as any).
                self.out.stats.expiries_applied += 1;
                self.record_holder(index, WatchKind::Delayed, &key, token);
                if shared {
                    self.leases.shared.renewed((key.clone(), token), token, delay_ms, now_ms);
                } else {
                    self.leases.plain.renewed(key.clone(), token, delay_ms, now_ms);
                }
                self.grant_index.remove(&token);
                AppliedEvent::Delayed { key, token, delay_ms, proposer }
            }
            Change::DelayLifted { key, token, shared, forced, owner, value } => {
                let key = self.holder_gone(index, WatchKind::DelayLifted, key, token, shared, &owner, &value);
                AppliedEvent::DelayLifted { key, token, proposer, forced }
            }
            Change::Proclaimed { key, token } => {
                self.record_holder(index, WatchKind::Proclaimed, &key, token);
                AppliedEvent::Proclaimed { key, token }
            }
            Change::SessionOpened { session, ttl_ms } => {
                self.leases.sessions.granted(session, session, ttl_ms, now_ms);
                AppliedEvent::SessionOpened { session, ttl_ms }
            }
            Change::SessionRenewed { session, ttl_ms } => {
                self.leases.sessions.renewed(session, session, ttl_ms, now_ms);
                AppliedEvent::SessionRenewed { session, ttl_ms }
            }
            Change::SessionEnded { session, expired } => {
                self.leases.sessions.removed(&session, session);
                // Acquires still waiting under the session will never be granted.
                for id in self.requests.waiting_in_session(session) {
                    self.finish(id, Ok(Response::Applied(vec![ApplyResult::NoSession { session }])));
                }
                AppliedEvent::SessionEnded { session, expired, proposer }
            }
        };
        if ends_session {
            if let Some(key) = event.key() {
                let table = &self.table;
                self.requests.wake(key, &|key, waiter| admits(table, key, waiter));
            }
        }
        self.out.applied.push((index, event));
    }

    /// Holder `token` of `key` left the table at `index` (`kind`: released,
    /// expired, or its delay lifted): the watchers are told, with the owner
    /// and value it had, and its lease and grant are forgotten. Gives the
    /// key back.
    #[allow(clippy::too_many_arguments)]
    fn holder_gone(
        &mut self,
        index: u64,
        kind: WatchKind,
        key: Key,
        token: FencingToken,
        shared: bool,
        owner: &Owner,
        value: &Value,
    ) -> Key {
        self.watches.record_parts(index, kind, token, key.as_bytes(), owner.as_bytes(), value.as_bytes());
        self.forget_holder(key, token, shared)
    }

    /// Forgets the lease and the grant index of holder `token` of `key`
    /// (a plain lock, or a `shared` key's holder), which the table no
    /// longer has, and gives the key back: both are looked up by the key
    /// itself, not a copy.
    pub(crate) fn forget_holder(&mut self, key: Key, token: FencingToken, shared: bool) -> Key {
        let held = (key, token);
        if shared {
            self.leases.shared.removed(&held, token);
        } else {
            self.leases.plain.removed(&held.0, token);
        }
        self.grant_index.remove(&token);
        held.0
    }

    /// Records for the watchers that `token`, still in the table, holds
    /// `key` anew (`kind`): with its owner and value (a shared holder's is
    /// none), copied into the history.
    pub(crate) fn record_holder(&mut self, index: u64, kind: WatchKind, key: &Key, token: FencingToken) {
        let key_bytes = key.as_bytes();
        match self.table.holder(key_bytes) {
            Some(lock) if lock.token == token => self.watches.record_parts(
                index,
                kind,
                token,
                key_bytes,
                lock.owner.as_bytes(),
                lock.value.as_bytes(),
            ),
            Some(_) => {}
            None => {
                let holder = self.table.shared(key_bytes).and_then(|held| held.holders.get(&token));
                if let Some(holder) = holder {
                    self.watches.record_parts(index, kind, token, key_bytes, holder.owner.as_bytes(), &[]);
                }
            }
        }
    }

    /// `lock` with the time left on its lease by this node's clock.
    pub(crate) fn held(&self, key: &Key, lock: &fencelock_fsm::Lock) -> HeldLock {
        let lease = match lock.session {
            Some(session) => self.leases.sessions.lease(&session),
            None => self.leases.plain.lease(key).filter(|lease| lease.token == lock.token),
        };
        let remaining_ms = lease.map(|lease| lease.deadline_ms.saturating_sub(self.now_ms));
        HeldLock { lock: lock.clone(), remaining_ms, share: None }
    }

    /// The holders of a read-write lock or a semaphore, by token, each with
    /// the time left on its lease by this node's clock.
    pub(crate) fn shared_holders<'a>(
        &'a self,
        key: &'a Key,
        shared: &'a fencelock_fsm::Shared,
    ) -> impl Iterator<Item = HeldLock> + 'a {
        shared.holders.iter().map(move |(token, holder)| {
            let lease = match holder.session {
                Some(session) => self.leases.sessions.lease(&session),
                None => self.leases.shared.lease(&(key.clone(), *token)),
            };
            let remaining_ms = lease.map(|lease| lease.deadline_ms.saturating_sub(self.now_ms));
            let lock = fencelock_fsm::Lock {
                token: *token,
                owner: holder.owner.clone(),
                lease_ms: holder.lease_ms,
                delayed: holder.delayed,
                value: Value::none(),
                session: holder.session,
            };
            HeldLock { lock, remaining_ms, share: Some(holder.share) }
        })
    }

    /// Answers the parked watches that have a change to tell, or whose
    /// wait ran out.
    pub(crate) fn answer_watches(&mut self) {
        if self.watches.parked() == 0 {
            return;
        }
        for (id, answer) in self.watches.ready(&self.table, self.table_index, self.now_ms) {
            self.reply(id, Ok(Response::Watch(answer)));
        }
    }

    /// The cluster's command level as the next proposal will meet it. A
    /// cluster not founded yet will be by this leader's Bootstrap, which
    /// goes before every request (or by an earlier leader's, still in the
    /// log: then the table decides alike on every replica).
    pub(crate) fn cluster_level(&self) -> u32 {
        match self.table.cluster_id() {
            Some(_) => self.table.level(),
            None => self.table.level().max(self.config.founding.founding_level),
        }
    }
}

/// Whether `key`, with nothing in flight on it, admits the waiting acquire
/// `waiter` now: a plain lock's key is free; a read-write lock or a
/// semaphore has room for it (a shared acquire of another kind goes, to be
/// answered).
pub(crate) fn admits(table: &LockTable, key: &Key, waiter: &Pending) -> bool {
    waiter.commands.iter().all(|command| match command {
        Command::GrantShared { key: wanted, owner, share, .. } if wanted == key => {
            !matches!(table.shared_decision(key.as_bytes(), owner, *share), SharedDecision::Rejected(_))
        }
        _ => table.holder(key.as_bytes()).is_none() && table.shared(key.as_bytes()).is_none(),
    })
}

/// Whether `waiter` asks `key` as a retry of its owner, who holds a place
/// there already: its grant would be Existing.
pub(crate) fn repeats_a_grant(table: &LockTable, key: &Key, waiter: &Pending) -> bool {
    waiter.commands.iter().any(|command| match command {
        Command::GrantShared { key: wanted, owner, share, .. } if wanted == key => {
            matches!(table.shared_decision(key.as_bytes(), owner, *share), SharedDecision::Existing(_))
        }
        Command::Grant { key: wanted, owner, .. } if wanted == key => {
            table.holder(key.as_bytes()).is_some_and(|lock| lock.owner == *owner)
        }
        _ => false,
    })
}

/// The token a turned-away acquire of `key` is told: the plain lock's, or
/// the first holder's of a read-write lock or a semaphore.
pub(crate) fn first_holder(table: &LockTable, key: &Key) -> Option<FencingToken> {
    match table.holder(key.as_bytes()) {
        Some(lock) => Some(lock.token),
        None => table.shared(key.as_bytes()).and_then(fencelock_fsm::Shared::first_token),
    }
}
