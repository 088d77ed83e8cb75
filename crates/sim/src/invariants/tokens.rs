//! Fencing tokens strictly increase on every node, and no token is ever
//! issued for two different grants, across all nodes, crashes and leaders.

use std::collections::BTreeMap;

use fencelock_fsm::LockTable;
use fencelock_raft::AppliedEvent;
use fencelock_types::{FencingToken, Key};

use super::Applied;

#[derive(Debug, Default)]
pub struct Check {
    /// The last new token each node applied.
    last: Vec<Option<FencingToken>>,
    /// Every token any node granted, the key it was for and the log
    /// position that granted it.
    issued: BTreeMap<FencingToken, (Key, u64)>,
}

impl Check {
    pub fn new(nodes: usize) -> Check {
        Check { last: vec![None; nodes], issued: BTreeMap::new() }
    }

    pub fn reset(&mut self, node: usize, table: &LockTable) {
        self.last[node] = table.last_token();
    }

    pub fn applied(&mut self, applied: &Applied<'_>) -> Result<(), String> {
        let AppliedEvent::Granted { key, token, existing: false, .. } = applied.event else { return Ok(()) };
        let last = &mut self.last[applied.node];
        if last.is_some_and(|last| *token <= last) {
            return Err(format!("node {}: token {token} granted after {last:?}", applied.node + 1));
        }
        *last = Some(*token);
        match self.issued.get(token) {
            Some((earlier, _)) if earlier != key => {
                Err(format!("token {token} issued for {earlier} and again for {key}"))
            }
            Some((_, at)) if *at != applied.index => Err(format!(
                "token {token} issued for {key} at index {at} and again at index {}",
                applied.index
            )),
            Some(_) => Ok(()),
            None => {
                self.issued.insert(*token, (key.clone(), applied.index));
                Ok(())
            }
        }
    }

    pub fn highest_issued(&self) -> Option<FencingToken> {
        self.issued.keys().next_back().copied()
    }
}
