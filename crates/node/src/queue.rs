//! The leader's requests in order: per key, at most one in flight, in the
//! order they were accepted; acquires that wait for a held key, FIFO per
//! key; the leader's own Expires by key.
//!
//! It owns the order, not the decisions: whether a key is free is asked of
//! the caller (the replica's applied table), and what a request's commands
//! do is the replica's business. Testable without raft.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use ahash::RandomState;

use fencelock_types::{Command, FencingToken, Key};

use crate::types::RequestId;

/// Whether a key with nothing in flight admits a waiting acquire now: the
/// caller's answer, from its applied table.
pub(crate) type Admits<'a> = dyn Fn(&Key, &Pending) -> bool + 'a;

/// A request the leader accepted and has not answered yet.
#[derive(Debug)]
pub(crate) struct Pending {
    /// Taken when the request is proposed.
    pub commands: Vec<Command>,
    /// The distinct keys it touches, in order.
    pub keys: Vec<Key>,
    /// The term it was proposed in, once proposed.
    pub proposed_term: Option<u64>,
    /// Proposed by the leader itself (an Expire, a ghost Release): no reply.
    pub internal: bool,
    /// For a ghost Release: the index of the grant it undoes.
    pub ghost_of: Option<u64>,
    /// For a waiting acquire: until when, on this node's clock, it may wait.
    pub wait_until_ms: Option<u64>,
    /// Whether it sits among the requests ready to propose.
    queued: bool,
    /// A waiter handed its key (it headed the waiters when the key could
    /// take it): it goes before the waiters behind it, never back behind
    /// them.
    pub admitted: bool,
    /// Whether it is an acquire of a client (it carries a Grant).
    acquire: bool,
    /// The locks its proposal will add if it applies, counted against the
    /// quotas while it is in flight: per Grant, the owner's identity, and
    /// whether the table gains a lock (false when it takes over a lock the
    /// same entry frees).
    pub(crate) new_locks: Vec<(Vec<u8>, bool)>,
}

