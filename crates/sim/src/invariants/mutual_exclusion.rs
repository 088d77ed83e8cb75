//! At most one holder per key: on every node, a new grant only ever finds
//! its key free, and a re-grant (a retry by the holder) keeps the holder's
//! token.

use std::collections::BTreeMap;

use fencelock_fsm::LockTable;
use fencelock_raft::AppliedEvent;
use fencelock_types::{FencingToken, Key};

use super::Applied;

/// Each node's view of who holds what, rebuilt from its applied changes.
#[derive(Debug, Default)]
pub struct Check {
    holders: Vec<BTreeMap<Key, FencingToken>>,
}

impl Check {
    pub fn new(nodes: usize) -> Check {
        Check { holders: vec![BTreeMap::new(); nodes] }
    }

    pub fn reset(&mut self, node: usize, table: &LockTable) {
        self.holders[node] =
            table.list(b"", usize::MAX).map(|(key, lock)| (key.clone(), lock.token)).collect();
    }

    pub fn applied(&mut self, applied: &Applied<'_>) -> Result<(), String> {
        let holders = &mut self.holders[applied.node];
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
            AppliedEvent::Renewed { .. } | AppliedEvent::Restored => {}
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
    fn a_replay_after_a_restart_starts_from_the_table_on_disk() {
        let mut check = Check::new(1);
        check.applied(&on(0, &granted(1, false))).unwrap();
        check.applied(&on(0, &released(1))).unwrap();
        check.applied(&on(0, &granted(2, false))).unwrap();
        // Reopened on a disk that had applied only the first grant: the
        // release and the second grant are applied again.
        let mut table = LockTable::new();
        table.apply(Command::Grant {
            key: key(),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            owner: Owner::new(b"a".to_vec()).unwrap(),
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
