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
