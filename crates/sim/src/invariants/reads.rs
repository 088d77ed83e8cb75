//! Linearizable reads: a `get` sent at true time s and answered at a must
//! name a holder (or none) that the key had at some moment between s and a.
//! The key's history is its changes in the order, and at the moment, some
//! node first applied them: a change is committed before any node applies
//! it, and a read's leader applied what it answers before it answered.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_raft::AppliedEvent;
use fencelock_types::{FencingToken, Key};

#[derive(Debug, Default)]
pub struct Check {
    /// Per key, (true time of first application, holder from then on).
    history: BTreeMap<Key, Vec<(u64, Option<FencingToken>)>>,
    seen: BTreeSet<(Key, FencingToken, bool)>,
    judged: u64,
}

impl Check {
    /// Some node applied `event` at true time `now_ms`.
    pub fn applied(&mut self, event: &AppliedEvent, now_ms: u64) {
        let (key, token, holder) = match event {
            AppliedEvent::Granted { key, token, existing: false, .. } => (key, *token, Some(*token)),
            // A lock held back by lock-delay has no holder (reads are judged
            // by holder: the clients read a held-back lock as none).
            AppliedEvent::Released { key, token }
            | AppliedEvent::Expired { key, token, .. }
            | AppliedEvent::Delayed { key, token, .. } => (key, *token, None),
            _ => return,
        };
        if self.seen.insert((key.clone(), token, holder.is_none())) {
            self.history.entry(key.clone()).or_default().push((now_ms, holder));
        }
    }

    /// A linearizable read of `key` sent at `sent_ms` answered `holder` at
    /// `answered_ms`.
    pub fn answered(
        &mut self,
        key: &Key,
        holder: Option<FencingToken>,
        sent_ms: u64,
        answered_ms: u64,
    ) -> Result<(), String> {
        self.judged += 1;
        let possible = self.possible(key, sent_ms, answered_ms);
        if possible.contains(&holder) {
            Ok(())
        } else {
            Err(format!(
                "a get of {key} sent at {sent_ms} ms answered {holder:?} at {answered_ms} ms; the key held only {possible:?} meanwhile"
            ))
        }
    }

    /// A linearizable check that `token` holds `key`, sent at `sent_ms`,
    /// answered `holds` at `answered_ms`.
    pub fn checked(
        &mut self,
        key: &Key,
        token: FencingToken,
        holds: bool,
        sent_ms: u64,
        answered_ms: u64,
    ) -> Result<(), String> {
        self.judged += 1;
        let possible = self.possible(key, sent_ms, answered_ms);
        if possible.iter().any(|holder| (*holder == Some(token)) == holds) {
            Ok(())
        } else {
            Err(format!(
                "a check of {key} under {token} sent at {sent_ms} ms answered {holds} at {answered_ms} ms; \
                 the key held only {possible:?} meanwhile"
            ))
        }
    }

    /// The holders `key` had from just before `sent_ms` to `answered_ms`:
    /// the one before the read was sent, then every one set while it was in
    /// flight (a change in the send's millisecond may be on either side).
    fn possible(&self, key: &Key, sent_ms: u64, answered_ms: u64) -> Vec<Option<FencingToken>> {
        let history = self.history.get(key).map(Vec::as_slice).unwrap_or(&[]);
        let at_send = history.iter().rev().find(|(at, _)| *at < sent_ms).and_then(|(_, holder)| *holder);
        std::iter::once(at_send)
            .chain(
                history
                    .iter()
                    .filter(|(at, _)| *at >= sent_ms && *at <= answered_ms)
                    .map(|(_, holder)| *holder),
            )
            .collect()
    }

    pub fn judged(&self) -> u64 {
        self.judged
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use fencelock_types::LeaseMs;

    fn grant(n: u64) -> AppliedEvent {
        AppliedEvent::Granted {
            key: key(),
            token: token(n),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            existing: false,
            session: None,
        }
    }

    #[test]
    fn a_stale_read_is_caught() {
        let mut check = Check::default();
        check.applied(&grant(1), 10);
        check.applied(&AppliedEvent::Released { key: key(), token: token(1) }, 20);
        // Sent after the release applied, answered with the old holder.
        let err = check.answered(&key(), Some(token(1)), 25, 30).unwrap_err();
        assert!(err.contains("answered Some"), "{err}");
    }

    #[test]
    fn any_value_the_key_had_during_the_read_is_fine() {
        let mut check = Check::default();
        check.applied(&grant(1), 10);
        check.applied(&AppliedEvent::Released { key: key(), token: token(1) }, 20);
        check.applied(&grant(2), 30);
        for holder in [Some(token(1)), None, Some(token(2))] {
            check.answered(&key(), holder, 15, 35).unwrap();
        }
        assert!(check.answered(&key(), Some(token(2)), 15, 25).is_err(), "a read saw the future");
        // A check is judged against the same history.
        check.checked(&key(), token(2), true, 31, 35).unwrap();
        check.checked(&key(), token(1), false, 31, 35).unwrap();
        assert!(check.checked(&key(), token(1), true, 31, 35).is_err(), "a check saw the past");
        // A change applied again by a lagging node is not a new one.
        check.applied(&grant(1), 40);
        assert!(check.answered(&key(), Some(token(1)), 45, 50).is_err());
        assert_eq!(check.judged(), 8);
    }
}
