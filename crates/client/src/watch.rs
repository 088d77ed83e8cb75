//! Watches and election observers on the blocking client.
//!
//! A [`Watch`] follows the changes of holders of the keys under a prefix,
//! in log order, by asking any node for the changes after the last index it
//! was told (a long poll, `WatchRequest`). It resumes where it was after a
//! reconnect or on another node; a position a node no longer holds comes
//! back `compacted`, with the current holders. An [`Observer`] follows one
//! election (one key) on a watch, and tells each new leader and value.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;

use crate::client::Client;
use crate::sansio::calls;
use crate::types::{LockInfo, WatchBatch, WatchEvent, WatchEventKind};
use crate::ClientError;

/// Follows the holders of the keys under a prefix. See the module docs.
#[derive(Debug)]
pub struct Watch {
    client: Client,
    prefix: Vec<u8>,
    /// The index up to which every change has been told; `None` before the
    /// first answer (which brings the current holders).
    position: Option<u64>,
    limit: u32,
}

impl Watch {
    pub(crate) fn new(client: Client, prefix: Vec<u8>, position: Option<u64>) -> Watch {
        Watch { client, prefix, position, limit: 0 }
    }

    /// The index up to which every change has been told (a position to
    /// resume from with [`Client::watch_from`]); `None` before the first
    /// answer.
    pub fn position(&self) -> Option<u64> {
        self.position
    }

    /// Waits up to `wait` (at most 60 s) for changes, and returns them;
    /// the first call, and the first after a compacted position, also
    /// brings the current holders (`current`). An empty batch: nothing
    /// changed within `wait`. Retries across nodes like every call.
    pub fn next(&mut self, wait: Duration) -> Result<WatchBatch, ClientError> {
        let after = self.position;
        // The first answer (no position) comes at once, with the holders.
        let wait = if after.is_none() { Duration::ZERO } else { wait };
        let inner = &self.client.inner;
        let request = calls::watch(&self.prefix, after, wait, self.limit);
        let timeout = wait + inner.request_timeout;
        let (kind, _) = inner.call(|| (request.clone(), timeout), inner.retry_for + wait)?;
        let batch = calls::watch_answer(kind, after)?;
        self.position = Some(batch.index);
        Ok(batch)
    }
}

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

/// Follows one election: each new leader, and each new value it
/// proclaims, in log order. See the module docs.
#[derive(Debug)]
pub struct Observer {
    watch: Watch,
    key: Vec<u8>,
    /// The state last told: `None` before the first.
    told: Option<Option<Leader>>,
    queue: VecDeque<LeaderChange>,
}

impl Observer {
    pub(crate) fn new(watch: Watch, key: Vec<u8>) -> Observer {
        Observer { watch, key, told: None, queue: VecDeque::new() }
    }

    /// Waits up to `wait` for the leader to change, and says how: the first
    /// call says who leads now. `None`: nothing changed within `wait`.
    pub fn next(&mut self, wait: Duration) -> Result<Option<LeaderChange>, ClientError> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            if let Some(change) = self.queue.pop_front() {
                return Ok(Some(change));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() && self.told.is_some() {
                return Ok(None);
            }
            let batch = self.watch.next(left)?;
            self.take(batch);
        }
    }

    /// Turns a watch's answer into the changes of this election.
    fn take(&mut self, batch: WatchBatch) {
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
    (!info.delayed).then(|| Leader { token: info.token, owner: info.owner.clone(), value: info.value.clone() })
}

fn leader_from(event: &WatchEvent) -> Leader {
    Leader { token: event.token, owner: event.owner.clone(), value: event.value.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ClientConfig;

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

    fn observer() -> Observer {
        let client = Client::connect(ClientConfig::new(["127.0.0.1:9"])).expect("a client");
        Observer::new(Watch::new(client, b"e".to_vec(), None), b"e".to_vec())
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
        };
        observer.take(WatchBatch { events: vec![], index: 10, current: Some(vec![current]), compacted: false });
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
        };
        observer.take(WatchBatch { events: vec![], index: 20, current: Some(vec![current]), compacted: true });
        assert!(observer.queue.is_empty());
    }
}
