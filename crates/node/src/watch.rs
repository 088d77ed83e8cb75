//! Watches: the changes of holders of keys under a prefix, in log order,
//! each with the index of the entry that made it, resumable from an index.
//!
//! Each replica records, as it applies them, the changes a watcher cares
//! about ([`WatchKind`]: a new holder, a holder gone, a lock held back by
//! lock-delay or lifted, a new value proclaimed; not renewals) in a history
//! bounded in bytes. A watch asks for the changes after an index it has
//! seen: answered at once when the history holds some, else parked until
//! one applies or its wait runs out (a long poll). A position older than
//! the history covers is answered `compacted`, with the current holders, so
//! that the watcher starts again from there; so is a watch with no
//! position (its start).
//!
//! Any node answers, from what it applied: log indexes are the same on
//! every node, so a watcher that moves to another node resumes where it
//! was, and a node that is behind parks the watch until it catches up (or
//! answers nothing new, never an index below the one asked).
//!
//! What it owns: the history and the parked watches, by request id. What it
//! does not: answering (the replica turns [`Ready`] answers into replies),
//! connections, clocks (time is an argument).

use std::collections::{BTreeMap, VecDeque};

use fencelock_fsm::LockTable;
use fencelock_types::{FencingToken, Key, Owner, Value};

use crate::registry::ConnId;
use crate::types::{HeldLock, RequestId};
// The vocabulary of watches lives with the rest (`types`), which names
// the answer in its replies.
pub use crate::types::{WatchAnswer, WatchEvent, WatchKind};

/// An event as the history keeps it: its bytes (key, owner, value, one
/// after the other) live in the history's byte ring, from `at` (counted
/// since the history began), so that keeping hundreds of thousands of
/// events costs no allocation each (the allocator's churn of that many
/// long-lived small blocks, freed oldest first, showed in the benchmark).
#[derive(Clone, Copy, Debug)]
struct Stored {
    index: u64,
    kind: WatchKind,
    token: FencingToken,
    at: u64,
    key_len: u16,
    owner_len: u16,
    value_len: u16,
}

impl Stored {
    fn bytes_len(&self) -> usize {
        usize::from(self.key_len) + usize::from(self.owner_len) + usize::from(self.value_len)
    }

    /// What the event costs the history, roughly, in bytes: its bytes
    /// and 64 for the rest.
    fn cost(&self) -> usize {
        self.bytes_len() + 64
    }
}

/// What a watch asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchQuery {
    /// Keys that start with this (empty: every key).
    pub prefix: Vec<u8>,
    /// The changes after this index; `None`: start now, with the current
    /// holders.
    pub after: Option<u64>,
    /// How long to wait for a change when there is none yet (0: answer at
    /// once), on the node's clock.
    pub wait_ms: u64,
    /// At most about this many events per answer (an entry's events are
    /// never split, so a few more may come).
    pub limit: usize,
}

/// A parked watch.
#[derive(Clone, Debug)]
struct Parked {
    conn: ConnId,
    query: WatchQuery,
    until_ms: u64,
    /// The changes up to this index were looked at and none matched: the
    /// next look starts after it, so that a watch parked through much
    /// traffic on other keys does not scan it again each time.
    scanned: u64,
}

/// The history of changes and the parked watches. See the module docs.
#[derive(Debug)]
pub struct Watches {
    history: VecDeque<Stored>,
    /// The bytes of the events in `history`, oldest first.
    bytes: VecDeque<u8>,
    /// Where `bytes` starts, counted since the history began.
    bytes_at: u64,
    history_bytes: usize,
    history_bytes_max: usize,
    /// Every change after this index is in the history.
    covered_after: u64,
    parked: BTreeMap<RequestId, Parked>,
    parked_max: usize,
    /// Parked watches per connection, and their bound: one client cannot
    /// take every place.
    per_conn: BTreeMap<ConnId, usize>,
    per_conn_max: usize,
}

/// Why a watch was refused: too many are parked on the node, or on the
/// connection (`per_connection`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooManyWatches {
    pub max: usize,
    pub per_connection: bool,
}

