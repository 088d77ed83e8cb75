//! A client told Granted or Renewed keeps its lock for its lease, measured
//! on the leader's clock: when the leader that proposed an Expire applies
//! it, its own clock must have passed the moment it applied that lock's last
//! grant or renewal plus the lease. An Expire that overtook a renewal fails
//! this.

use std::collections::BTreeMap;

use fencelock_fsm::LockTable;
use fencelock_raft::AppliedEvent;
use fencelock_types::{FencingToken, Key};

use super::Applied;

/// Per node: key → (token, the node's clock when it applied the last grant
/// or renewal, lease, whether that was a replay after a restart).
#[derive(Debug, Default)]
pub struct Check {
    refreshed: Vec<BTreeMap<Key, (FencingToken, u64, u64, bool)>>,
}

impl Check {
    pub fn new(nodes: usize) -> Check {
        Check { refreshed: vec![BTreeMap::new(); nodes] }
    }

    /// Node `node` installed a snapshot at `local_ms`, ending the turn with
    /// `table`. It cannot know when the locks in it were granted or renewed,
    /// so it gives each a full lease from now (`LeaseTracker::restore`):
    /// that, not what it applied before, is what it is held to. (A holder
    /// that asked again with a shorter lease may have shortened it; the
    /// snapshot carries the lease asked last.)
    pub fn restored(&mut self, node: usize, table: &LockTable, local_ms: u64) {
        self.refreshed[node] = table
            .list(b"", usize::MAX)
            .map(|(key, lock)| (key.clone(), (lock.token, local_ms, lock.lease_ms.get(), false)))
            .collect();
    }

    pub fn applied(&mut self, applied: &Applied<'_>) -> Result<(), String> {
        let refreshed = &mut self.refreshed[applied.node];
        match applied.event {
            AppliedEvent::Granted { key, token, lease_ms, .. }
            | AppliedEvent::Renewed { key, token, lease_ms } => {
                refreshed.insert(key.clone(), (*token, applied.local_ms, lease_ms.get(), applied.replaying));
            }
            AppliedEvent::Expired { key, token, proposer } => {
                // A replayed grant or renewal was first applied earlier, at a
                // time this node no longer knows: nothing to hold it to.
                if let Some((held, at_ms, lease_ms, false)) = refreshed.remove(key) {
                    let due_ms = at_ms + lease_ms;
                    // Checked where the Expire was decided: on its proposer,
                    // applying it while still leading (so with the clock it
                    // decided by, or later).
                    let decided_here = *proposer == Some(fencelock_raft::NodeId(applied.node as u64 + 1));
                    if decided_here && applied.is_leader && held == *token && applied.local_ms < due_ms {
                        return Err(format!(
                            "node {} expired {key} (token {token}) at {} ms on its clock, before {due_ms} ms",
                            applied.node + 1,
                            applied.local_ms
                        ));
                    }
                }
            }
            AppliedEvent::Released { key, .. } => {
                refreshed.remove(key);
            }
            AppliedEvent::Restored => {}
        }
        Ok(())
    }
}
