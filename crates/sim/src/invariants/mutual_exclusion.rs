//! At most one holder per key: on every node, a new grant only ever finds
//! its key free, and a re-grant (a retry by the holder) keeps the holder's
//! token. A key held back by lock-delay is granted to no one, its former
//! holder included, and renewed by no one, until the delay is lifted.
//! Plain locks only: the keys the clients take shared (read-write locks
//! and semaphores, many holders at once) are [`super::shared`]'s.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_fsm::LockTable;
use fencelock_raft::AppliedEvent;
use fencelock_types::{FencingToken, Key};

use super::{shared, Applied};

/// Each node's view of who holds what, rebuilt from its applied changes.
#[derive(Debug, Default)]
pub struct Check {
    holders: Vec<BTreeMap<Key, FencingToken>>,
    /// Per node, the keys held back by lock-delay (also in `holders`).
    delayed: Vec<BTreeSet<Key>>,
}

impl Check {
    pub fn new(nodes: usize) -> Check {
        Check { holders: vec![BTreeMap::new(); nodes], delayed: vec![BTreeSet::new(); nodes] }
    }

    pub fn reset(&mut self, node: usize, table: &LockTable) {
        self.holders[node] =
            table.list(b"", usize::MAX).map(|(key, lock)| (key.clone(), lock.token)).collect();
        self.delayed[node] = table
            .list(b"", usize::MAX)
            .filter(|(_, lock)| lock.delayed)
            .map(|(key, _)| key.clone())
            .collect();
    }

