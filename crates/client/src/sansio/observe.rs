//! An election observer's fold, sans IO: a watch's answers on an
//! election's key in, each change of leader (or of its value) out, once,
//! in log order. Both clients' observers run it over their own watches.

use std::collections::VecDeque;

use serde::Serialize;

use crate::types::{LockInfo, WatchBatch, WatchEvent, WatchEventKind};

/// An election's leader: the holder of its key, with the value it
/// campaigned with or last proclaimed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Leader {
    /// The leader's fencing token.
    pub token: u64,
    #[serde(serialize_with = "crate::types::lossy_utf8")]
    pub owner: Vec<u8>,
    #[serde(serialize_with = "crate::types::lossy_utf8")]
    pub value: Vec<u8>,
}

/// A change of an election's leader, as an [`Observer`] tells it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeaderChange {
    /// The leader from now on; `None`: no one leads.
    pub leader: Option<Leader>,
    /// The log index of the change (for the first, the index the current
    /// state was read at).
    pub index: u64,
}

/// What an observer has told, and the changes it has still to tell.
#[derive(Debug)]
pub struct ObserverState {
    key: Vec<u8>,
    /// The state last told: `None` before the first.
    told: Option<Option<Leader>>,
    queue: VecDeque<LeaderChange>,
}

impl ObserverState {
    /// An observer of the election `key` (a watch of prefix `key`: the
    /// fold skips the other keys under it).
    pub fn new(key: Vec<u8>) -> ObserverState {
        ObserverState { key, told: None, queue: VecDeque::new() }
    }

    /// The next change to tell, if any.
    pub fn pop(&mut self) -> Option<LeaderChange> {
        self.queue.pop_front()
    }

    /// Whether the first state (who led at the start) has been told.
    pub fn has_told(&self) -> bool {
        self.told.is_some()
    }

    /// Takes a watch's answer: the changes of this election it holds.
    pub fn take(&mut self, batch: WatchBatch) {
        if let Some(current) = &batch.current {
            let leader = current.iter().find(|info| info.key == self.key).and_then(leader_of);
            self.tell(leader, batch.index);
        }
        let key = std::mem::take(&mut self.key);
        for event in batch.events.iter().filter(|event| event.key == key) {
            let leader = match event.kind {
                WatchEventKind::Granted | WatchEventKind::Proclaimed => Some(leader_from(event)),
                kind if kind.frees() => None,
                _ => continue,
            };
            self.tell(leader, event.index);
        }
        self.key = key;
    }

    fn tell(&mut self, leader: Option<Leader>, index: u64) {
        if self.told.as_ref() == Some(&leader) {
            return;
        }
        self.told = Some(leader.clone());
        self.queue.push_back(LeaderChange { leader, index });
    }
}

fn leader_of(info: &LockInfo) -> Option<Leader> {
    (!info.delayed).then(|| Leader {
        token: info.token,
        owner: info.owner.clone(),
        value: info.value.clone(),
    })
}

fn leader_from(event: &WatchEvent) -> Leader {
    Leader { token: event.token, owner: event.owner.clone(), value: event.value.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(index: u64, key: &str, kind: WatchEventKind, token: u64, value: &str) -> WatchEvent {
        WatchEvent {
            index,
            key: key.as_bytes().to_vec(),
            kind,
            token,
            owner: b"o".to_vec(),
            value: value.as_bytes().to_vec(),
        }
    }

    fn observer() -> ObserverState {
        ObserverState::new(b"e".to_vec())
    }

    fn leader(token: u64, value: &str) -> Option<Leader> {
        Some(Leader { token, owner: b"o".to_vec(), value: value.as_bytes().to_vec() })
    }

    #[test]
    fn an_observer_tells_each_new_leader_and_value_of_its_key_once() {
        let mut observer = observer();
        let current = LockInfo {
            key: b"e".to_vec(),
            token: 3,
            owner: b"o".to_vec(),
            lease_ms: 1_000,
            remaining_ms: 0,
            delayed: false,
            value: b"a".to_vec(),
            share: crate::types::ShareKind::Exclusive,
            permits: 0,
            session: None,
        };
        observer.take(WatchBatch {
            events: vec![],
            index: 10,
            current: Some(vec![current]),
            compacted: false,
        });
        observer.take(WatchBatch {
            events: vec![
                // Another key under the prefix: not this election.
                event(11, "e2", WatchEventKind::Granted, 4, "x"),
                event(12, "e", WatchEventKind::Proclaimed, 3, "b"),
                event(13, "e", WatchEventKind::Expired, 3, "b"),
                event(14, "e", WatchEventKind::DelayLifted, 3, "b"),
                event(15, "e", WatchEventKind::Granted, 5, "c"),
            ],
            index: 15,
            current: None,
            compacted: false,
        });
        let told: Vec<_> = observer.queue.drain(..).collect();
        assert_eq!(
            told,
            [
                LeaderChange { leader: leader(3, "a"), index: 10 },
                LeaderChange { leader: leader(3, "b"), index: 12 },
                LeaderChange { leader: None, index: 13 },
                LeaderChange { leader: leader(5, "c"), index: 15 },
            ]
        );
        // A compacted answer that says what was already told adds nothing.
        let current = LockInfo {
            key: b"e".to_vec(),
            token: 5,
            owner: b"o".to_vec(),
            lease_ms: 1_000,
            remaining_ms: 0,
            delayed: false,
            value: b"c".to_vec(),
            share: crate::types::ShareKind::Exclusive,
            permits: 0,
            session: None,
        };
        observer.take(WatchBatch {
            events: vec![],
            index: 20,
            current: Some(vec![current]),
            compacted: true,
        });
        assert!(observer.queue.is_empty());
    }
}