impl Pending {
    pub fn new(
        commands: Vec<Command>,
        internal: bool,
        ghost_of: Option<u64>,
        wait_until_ms: Option<u64>,
    ) -> Pending {
        let mut keys: Vec<Key> = commands.iter().filter_map(Command::key).cloned().collect();
        keys.sort();
        keys.dedup();
        let acquire = !internal
            && commands
                .iter()
                .any(|command| matches!(command, Command::Grant { .. } | Command::GrantShared { .. }));
        Pending {
            commands,
            keys,
            proposed_term: None,
            internal,
            ghost_of,
            wait_until_ms,
            queued: false,
            admitted: false,
            acquire,
            new_locks: Vec::new(),
        }
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Requests {
    /// By id; walked only in id order (see [`Requests::clear`]).
    pending: HashMap<RequestId, Pending, RandomState>,
    /// Per key, the requests that touch it, in acceptance order. The head is
    /// the one in flight (or next to go). A request answered before its
    /// turn is not searched for: it stays, stale, until it would head the
    /// queue, and is skipped then (no longer pending), so that a burst of
    /// requests on one key costs each O(1), not a scan of the queue. A head
    /// is never stale.
    key_queues: HashMap<Key, VecDeque<RequestId>, RandomState>,
    /// Requests at the head of all their keys' queues, not yet proposed. One
    /// answered meanwhile stays, stale, and is skipped when popped.
    ready: VecDeque<RequestId>,
    /// Acquires waiting for a held key, FIFO per key: pending, in no key
    /// queue until they are handed the key.
    waiters: HashMap<Key, VecDeque<RequestId>, RandomState>,
    /// Keys with an Expire of the leader's own pending, and its request.
    expiring: HashMap<Key, RequestId, RandomState>,
    /// The waiters by deadline, with the key each waits for: a turn looks
    /// only at those whose time is up.
    deadlines: BTreeMap<(u64, RequestId), Key>,
    /// How many pending requests are the leader's own, and client acquires.
    internal: usize,
    acquires: usize,
    /// The locks proposed and not yet answered would add: in all, and per
    /// owner identity (see [`Pending::new_locks`]).
    new_locks: usize,
    new_locks_of: HashMap<Vec<u8>, usize, RandomState>,
}

impl Requests {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Client requests pending (acquires, releases, renewals, ...).
    pub fn clients(&self) -> usize {
        self.pending.len() - self.internal
    }

    /// Client acquires pending, waiting ones included.
    pub fn acquires(&self) -> usize {
        self.acquires
    }

    /// The leader's own requests pending (Expires, ghost Releases).
    pub fn internal(&self) -> usize {
        self.internal
    }

    /// Acquires waiting for `key`.
    pub fn waiters_of(&self, key: &Key) -> usize {
        self.waiters.get(key).map_or(0, VecDeque::len)
    }

    /// Locks that requests in flight will add to the table if they apply.
    pub fn new_locks(&self) -> usize {
        self.new_locks
    }

    /// Locks of owners of `identity` that requests in flight will add.
    pub fn new_locks_of(&self, identity: &[u8]) -> usize {
        self.new_locks_of.get(identity).copied().unwrap_or(0)
    }

    /// Counts `new_locks` against the quotas while `id` is in flight.
    pub fn count_new_locks(&mut self, id: RequestId, new_locks: Vec<(Vec<u8>, bool)>) {
        for (identity, adds) in &new_locks {
            self.new_locks += usize::from(*adds);
            *self.new_locks_of.entry(identity.clone()).or_default() += 1;
        }
        if let Some(pending) = self.pending.get_mut(&id) {
            pending.new_locks.extend(new_locks);
        }
    }

    fn uncount(&mut self, pending: &Pending) {
        self.internal -= usize::from(pending.internal);
        self.acquires -= usize::from(pending.acquire);
        for (identity, adds) in &pending.new_locks {
            self.new_locks -= usize::from(*adds);
            if let Some(count) = self.new_locks_of.get_mut(identity) {
                *count -= 1;
                if *count == 0 {
                    self.new_locks_of.remove(identity);
                }
            }
        }
    }

    pub fn get(&self, id: RequestId) -> Option<&Pending> {
        self.pending.get(&id)
    }

    /// For the leader's own requests, whose commands it may prune before
    /// they go (Expires no longer due). Not for a client's request: its
    /// answer must match what it asked.
    pub fn get_mut(&mut self, id: RequestId) -> Option<&mut Pending> {
        self.pending.get_mut(&id).filter(|pending| pending.internal)
    }

    /// Whether an Expire of the leader's own is pending on `key`.
    pub fn is_expiring(&self, key: &Key) -> bool {
        self.expiring.contains_key(key)
    }

    /// Accepts `id` behind everything already queued on its keys.
    pub fn insert(&mut self, id: RequestId, pending: Pending) {
        for key in &pending.keys {
            self.key_queues.entry(key.clone()).or_default().push_back(id);
        }
        // The leader's Expires: one or more holders of one key.
        if let (true, [key], Some(Command::Expire { .. })) =
            (pending.internal, pending.keys.as_slice(), pending.commands.first())
        {
            self.expiring.insert(key.clone(), id);
        }
        self.internal += usize::from(pending.internal);
        self.acquires += usize::from(pending.acquire);
        if let Some(replaced) = self.pending.insert(id, pending) {
            // Ids are unique; should one come twice, the counts stay true.
            self.uncount(&replaced);
        }
        self.queue_if_ready(id);
    }

    /// Like [`RequestQueue::insert`], for a request that touches no key
    /// and must be proposed before every request ready now (the founding
    /// entry: no grant may take a token below its floor).
    pub fn insert_first(&mut self, id: RequestId, pending: Pending) {
        debug_assert!(pending.keys.is_empty(), "a request that goes first touches no key");
        self.insert(id, pending);
        if let Some(at) = self.ready.iter().position(|ready| *ready == id) {
            self.ready.remove(at);
            self.ready.push_front(id);
        }
    }

    /// The next request ready to propose: it heads every key it touches.
    pub fn pop_ready(&mut self) -> Option<RequestId> {
        loop {
            let id = self.ready.pop_front()?;
            // Answered since it was queued: stale.
            let Some(pending) = self.pending.get_mut(&id).filter(|pending| pending.queued) else { continue };
            pending.queued = false;
            return Some(id);
        }
    }

    pub fn has_ready(&self) -> bool {
        // Stale entries count: a turn that finds only them does nothing.
        !self.ready.is_empty()
    }

    /// `id` is proposed in `term`: its commands go, it stays in flight.
    pub fn propose(&mut self, id: RequestId, term: u64) -> Vec<Command> {
        let pending = self.pending.get_mut(&id).expect("a request going into a batch is pending");
        pending.queued = false;
        pending.proposed_term = Some(term);
        std::mem::take(&mut pending.commands)
    }

    /// Forgets `id` (answered) and lets the next request on each of its keys
    /// go; a key with nothing in flight goes to its first waiter if the
    /// key admits it now (`admits`: a free key, or a read-write lock or
    /// semaphore with room for it).
    pub fn remove(&mut self, id: RequestId, is_free: &Admits<'_>) -> Option<Pending> {
        let pending = self.pending.remove(&id)?;
        self.uncount(&pending);
        if pending.internal {
            self.expiring.retain(|_, expire| *expire != id);
        }
        if let Some(until_ms) = pending.wait_until_ms {
            self.deadlines.remove(&(until_ms, id));
        }
        // If it was ready, its entry there is stale now (see `ready`).
        for key in &pending.keys {
            if let Some(queue) = self.waiters.get_mut(key) {
                queue.retain(|waiter| *waiter != id);
                if queue.is_empty() {
                    self.waiters.remove(key);
                }
            }
        }
        self.leave_key_queues(id, &pending.keys, is_free);
        Some(pending)
    }

    /// `id`, an acquire that met `key` held by another owner, waits for it:
    /// out of the key queues (the next request goes), last among the key's
    /// waiters.
    pub fn wait_for(&mut self, id: RequestId, key: Key, is_free: &Admits<'_>) {
        let (keys, until_ms) = self
            .pending
            .get_mut(&id)
            .map(|pending| {
                // Turned away again: back in line like any other waiter.
                pending.admitted = false;
                (pending.keys.clone(), pending.wait_until_ms)
            })
            .unwrap_or_default();
        self.leave_key_queues(id, &keys, is_free);
        // A request without a deadline is timed out at once.
        self.deadlines.insert((until_ms.unwrap_or(0), id), key.clone());
        self.waiters.entry(key).or_default().push_back(id);
    }

    /// Hands `key`, which request `freeing` (in flight) will free, to its
    /// first waiter, queued right behind `freeing`: the waiter's Grant can
    /// go in the same entry.
    pub fn hand_over(&mut self, key: &Key, freeing: RequestId) -> Option<RequestId> {
        let waiter = self.pop_waiter(key)?;
        if let Some(queue) = self.key_queues.get_mut(key) {
            let at = queue.iter().position(|queued| *queued == freeing).map_or(queue.len(), |at| at + 1);
            queue.insert(at, waiter);
        }
        Some(waiter)
    }

    /// The waiters whose time ran out at `now_ms`, taken out of the waiters
    /// (still pending: the caller answers and removes them).
    pub fn timed_out(&mut self, now_ms: u64) -> Vec<(Key, RequestId)> {
        let mut timed_out = Vec::new();
        while let Some(entry) = self.deadlines.first_entry() {
            if entry.key().0 > now_ms {
                break;
            }
            let ((_, id), key) = entry.remove_entry();
            if let Some(queue) = self.waiters.get_mut(&key) {
                queue.retain(|waiter| *waiter != id);
                if queue.is_empty() {
                    self.waiters.remove(&key);
                }
            }
            timed_out.push((key, id));
        }
        timed_out
    }

    /// Every pending request, taken; the queues are emptied.
    pub fn clear(&mut self) -> BTreeMap<RequestId, Pending> {
        self.key_queues.clear();
        self.ready.clear();
        self.waiters.clear();
        self.expiring.clear();
        self.deadlines.clear();
        self.internal = 0;
        self.acquires = 0;
        self.new_locks = 0;
        self.new_locks_of.clear();
        std::mem::take(&mut self.pending).into_iter().collect()
    }

    fn queue_if_ready(&mut self, id: RequestId) {
        let Some(pending) = self.pending.get(&id) else { return };
        if pending.queued || pending.proposed_term.is_some() {
            return;
        }
        let heads_all =
            pending.keys.iter().all(|key| self.key_queues.get(key).and_then(VecDeque::front) == Some(&id));
        if heads_all {
            if let Some(pending) = self.pending.get_mut(&id) {
                pending.queued = true;
            }
            self.ready.push_back(id);
        }
    }

    fn leave_key_queues(&mut self, id: RequestId, keys: &[Key], is_free: &Admits<'_>) {
        let mut next = Vec::new();
        for key in keys {
            let Some(queue) = self.key_queues.get_mut(key) else { continue };
            if queue.front() != Some(&id) {
                // Behind the head: left stale (see `key_queues`).
                continue;
            }
            queue.pop_front();
            while queue.front().is_some_and(|head| !self.pending.contains_key(head)) {
                queue.pop_front();
            }
            match queue.front() {
                Some(head) => next.push(*head),
                None => {
                    self.key_queues.remove(key);
                    next.extend(self.admit_first_waiter(key, is_free));
                }
            }
        }
        for head in next {
            self.queue_if_ready(head);
        }
    }

    /// Whether request `id` is pending.
    pub fn contains(&self, id: RequestId) -> bool {
        self.pending.contains_key(&id)
    }

    /// `key` was freed by what no request of its queue did (a session's
    /// end): with nothing in flight on it, it goes to its first waiter if
    /// it admits it now.
    pub fn wake(&mut self, key: &Key, is_free: &Admits<'_>) {
        if self.key_queues.contains_key(key) {
            // What is in flight or queued on it hands it on when answered.
            return;
        }
        if let Some(waiter) = self.admit_first_waiter(key, is_free) {
            self.queue_if_ready(waiter);
        }
    }

    /// Puts the first waiter for `key`, which has nothing queued, in the
    /// key's queue if the key admits it now; returns it then.
    fn admit_first_waiter(&mut self, key: &Key, is_free: &Admits<'_>) -> Option<RequestId> {
        let admitted = self
            .first_waiter(key)
            .and_then(|waiter| self.pending.get(&waiter))
            .is_some_and(|waiter| is_free(key, waiter));
        if !admitted {
            return None;
        }
        let waiter = self.pop_waiter(key)?;
        self.key_queues.entry(key.clone()).or_default().push_back(waiter);
        Some(waiter)
    }

    /// The acquires under `session` not proposed yet (waiting, or queued),
    /// in id order.
    pub fn waiting_in_session(&self, session: FencingToken) -> Vec<RequestId> {
        self.pending
            .iter()
            .filter(|(_, pending)| pending.proposed_term.is_none())
            .filter(|(_, pending)| {
                pending.commands.iter().any(|command| match command {
                    Command::Grant { session: Some(of), .. }
                    | Command::GrantShared { session: Some(of), .. } => *of == session,
                    _ => false,
                })
            })
            .map(|(id, _)| *id)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// The first acquire waiting for `key`.
    pub fn first_waiter(&self, key: &Key) -> Option<RequestId> {
        self.waiters.get(key).and_then(|queue| queue.front().copied())
    }

    fn pop_waiter(&mut self, key: &Key) -> Option<RequestId> {
        let queue = self.waiters.get_mut(key)?;
        let waiter = queue.pop_front();
        if queue.is_empty() {
            self.waiters.remove(key);
        }
        if let Some(id) = waiter {
            if let Some(pending) = self.pending.get_mut(&id) {
                pending.admitted = true;
            }
            let until_ms = self.pending.get(&id).and_then(|pending| pending.wait_until_ms);
            self.deadlines.remove(&(until_ms.unwrap_or(0), id));
        }
        waiter
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use fencelock_types::{FencingToken, LeaseMs, Owner};

    use super::*;

    fn key(name: &str) -> Key {
        Key::new(name.as_bytes().to_vec()).unwrap()
    }

    fn grant(name: &str) -> Command {
        Command::Grant {
            session: None,
            key: key(name),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            owner: Owner::new(b"o".to_vec()).unwrap(),
            value: fencelock_types::Value::none(),
        }
    }

    fn release(name: &str) -> Command {
        Command::Release { key: key(name), token: FencingToken::new(1), user: None }
    }

    fn free(_: &Key, _: &Pending) -> bool {
        true
    }

    fn held(_: &Key, _: &Pending) -> bool {
        false
    }

    #[test]
    fn one_request_per_key_in_flight_in_acceptance_order() {
        let mut requests = Requests::default();
        for n in 1..=3 {
            requests.insert(RequestId(n), Pending::new(vec![grant("a")], false, None, None));
        }
        requests.insert(RequestId(4), Pending::new(vec![grant("b")], false, None, None));
        assert_eq!(requests.pop_ready(), Some(RequestId(1)));
        assert_eq!(requests.pop_ready(), Some(RequestId(4)));
        assert_eq!(requests.pop_ready(), None, "a second request on a went ahead");
        requests.propose(RequestId(1), 1);
        requests.remove(RequestId(1), &free);
        assert_eq!(requests.pop_ready(), Some(RequestId(2)));
        assert_eq!(requests.pop_ready(), None);
    }

    #[test]
    fn a_request_on_two_keys_waits_to_head_both() {
        let mut requests = Requests::default();
        requests.insert(RequestId(1), Pending::new(vec![grant("a")], false, None, None));
        requests.insert(RequestId(2), Pending::new(vec![release("a"), release("b")], false, None, None));
        requests.insert(RequestId(3), Pending::new(vec![grant("b")], false, None, None));
        assert_eq!(requests.pop_ready(), Some(RequestId(1)));
        assert_eq!(requests.pop_ready(), None, "2 went ahead of 1 on a, or 3 ahead of 2 on b");
        requests.remove(RequestId(1), &free);
        assert_eq!(requests.pop_ready(), Some(RequestId(2)));
        requests.remove(RequestId(2), &free);
        assert_eq!(requests.pop_ready(), Some(RequestId(3)));
    }

    #[test]
    fn waiters_get_a_freed_key_in_order_and_time_out() {
        let mut requests = Requests::default();
        for n in 1..=3 {
            requests.insert(RequestId(n), Pending::new(vec![grant("a")], false, None, Some(100 * n)));
            assert_eq!(requests.pop_ready(), Some(RequestId(n)));
            // Held by someone else: it waits, and the next may go.
            requests.wait_for(RequestId(n), key("a"), &held);
        }
        assert_eq!(requests.timed_out(150).iter().map(|(_, id)| *id).collect::<Vec<_>>(), vec![RequestId(1)]);
        requests.remove(RequestId(1), &held);
        // The holder releases: the key goes to the first waiter left.
        requests.insert(RequestId(9), Pending::new(vec![release("a")], false, None, None));
        assert_eq!(requests.pop_ready(), Some(RequestId(9)));
        assert_eq!(requests.hand_over(&key("a"), RequestId(9)), Some(RequestId(2)));
        requests.propose(RequestId(9), 1);
        requests.propose(RequestId(2), 1);
        requests.remove(RequestId(9), &held);
        requests.remove(RequestId(2), &held);
        assert_eq!(requests.pop_ready(), None, "3 got a key that is held");
        assert_eq!(requests.len(), 1);
        // Freed with nothing in flight: the last waiter is queued.
        requests.insert(RequestId(10), Pending::new(vec![release("a")], false, None, None));
        assert_eq!(requests.pop_ready(), Some(RequestId(10)));
        requests.remove(RequestId(10), &free);
        assert_eq!(requests.pop_ready(), Some(RequestId(3)));
    }

    #[test]
    fn a_removed_request_leaves_no_trace_and_lets_the_next_go() {
        let mut requests = Requests::default();
        requests.insert(RequestId(1), Pending::new(vec![grant("a")], false, None, None));
        requests.insert(RequestId(2), Pending::new(vec![grant("a")], false, None, None));
        // Cancelled before it was proposed, while ready.
        assert!(requests.remove(RequestId(1), &free).is_some());
        assert_eq!(requests.pop_ready(), Some(RequestId(2)));
        assert_eq!(requests.pop_ready(), None);
        requests.remove(RequestId(2), &free);
        assert_eq!(requests.len(), 0);
        assert!(requests.key_queues.is_empty() && requests.ready.is_empty() && requests.waiters.is_empty());
    }

    #[test]
    fn a_burst_on_one_key_answered_out_of_order_costs_no_scans_and_keeps_the_order() {
        let mut requests = Requests::default();
        let n = 20_000u64;
        for id in 1..=n {
            requests.insert(RequestId(id), Pending::new(vec![grant("hot")], false, None, None));
        }
        // Every other one is cancelled from the back: each leaves a stale
        // entry behind the head instead of scanning the queue.
        for id in (2..=n).rev().step_by(2) {
            assert!(requests.remove(RequestId(id), &free).is_some());
        }
        // The rest go in order, one at a time, skipping the stale ones.
        let mut gone = Vec::new();
        while let Some(id) = requests.pop_ready() {
            assert_eq!(requests.pop_ready(), None, "two requests on one key at once");
            requests.propose(id, 1);
            requests.remove(id, &free);
            gone.push(id.0);
        }
        assert_eq!(gone, (1..=n).step_by(2).collect::<Vec<_>>());
        assert_eq!(requests.len(), 0);
        assert!(requests.key_queues.is_empty() && requests.ready.is_empty());
    }

    #[test]
    fn the_leaders_own_expires_are_known_by_key_until_answered() {
        let mut requests = Requests::default();
        let expire = Command::Expire { key: key("a"), token: FencingToken::new(1).unwrap(), delay: None };
        requests.insert(RequestId(7), Pending::new(vec![expire], true, None, None));
        assert!(requests.is_expiring(&key("a")));
        requests.remove(RequestId(7), &free);
        assert!(!requests.is_expiring(&key("a")));
    }
}