impl Watches {
    /// An empty history covering everything after `applied` (the index the
    /// node opened at), at most `history_bytes_max` bytes of it, and at
    /// most `parked_max` watches parked at once, `per_conn_max` of them on
    /// one connection.
    pub fn new(applied: u64, history_bytes_max: usize, parked_max: usize, per_conn_max: usize) -> Watches {
        Watches {
            history: VecDeque::new(),
            bytes: VecDeque::new(),
            bytes_at: 0,
            history_bytes: 0,
            history_bytes_max,
            covered_after: applied,
            parked: BTreeMap::new(),
            parked_max,
            per_conn: BTreeMap::new(),
            per_conn_max,
        }
    }

    /// Records a change (applied in log order), dropping the oldest ones
    /// past the bound.
    pub fn record(&mut self, event: WatchEvent) {
        let (key, owner, value) = (event.key.as_bytes(), event.owner.as_bytes(), event.value.as_bytes());
        self.record_parts(event.index, event.kind, event.token, key, owner, value);
    }

    /// [`Watches::record`] from borrowed parts: the history copies the
    /// bytes, so the applying replica need not clone a key, an owner or a
    /// value for it.
    pub fn record_parts(
        &mut self,
        index: u64,
        kind: WatchKind,
        token: FencingToken,
        key: &[u8],
        owner: &[u8],
        value: &[u8],
    ) {
        // Keys, owners and values are far below 64 KiB (1,024, 256 and
        // 4,096 bytes at most); a longer one could not have been decoded.
        let (Ok(key_len), Ok(owner_len), Ok(value_len)) =
            (u16::try_from(key.len()), u16::try_from(owner.len()), u16::try_from(value.len()))
        else {
            return;
        };
        let stored = Stored {
            index,
            kind,
            token,
            at: self.bytes_at + self.bytes.len() as u64,
            key_len,
            owner_len,
            value_len,
        };
        self.bytes.extend(key);
        self.bytes.extend(owner);
        self.bytes.extend(value);
        self.history_bytes += stored.cost();
        self.history.push_back(stored);
        while self.history_bytes > self.history_bytes_max {
            let Some(oldest) = self.history.pop_front() else { break };
            self.bytes.drain(..oldest.bytes_len());
            self.bytes_at += oldest.bytes_len() as u64;
            self.history_bytes -= oldest.cost();
            self.covered_after = self.covered_after.max(oldest.index);
        }
    }

    /// A snapshot replaced the table at `index`: the changes before it are
    /// not known here.
    pub fn reset(&mut self, index: u64) {
        self.history.clear();
        self.bytes_at += self.bytes.len() as u64;
        self.bytes.clear();
        self.history_bytes = 0;
        self.covered_after = index;
    }