    pub fn applied(&mut self, applied: &Applied<'_>) -> Result<(), String> {
        if shared::of_shared_key(applied.event) {
            return Ok(());
        }
        let holders = &mut self.holders[applied.node];
        let delayed = &mut self.delayed[applied.node];
        if let AppliedEvent::Granted { key, .. } | AppliedEvent::Renewed { key, .. } = applied.event {
            if delayed.contains(key) {
                return Err(format!(
                    "node {}: {key} granted or renewed while held back by lock-delay: {:?}",
                    applied.node + 1,
                    applied.event
                ));
            }
        }
        match applied.event {
            AppliedEvent::Granted { key, token, existing: false, .. } => {
                if let Some(held) = holders.get(key) {
                    return Err(format!(
                        "node {}: {key} granted under token {token} while held under {held}",
                        applied.node + 1
                    ));
                }
                holders.insert(key.clone(), *token);
            }
            AppliedEvent::Granted { key, token, existing: true, .. } => {
                if holders.get(key) != Some(token) {
                    return Err(format!(
                        "node {}: {key} re-granted under token {token}, but held under {:?}",
                        applied.node + 1,
                        holders.get(key)
                    ));
                }
            }
            AppliedEvent::Released { key, token } | AppliedEvent::Expired { key, token, .. } => {
                if holders.get(key) != Some(token) {
                    return Err(format!(
                        "node {}: {key} removed under token {token}, but held under {:?}",
                        applied.node + 1,
                        holders.get(key)
                    ));
                }
                holders.remove(key);
            }
            AppliedEvent::Delayed { key, token, .. } | AppliedEvent::DelayLifted { key, token, .. } => {
                let lifted = matches!(applied.event, AppliedEvent::DelayLifted { .. });
                if holders.get(key) != Some(token) || delayed.contains(key) != lifted {
                    return Err(format!(
                        "node {}: {:?}, but {key} was held under {:?} (held back: {})",
                        applied.node + 1,
                        applied.event,
                        holders.get(key),
                        delayed.contains(key)
                    ));
                }
                if lifted {
                    holders.remove(key);
                    delayed.remove(key);
                } else {
                    delayed.insert(key.clone());
                }
            }
            AppliedEvent::Renewed { .. }
            | AppliedEvent::Proclaimed { .. }
            | AppliedEvent::Restored
            | AppliedEvent::SessionOpened { .. }
            | AppliedEvent::SessionRenewed { .. }
            | AppliedEvent::SessionEnded { .. } => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use fencelock_types::{Command, LeaseMs, Owner};

    /// `event` as node `node` applied it.
    fn on(node: usize, event: &AppliedEvent) -> Applied<'_> {
        Applied { node, local_ms: 0, is_leader: false, index: 1, replaying: false, event }
    }

    #[test]
    fn a_new_grant_while_the_key_is_held_is_caught() {
        let mut check = Check::new(3);
        check.applied(&on(1, &granted(1, false))).unwrap();
        let err = check.applied(&on(1, &granted(2, false))).unwrap_err();
        assert!(err.contains("node 2: k granted under token 2 while held under 1"), "{err}");
    }

    #[test]
    fn a_key_held_back_by_lock_delay_is_granted_to_no_one_until_lifted() {
        let delayed = AppliedEvent::Delayed {
            key: key(),
            token: token(1),
            delay_ms: LeaseMs::new(400).unwrap(),
            proposer: None,
        };
        let lifted = AppliedEvent::DelayLifted { key: key(), token: token(1), proposer: None, forced: false };
        let mut check = Check::new(1);
        check.applied(&on(0, &granted(1, false))).unwrap();
        check.applied(&on(0, &delayed)).unwrap();
        for event in [granted(2, false), granted(1, true)] {
            let mut during = Check::new(1);
            during.applied(&on(0, &granted(1, false))).unwrap();
            during.applied(&on(0, &delayed)).unwrap();
            let err = during.applied(&on(0, &event)).unwrap_err();
            assert!(err.contains("while held back by lock-delay"), "{err}");
        }
        // Lifted twice, or lifted without a delay: caught.
        check.applied(&on(0, &lifted)).unwrap();
        assert!(check.applied(&on(0, &lifted)).is_err());
        check.applied(&on(0, &granted(2, false))).unwrap();
    }

    #[test]
    fn a_re_grant_under_another_token_is_caught() {
        let mut check = Check::new(1);
        check.applied(&on(0, &granted(1, false))).unwrap();
        let err = check.applied(&on(0, &granted(2, true))).unwrap_err();
        assert!(
            err.contains("node 1: k re-granted under token 2, but held under Some(FencingToken(1))"),
            "{err}"
        );
        // And a re-grant of a key nobody holds.
        let mut check = Check::new(1);
        let err = check.applied(&on(0, &granted(1, true))).unwrap_err();
        assert!(err.contains("held under None"), "{err}");
    }

    #[test]
    fn a_removal_under_a_token_that_does_not_hold_the_key_is_caught() {
        let mut check = Check::new(1);
        check.applied(&on(0, &granted(1, false))).unwrap();
        let err = check.applied(&on(0, &released(2))).unwrap_err();
        assert!(
            err.contains("node 1: k removed under token 2, but held under Some(FencingToken(1))"),
            "{err}"
        );
        let mut check = Check::new(1);
        let err = check.applied(&on(0, &expired(1))).unwrap_err();
        assert!(err.contains("node 1: k removed under token 1, but held under None"), "{err}");
    }

    #[test]
    fn re_grants_to_the_holder_and_grants_after_a_release_or_expiry_pass() {
        let mut check = Check::new(2);
        for node in 0..2 {
            // Each node sees the same history: nodes are judged apart.
            check.applied(&on(node, &granted(1, false))).unwrap();
            check.applied(&on(node, &granted(1, true))).unwrap();
            let renewed =
                AppliedEvent::Renewed { key: key(), token: token(1), lease_ms: LeaseMs::new(5).unwrap() };
            check.applied(&on(node, &renewed)).unwrap();
            check.applied(&on(node, &released(1))).unwrap();
            check.applied(&on(node, &granted(2, false))).unwrap();
            check.applied(&on(node, &expired(2))).unwrap();
            check.applied(&on(node, &granted(3, false))).unwrap();
        }
    }

    #[test]
    fn keys_taken_shared_are_left_to_the_shared_check() {
        let mut check = Check::new(1);
        let reader = |n| AppliedEvent::Granted {
            key: Key::new(b"k-rw".to_vec()).unwrap(),
            token: token(n),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            existing: false,
            session: None,
        };
        check.applied(&on(0, &reader(1))).unwrap();
        check.applied(&on(0, &reader(2))).unwrap();
    }

    #[test]
    fn a_replay_after_a_restart_starts_from_the_table_on_disk() {
        let mut check = Check::new(1);
        check.applied(&on(0, &granted(1, false))).unwrap();
        check.applied(&on(0, &released(1))).unwrap();
        check.applied(&on(0, &granted(2, false))).unwrap();
        // Reopened on a disk that had applied only the first grant: the
        // release and the second grant are applied again.
        let mut table = LockTable::new();
        table.apply(Command::Grant {
            session: None,
            key: key(),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            owner: Owner::new(b"a".to_vec()).unwrap(),
            value: fencelock_types::Value::none(),
        });
        check.reset(0, &table);
        check.applied(&on(0, &released(1))).unwrap();
        check.applied(&on(0, &granted(2, false))).unwrap();
        // Reopened on an empty disk: everything again.
        check.reset(0, &LockTable::new());
        check.applied(&on(0, &granted(1, false))).unwrap();
        assert!(check.applied(&on(0, &granted(2, false))).is_err(), "the replay is still judged");
    }
}
