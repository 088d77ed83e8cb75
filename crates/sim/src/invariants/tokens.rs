//! Fencing tokens strictly increase on every node, and no token is ever
//! issued for two different grants, across all nodes, crashes and leaders.
//! A session's id is a token from the same counter: it counts as issued,
//! never for a grant as well.

use std::collections::BTreeMap;

use fencelock_fsm::LockTable;
use fencelock_raft::AppliedEvent;
use fencelock_types::{FencingToken, Key};

use super::Applied;

#[derive(Debug, Default)]
pub struct Check {
    /// The last new token each node applied.
    last: Vec<Option<FencingToken>>,
    /// Every token any node granted, the key it was for (none: a
    /// session's id) and the log position that granted it.
    issued: BTreeMap<FencingToken, (Option<Key>, u64)>,
}

impl Check {
    pub fn new(nodes: usize) -> Check {
        Check { last: vec![None; nodes], issued: BTreeMap::new() }
    }

    pub fn reset(&mut self, node: usize, table: &LockTable) {
        self.last[node] = table.last_token();
    }

    pub fn applied(&mut self, applied: &Applied<'_>) -> Result<(), String> {
        let (key, token) = match applied.event {
            AppliedEvent::Granted { key, token, existing: false, .. } => (Some(key), token),
            AppliedEvent::SessionOpened { session, .. } => (None, session),
            _ => return Ok(()),
        };
        let name = |key: Option<&Key>| key.map_or_else(|| "a session".to_owned(), Key::to_string);
        let last = &mut self.last[applied.node];
        if last.is_some_and(|last| *token <= last) {
            return Err(format!("node {}: token {token} granted after {last:?}", applied.node + 1));
        }
        *last = Some(*token);
        match self.issued.get(token) {
            Some((earlier, _)) if earlier.as_ref() != key => Err(format!(
                "token {token} issued for {} and again for {}",
                name(earlier.as_ref()),
                name(key)
            )),
            Some((_, at)) if *at != applied.index => Err(format!(
                "token {token} issued for {} at index {at} and again at index {}",
                name(key),
                applied.index
            )),
            Some(_) => Ok(()),
            None => {
                self.issued.insert(*token, (key.cloned(), applied.index));
                Ok(())
            }
        }
    }

    pub fn highest_issued(&self) -> Option<FencingToken> {
        self.issued.keys().next_back().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_types::{Command, LeaseMs, Owner};

    fn key(name: &[u8]) -> Key {
        Key::new(name.to_vec()).unwrap()
    }

    fn token(n: u64) -> FencingToken {
        FencingToken::new(n).unwrap()
    }

    fn granted(name: &[u8], n: u64, existing: bool) -> AppliedEvent {
        AppliedEvent::Granted {
            key: key(name),
            token: token(n),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            existing,
            session: None,
        }
    }

    /// `event` as node `node` applied it from log index `index`.
    fn at(node: usize, index: u64, event: &AppliedEvent) -> Applied<'_> {
        Applied { node, local_ms: 0, is_leader: false, index, replaying: false, event }
    }

    #[test]
    fn the_same_token_for_two_keys_is_caught() {
        let mut check = Check::new(2);
        check.applied(&at(0, 3, &granted(b"a", 1, false))).unwrap();
        let err = check.applied(&at(1, 3, &granted(b"b", 1, false))).unwrap_err();
        assert!(err.contains("token 1 issued for a and again for b"), "{err}");
    }

    #[test]
    fn the_same_token_for_one_key_at_two_log_indexes_is_caught() {
        let mut check = Check::new(2);
        check.applied(&at(0, 3, &granted(b"k", 1, false))).unwrap();
        let err = check.applied(&at(1, 7, &granted(b"k", 1, false))).unwrap_err();
        assert!(err.contains("token 1 issued for k at index 3 and again at index 7"), "{err}");
    }

    #[test]
    fn a_token_not_above_the_last_on_one_node_is_caught() {
        let mut check = Check::new(1);
        check.applied(&at(0, 1, &granted(b"a", 2, false))).unwrap();
        let err = check.applied(&at(0, 2, &granted(b"b", 1, false))).unwrap_err();
        assert!(err.contains("node 1: token 1 granted after Some(FencingToken(2))"), "{err}");
        let err = check.applied(&at(0, 2, &granted(b"b", 2, false))).unwrap_err();
        assert!(err.contains("node 1: token 2 granted after"), "{err}");
    }

    #[test]
    fn the_same_grant_on_two_nodes_at_the_same_index_and_re_grants_pass() {
        let mut check = Check::new(3);
        for node in 0..3 {
            check.applied(&at(node, 3, &granted(b"a", 1, false))).unwrap();
            // The holder's retry keeps its token; it is not a new issue.
            check.applied(&at(node, 4, &granted(b"a", 1, true))).unwrap();
            check.applied(&at(node, 5, &granted(b"b", 2, false))).unwrap();
        }
        assert_eq!(check.highest_issued(), Some(token(2)));
    }

    fn opened(n: u64) -> AppliedEvent {
        AppliedEvent::SessionOpened { session: token(n), ttl_ms: LeaseMs::new(1_000).unwrap() }
    }

    #[test]
    fn a_session_id_is_an_issued_token() {
        let mut check = Check::new(4);
        check.applied(&at(0, 1, &granted(b"a", 1, false))).unwrap();
        check.applied(&at(0, 2, &opened(2))).unwrap();
        check.applied(&at(1, 2, &opened(2))).unwrap();
        assert_eq!(check.highest_issued(), Some(token(2)));
        // A lock's token equal to a session's id, and the reverse (on nodes
        // that applied nothing before).
        let err = check.applied(&at(2, 3, &granted(b"b", 2, false))).unwrap_err();
        assert!(err.contains("token 2 issued for a session and again for b"), "{err}");
        let err = check.applied(&at(0, 3, &opened(1))).unwrap_err();
        assert!(err.contains("node 1: token 1 granted after"), "{err}");
        let err = check.applied(&at(3, 4, &opened(1))).unwrap_err();
        assert!(err.contains("token 1 issued for a and again for a session"), "{err}");
    }

    #[test]
    fn a_replay_after_a_restart_passes() {
        let mut check = Check::new(1);
        check.applied(&at(0, 1, &granted(b"a", 1, false))).unwrap();
        check.applied(&at(0, 2, &granted(b"b", 2, false))).unwrap();
        // Reopened on a disk that had applied index 1 only: index 2 again.
        let mut table = LockTable::new();
        table.apply(Command::Grant {
            session: None,
            key: key(b"a"),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            owner: Owner::new(b"o".to_vec()).unwrap(),
            value: fencelock_types::Value::none(),
        });
        check.reset(0, &table);
        check.applied(&at(0, 2, &granted(b"b", 2, false))).unwrap();
        // Reopened on an empty disk: everything again.
        check.reset(0, &LockTable::new());
        check.applied(&at(0, 1, &granted(b"a", 1, false))).unwrap();
        check.applied(&at(0, 2, &granted(b"b", 2, false))).unwrap();
        check.applied(&at(0, 3, &granted(b"c", 3, false))).unwrap();
        assert_eq!(check.highest_issued(), Some(token(3)));
    }
}