    /// The bytes `from` (counted since the history began) on, `len` of them.
    fn stored_bytes(&self, from: u64, len: usize) -> impl Iterator<Item = &u8> + '_ {
        let start = usize::try_from(from - self.bytes_at).unwrap_or(usize::MAX);
        self.bytes.range(start..start + len)
    }

    /// Whether the key of `stored` starts with `prefix`, read in place.
    fn key_starts_with(&self, stored: &Stored, prefix: &[u8]) -> bool {
        prefix.len() <= usize::from(stored.key_len) && self.stored_bytes(stored.at, prefix.len()).eq(prefix)
    }

    /// The event `stored` is, rebuilt from its bytes.
    fn event(&self, stored: &Stored) -> Option<WatchEvent> {
        let (key_len, owner_len) = (usize::from(stored.key_len), usize::from(stored.owner_len));
        let key: Vec<u8> = self.stored_bytes(stored.at, key_len).copied().collect();
        let owner: Vec<u8> = self.stored_bytes(stored.at + key_len as u64, owner_len).copied().collect();
        let value: Vec<u8> = self
            .stored_bytes(stored.at + (key_len + owner_len) as u64, usize::from(stored.value_len))
            .copied()
            .collect();
        Some(WatchEvent {
            index: stored.index,
            key: Key::new(key).ok()?,
            kind: stored.kind,
            token: stored.token,
            owner: Owner::new(owner).ok()?,
            value: Value::new(value).ok()?,
        })
    }

    /// Answers `query` now if there is something to say (or it does not
    /// wait), else parks it as `id` until `now_ms + wait_ms`. `applied` is
    /// the index `table` is applied up to.
    pub fn ask(
        &mut self,
        id: RequestId,
        conn: ConnId,
        query: WatchQuery,
        table: &LockTable,
        applied: u64,
        now_ms: u64,
    ) -> Result<Option<WatchAnswer>, TooManyWatches> {
        let scanned = query.after.unwrap_or(0);
        if let Some(answer) = self.answer(&query, scanned, table, applied, query.wait_ms == 0) {
            return Ok(Some(answer));
        }
        if self.parked.len() >= self.parked_max {
            return Err(TooManyWatches { max: self.parked_max, per_connection: false });
        }
        let on_conn = self.per_conn.entry(conn).or_default();
        if *on_conn >= self.per_conn_max {
            return Err(TooManyWatches { max: self.per_conn_max, per_connection: true });
        }
        *on_conn += 1;
        let until_ms = now_ms.saturating_add(query.wait_ms);
        let scanned = self.last_index().max(scanned);
        self.parked.insert(id, Parked { conn, query, until_ms, scanned });
        Ok(None)
    }

    /// The parked watches that have an answer now (new changes applied, or
    /// their wait ran out at `now_ms`), taken out of the park.
    pub fn ready(&mut self, table: &LockTable, applied: u64, now_ms: u64) -> Vec<(RequestId, WatchAnswer)> {
        let mut answers = Vec::new();
        let last = self.last_index();
        let mut parked = std::mem::take(&mut self.parked);
        let mut left = Vec::new();
        parked.retain(|id, parked| {
            let out_of_time = now_ms >= parked.until_ms;
            match self.answer(&parked.query, parked.scanned, table, applied, out_of_time) {
                Some(answer) => {
                    answers.push((*id, answer));
                    left.push(parked.conn);
                    false
                }
                None => {
                    parked.scanned = parked.scanned.max(last);
                    true
                }
            }
        });
        self.parked = parked;
        for conn in left {
            self.unpark(conn);
        }
        answers
    }

    /// One watch of `conn` left the park.
    fn unpark(&mut self, conn: ConnId) {
        if let Some(count) = self.per_conn.get_mut(&conn) {
            *count -= 1;
            if *count == 0 {
                self.per_conn.remove(&conn);
            }
        }
    }

    /// Forgets parked watch `id` (its connection closed); true if it was
    /// parked.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        match self.parked.remove(&id) {
            Some(parked) => {
                self.unpark(parked.conn);
                true
            }
            None => false,
        }
    }

    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    /// The history's length in events, and its cost in bytes.
    pub fn history_len(&self) -> (usize, usize) {
        (self.history.len(), self.history_bytes)
    }

    /// The index of the newest change recorded (0 without any).
    fn last_index(&self) -> u64 {
        self.history.back().map_or(0, |event| event.index)
    }

    /// The answer to `query` now, looking at the changes after `scanned`
    /// (at least its position), or `None` when there is nothing to say and
    /// `even_empty` is false.
    fn answer(
        &self,
        query: &WatchQuery,
        scanned: u64,
        table: &LockTable,
        applied: u64,
        even_empty: bool,
    ) -> Option<WatchAnswer> {
        let Some(after) = query.after else {
            return Some(current(query, table, applied, false));
        };
        // The changes up to `scanned` were looked at before (none matched):
        // only what came after must still be in the history.
        let from = scanned.max(after);
        if from < self.covered_after {
            return Some(current(query, table, applied, true));
        }
        let mut events = Vec::new();
        // Changes are in index order: skip the ones already looked at.
        let start = self.history.partition_point(|event| event.index <= from);
        for stored in self.history.range(start..) {
            if events.len() >= query.limit.max(1)
                && events.last().is_some_and(|last: &WatchEvent| last.index != stored.index)
            {
                // Full, at an entry's boundary: the rest is for next time.
                let index = events.last().map_or(after, |last: &WatchEvent| last.index);
                return Some(WatchAnswer { events, current: None, compacted: false, index });
            }
            if self.key_starts_with(stored, &query.prefix) {
                events.extend(self.event(stored));
            }
        }
        if events.is_empty() && !even_empty {
            return None;
        }
        Some(WatchAnswer { events, current: None, compacted: false, index: applied.max(after) })
    }
}

