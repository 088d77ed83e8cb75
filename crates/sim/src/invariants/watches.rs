//! Watches tell the log: an answer to a watch after index `a`, up to index
//! `i`, holds exactly the changes of holders under its prefix that entries
//! `a+1..=i` made, in log order, with their indexes; never one invented,
//! skipped, repeated or out of order, whichever node answers, across
//! restarts, snapshot installs and leader changes. Its index never goes
//! below the asked one. (A `compacted` answer says it cannot tell: only its
//! index is judged.)

use std::collections::BTreeMap;

use fencelock_raft::watch::{WatchAnswer, WatchKind};
use fencelock_raft::AppliedEvent;
use fencelock_types::{FencingToken, Key};

/// The changes the log made, by index, as the first node to apply each
/// entry reported them (every node applies the same).
#[derive(Debug, Default)]
pub struct Check {
    log: BTreeMap<u64, Vec<(Key, WatchKind, FencingToken)>>,
    answers: u64,
    events: u64,
}

impl Check {
    /// A node applied the changes of one turn.
    pub fn applied(&mut self, events: &[(u64, AppliedEvent)]) {
        let mut by_index: BTreeMap<u64, Vec<(Key, WatchKind, FencingToken)>> = BTreeMap::new();
        for (index, event) in events {
            let change = match event {
                AppliedEvent::Granted { key, token, existing: false, .. } => (key, WatchKind::Granted, token),
                AppliedEvent::Released { key, token } => (key, WatchKind::Released, token),
                AppliedEvent::Expired { key, token, .. } => (key, WatchKind::Expired, token),
                AppliedEvent::Delayed { key, token, .. } => (key, WatchKind::Delayed, token),
                AppliedEvent::DelayLifted { key, token, .. } => (key, WatchKind::DelayLifted, token),
                AppliedEvent::Proclaimed { key, token } => (key, WatchKind::Proclaimed, token),
                // Entries with no change a watcher sees still count as
                // applied: an empty list.
                _ => {
                    by_index.entry(*index).or_default();
                    continue;
                }
            };
            by_index.entry(*index).or_default().push((change.0.clone(), change.1, *change.2));
        }
        for (index, changes) in by_index {
            self.log.entry(index).or_insert(changes);
        }
    }

    /// A client's watch of `prefix` after `after` was answered.
    pub fn answered(
        &mut self,
        prefix: &[u8],
        after: Option<u64>,
        answer: &WatchAnswer,
    ) -> Result<(), String> {
        self.answers += 1;
        if let Some(after) = after {
            if answer.index < after {
                return Err(format!("a watch after index {after} was answered with index {}", answer.index));
            }
        }
        let (Some(after), false) = (after, answer.compacted) else { return Ok(()) };
        if answer.index == after {
            return match answer.events.is_empty() {
                true => Ok(()),
                false => {
                    Err(format!("a watch after index {after} told {:?} and stayed at {after}", answer.events))
                }
            };
        }
        let told: Vec<(u64, &Key, WatchKind, FencingToken)> =
            answer.events.iter().map(|event| (event.index, &event.key, event.kind, event.token)).collect();
        let expected: Vec<(u64, &Key, WatchKind, FencingToken)> = self
            .log
            .range(after + 1..=answer.index)
            .flat_map(|(index, changes)| {
                changes.iter().map(move |(key, kind, token)| (*index, key, *kind, *token))
            })
            .filter(|(_, key, ..)| key.as_bytes().starts_with(prefix))
            .collect();
        if told != expected {
            return Err(format!(
                "a watch of {:?} after index {after} up to {} told {told:?}, but the log made {expected:?}",
                String::from_utf8_lossy(prefix),
                answer.index
            ));
        }
        self.events += told.len() as u64;
        Ok(())
    }

    /// Watch answers judged, and the events they told.
    pub fn judged(&self) -> (u64, u64) {
        (self.answers, self.events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_raft::watch::WatchEvent;
    use fencelock_types::{LeaseMs, Owner, Value};

    fn key(name: &str) -> Key {
        Key::new(name.as_bytes().to_vec()).unwrap()
    }

    fn granted(name: &str, token: u64) -> AppliedEvent {
        AppliedEvent::Granted {
            key: key(name),
            token: FencingToken::new(token).unwrap(),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            existing: false,
            session: None,
        }
    }

    fn told(index: u64, name: &str, token: u64) -> WatchEvent {
        WatchEvent {
            index,
            key: key(name),
            kind: WatchKind::Granted,
            token: FencingToken::new(token).unwrap(),
            owner: Owner::new(b"o".to_vec()).unwrap(),
            value: Value::none(),
        }
    }

    #[test]
    fn a_skipped_invented_or_misplaced_event_is_caught() {
        let mut check = Check::default();
        check.applied(&[(1, granted("k1", 1)), (2, granted("x", 2)), (3, granted("k2", 3))]);
        let answer = |events: Vec<WatchEvent>, index| WatchAnswer { events, index, ..WatchAnswer::default() };
        assert!(check.answered(b"k", Some(0), &answer(vec![told(1, "k1", 1), told(3, "k2", 3)], 3)).is_ok());
        assert!(check.answered(b"k", Some(1), &answer(vec![told(3, "k2", 3)], 3)).is_ok());
        // Skipped k2.
        assert!(check.answered(b"k", Some(0), &answer(vec![told(1, "k1", 1)], 3)).is_err());
        // Repeated k1.
        assert!(check.answered(b"k", Some(0), &answer(vec![told(1, "k1", 1), told(1, "k1", 1)], 1)).is_err());
        // At the wrong index.
        assert!(check.answered(b"k", Some(0), &answer(vec![told(2, "k1", 1), told(3, "k2", 3)], 3)).is_err());
        // Outside the prefix.
        assert!(check.answered(b"k", Some(1), &answer(vec![told(2, "x", 2), told(3, "k2", 3)], 3)).is_err());
        // Backwards.
        assert!(check.answered(b"k", Some(3), &answer(vec![], 2)).is_err());
        // Compacted: only the index is judged.
        let compacted = WatchAnswer { compacted: true, index: 3, ..WatchAnswer::default() };
        assert!(check.answered(b"k", Some(0), &compacted).is_ok());
    }
}