/// The holders of the watched keys now, as a watch's starting point.
fn current(query: &WatchQuery, table: &LockTable, applied: u64, compacted: bool) -> WatchAnswer {
    let limit = query.limit.max(1);
    let mut locks: Vec<(Key, HeldLock)> = table
        .list(&query.prefix, limit)
        .map(|(key, lock)| (key.clone(), HeldLock { lock: lock.clone(), remaining_ms: None, share: None }))
        .collect();
    // The holders of read-write locks and semaphores, one entry each (no
    // value), in key order with the plain locks.
    for (key, shared) in table.list_shared(&query.prefix, limit) {
        for (token, holder) in &shared.holders {
            let lock = fencelock_fsm::Lock {
                token: *token,
                owner: holder.owner.clone(),
                lease_ms: holder.lease_ms,
                delayed: holder.delayed,
                value: Value::none(),
                session: holder.session,
            };
            locks.push((key.clone(), HeldLock { lock, remaining_ms: None, share: Some(holder.share) }));
        }
    }
    locks.sort_by(|(a, _), (b, _)| a.cmp(b));
    locks.truncate(limit);
    WatchAnswer { events: Vec::new(), current: Some(locks), compacted, index: applied }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_types::{Command, LeaseMs};

    fn event(index: u64, key: &str, token: u64) -> WatchEvent {
        WatchEvent {
            index,
            key: Key::new(key.as_bytes().to_vec()).unwrap(),
            kind: WatchKind::Granted,
            token: FencingToken::new(token).unwrap(),
            owner: Owner::new(b"o".to_vec()).unwrap(),
            value: Value::none(),
        }
    }

    const C1: ConnId = ConnId(1);

    fn query(prefix: &str, after: Option<u64>, wait_ms: u64) -> WatchQuery {
        WatchQuery { prefix: prefix.as_bytes().to_vec(), after, wait_ms, limit: 100 }
    }

    fn indexes(answer: &WatchAnswer) -> Vec<u64> {
        answer.events.iter().map(|event| event.index).collect()
    }

    #[test]
    fn a_watch_gets_the_changes_after_its_position_under_its_prefix_in_log_order() {
        let table = LockTable::new();
        let mut watches = Watches::new(0, 1 << 20, 10, 10);
        for (index, key) in [(1, "a/1"), (2, "b/1"), (3, "a/2"), (3, "a/3"), (5, "a/1")] {
            watches.record(event(index, key, index));
        }
        let answer = watches.ask(RequestId(1), C1, query("a/", Some(1), 0), &table, 5, 0).unwrap().unwrap();
        assert_eq!(indexes(&answer), [3, 3, 5]);
        assert_eq!(answer.index, 5);
        assert!(!answer.compacted && answer.current.is_none());
        // Nothing after 5 yet: an empty answer that keeps the position.
        let answer = watches.ask(RequestId(2), C1, query("a/", Some(5), 0), &table, 5, 0).unwrap().unwrap();
        assert!(answer.events.is_empty());
        assert_eq!(answer.index, 5);
        // A node behind the asker never answers an index below the asked one.
        let answer = watches.ask(RequestId(3), C1, query("a/", Some(9), 0), &table, 5, 0).unwrap().unwrap();
        assert_eq!(answer.index, 9);
    }

    #[test]
    fn a_full_answer_ends_at_an_entry_boundary_and_the_next_one_resumes_there() {
        let table = LockTable::new();
        let mut watches = Watches::new(0, 1 << 20, 10, 10);
        for (index, key) in [(1, "a"), (2, "b"), (2, "c"), (3, "d")] {
            watches.record(event(index, key, 1));
        }
        let mut ask = query("", Some(0), 0);
        ask.limit = 2;
        let first = watches.ask(RequestId(1), C1, ask.clone(), &table, 3, 0).unwrap().unwrap();
        // The limit falls inside entry 2, which is not split.
        assert_eq!(indexes(&first), [1, 2, 2]);
        assert_eq!(first.index, 2);
        ask.after = Some(first.index);
        let second = watches.ask(RequestId(2), C1, ask, &table, 3, 0).unwrap().unwrap();
        assert_eq!(indexes(&second), [3]);
    }

    #[test]
    fn a_parked_watch_is_answered_by_the_next_change_or_when_its_wait_runs_out() {
        let mut table = LockTable::new();
        let mut watches = Watches::new(0, 1 << 20, 10, 10);
        assert_eq!(watches.ask(RequestId(1), C1, query("a", Some(0), 1_000), &table, 0, 0), Ok(None));
        assert_eq!(watches.ask(RequestId(2), C1, query("b", Some(0), 1_000), &table, 0, 0), Ok(None));
        assert_eq!(watches.parked(), 2);
        // A change elsewhere answers no one.
        watches.record(event(1, "c", 1));
        assert!(watches.ready(&table, 1, 10).is_empty());
        watches.record(event(2, "a", 2));
        let ready = watches.ready(&table, 2, 20);
        assert_eq!(ready.len(), 1);
        assert_eq!(ready[0].0, RequestId(1));
        assert_eq!(indexes(&ready[0].1), [2]);
        // Out of time: answered with nothing new, at the applied index.
        table.apply(Command::Noop);
        let ready = watches.ready(&table, 2, 1_000);
        assert_eq!(ready, [(RequestId(2), WatchAnswer { index: 2, ..WatchAnswer::default() })]);
        assert_eq!(watches.parked(), 0);
    }

    #[test]
    fn watches_past_the_bound_are_refused_and_cancelled_ones_leave() {
        let table = LockTable::new();
        let mut watches = Watches::new(0, 1 << 20, 2, 10);
        assert_eq!(watches.ask(RequestId(1), C1, query("", Some(0), 1_000), &table, 0, 0), Ok(None));
        assert_eq!(watches.ask(RequestId(2), C1, query("", Some(0), 1_000), &table, 0, 0), Ok(None));
        assert_eq!(
            watches.ask(RequestId(3), C1, query("", Some(0), 1_000), &table, 0, 0),
            Err(TooManyWatches { max: 2, per_connection: false })
        );
        assert!(watches.cancel(RequestId(1)));
        assert!(!watches.cancel(RequestId(1)));
        assert_eq!(watches.ask(RequestId(3), C1, query("", Some(0), 1_000), &table, 0, 0), Ok(None));
        // A watch that does not wait is answered even at the bound.
        assert!(watches.ask(RequestId(4), C1, query("", Some(0), 0), &table, 0, 0).unwrap().is_some());
    }

    #[test]
    fn one_connection_parks_at_most_its_share() {
        let table = LockTable::new();
        let mut watches = Watches::new(0, 1 << 20, 10, 2);
        let (c1, c2) = (ConnId(1), ConnId(2));
        assert_eq!(watches.ask(RequestId(1), c1, query("", Some(0), 1_000), &table, 0, 0), Ok(None));
        assert_eq!(watches.ask(RequestId(2), c1, query("", Some(0), 1_000), &table, 0, 0), Ok(None));
        assert_eq!(
            watches.ask(RequestId(3), c1, query("", Some(0), 1_000), &table, 0, 0),
            Err(TooManyWatches { max: 2, per_connection: true })
        );
        // Another connection still has its places.
        assert_eq!(watches.ask(RequestId(4), c2, query("", Some(0), 1_000), &table, 0, 0), Ok(None));
        // Answered watches give their places back.
        watches.record(event(1, "k", 1));
        assert_eq!(watches.ready(&table, 1, 10).len(), 3);
        assert_eq!(watches.ask(RequestId(5), c1, query("", Some(1), 1_000), &table, 1, 10), Ok(None));
        assert!(watches.cancel(RequestId(5)));
        assert_eq!(watches.ask(RequestId(6), c1, query("", Some(1), 1_000), &table, 1, 10), Ok(None));
        assert_eq!(watches.ask(RequestId(7), c1, query("", Some(1), 1_000), &table, 1, 10), Ok(None));
    }

    #[test]
    fn a_position_older_than_the_history_is_answered_compacted_with_the_current_holders() {
        let mut table = LockTable::new();
        let grant = |k: &str| Command::Grant {
            session: None,
            key: Key::new(k.as_bytes().to_vec()).unwrap(),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            owner: Owner::new(b"o".to_vec()).unwrap(),
            value: Value::new(b"v".to_vec()).unwrap(),
        };
        table.apply(grant("a/1"));
        table.apply(grant("b/1"));
        // Room for about two events.
        // Its key, owner and value (3 + 1 + 0 bytes), and 64 for the rest.
        let one = 3 + 1 + 64;
        let mut watches = Watches::new(0, 2 * one, 10, 10);
        for index in 1..=5 {
            watches.record(event(index, "a/1", index));
        }
        assert_eq!(watches.history_len().0, 2);
        let answer = watches.ask(RequestId(1), C1, query("a/", Some(1), 0), &table, 5, 0).unwrap().unwrap();
        assert!(answer.compacted);
        assert_eq!(answer.index, 5);
        let current = answer.current.unwrap();
        assert_eq!(current.len(), 1);
        assert_eq!(current[0].0.as_bytes(), b"a/1");
        assert_eq!(current[0].1.lock.value.as_bytes(), b"v");
        // Within the history: the events.
        let answer = watches.ask(RequestId(2), C1, query("a/", Some(3), 0), &table, 5, 0).unwrap().unwrap();
        assert_eq!(indexes(&answer), [4, 5]);
        // A start (no position) gets the current holders, not compacted.
        let answer = watches.ask(RequestId(3), C1, query("a/", None, 0), &table, 5, 0).unwrap().unwrap();
        assert!(!answer.compacted && answer.current.is_some());
        // A snapshot install forgets everything before it.
        watches.reset(9);
        let answer = watches.ask(RequestId(4), C1, query("a/", Some(5), 0), &table, 9, 0).unwrap().unwrap();
        assert!(answer.compacted);
    }

    #[test]
    fn events_come_back_byte_for_byte_through_evictions_and_resets() {
        let table = LockTable::new();
        let made = |index: u64| WatchEvent {
            index,
            key: Key::new(format!("k/{}", "x".repeat(index as usize % 40)).into_bytes()).unwrap(),
            kind: if index.is_multiple_of(2) { WatchKind::Granted } else { WatchKind::Proclaimed },
            token: FencingToken::new(index).unwrap(),
            owner: Owner::new(format!("owner-{index}").into_bytes()).unwrap(),
            value: Value::new(vec![index as u8; index as usize % 7]).unwrap(),
        };
        // Room for a few dozen events: most are evicted as more come.
        let mut watches = Watches::new(0, 4_000, 10, 10);
        for round in 0..3u64 {
            let first = round * 1_000 + 1;
            for index in first..first + 500 {
                watches.record(made(index));
            }
            let (kept, _) = watches.history_len();
            assert!(kept > 10 && kept < 100, "{kept}");
            let from = first + 499 - kept as u64;
            let mut ask = query("k/", Some(from), 0);
            ask.limit = 1_000;
            let answer = watches.ask(RequestId(round), C1, ask, &table, first + 499, 0).unwrap().unwrap();
            let expected: Vec<WatchEvent> = (from + 1..first + 500).map(made).collect();
            assert_eq!(answer.events, expected);
            // A prefix longer than some keys matches only the longer ones.
            let long = format!("k/{}", "x".repeat(30));
            let answer =
                watches.ask(RequestId(10 + round), C1, query(&long, Some(from), 0), &table, first + 499, 0);
            let answer = answer.unwrap().unwrap();
            assert!(answer.events.iter().all(|event| event.key.as_bytes().len() >= long.len()));
            assert_eq!(
                answer.events,
                expected
                    .iter()
                    .filter(|e| e.key.as_bytes().starts_with(long.as_bytes()))
                    .cloned()
                    .collect::<Vec<_>>()
            );
            watches.reset(first + 999);
        }
    }
}
