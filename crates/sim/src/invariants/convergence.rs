//! Replicas that applied the same log prefix hold byte-identical tables:
//! the first table seen at each applied index is the one every other node
//! must show at that index. A node's turn that leaves its table equal to
//! the one it last showed at the same index (most turns apply nothing) is
//! judged by that equality, which costs nothing for an unchanged table,
//! rather than by encoding the table again.

use std::collections::BTreeMap;

use fencelock_fsm::LockTable;

#[derive(Debug, Default)]
pub struct Check {
    /// Applied index → (first node seen there, CRC-32 of its table snapshot).
    digests: BTreeMap<u64, (usize, u32)>,
    /// Per node, the last table it showed, at which applied index; its
    /// digest matched.
    last: BTreeMap<usize, (u64, LockTable)>,
    compared: u64,
}

pub fn digest(table: &LockTable) -> u32 {
    crc32fast::hash(&table.snapshot())
}

impl Check {
    /// Tables compared with an earlier one at the same index.
    pub fn compared(&self) -> u64 {
        self.compared
    }

    pub fn observed(&mut self, node: usize, applied_index: u64, table: &LockTable) -> Result<(), String> {
        if self.last.get(&node).is_some_and(|(index, last)| *index == applied_index && last == table) {
            self.compared += 1;
            return Ok(());
        }
        let digest = digest(table);
        self.last.insert(node, (applied_index, table.clone()));
        match self.digests.get(&applied_index) {
            Some((first, expected)) if *expected != digest => Err(format!(
                "node {} and node {} differ at applied index {applied_index}",
                first + 1,
                node + 1
            )),
            Some(_) => {
                self.compared += 1;
                Ok(())
            }
            None => {
                self.digests.insert(applied_index, (node, digest));
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use fencelock_types::{Command, FencingToken};

    #[test]
    fn two_nodes_with_different_tables_at_one_index_are_caught() {
        let mut check = Check::default();
        check.observed(0, 5, &table(vec![grant(b"a")])).unwrap();
        check.observed(1, 5, &table(vec![grant(b"a")])).unwrap();
        let err = check.observed(2, 5, &table(vec![grant(b"b")])).unwrap_err();
        assert!(err.contains("node 1 and node 3 differ at applied index 5"), "{err}");
    }

    #[test]
    fn tables_that_differ_only_in_their_token_counter_are_caught() {
        let mut check = Check::default();
        check.observed(0, 2, &LockTable::new()).unwrap();
        let released = table(vec![
            grant(b"a"),
            Command::Release { key: key(), token: Some(FencingToken::FIRST), user: None },
        ]);
        let err = check.observed(1, 2, &released).unwrap_err();
        assert!(err.contains("node 1 and node 2 differ at applied index 2"), "{err}");
    }

    #[test]
    fn tables_that_differ_only_in_their_command_level_are_caught() {
        // The level is in the snapshot, so in the digest.
        let mut check = Check::default();
        check.observed(0, 3, &LockTable::at_level(1)).unwrap();
        let err = check.observed(1, 3, &LockTable::at_level(3)).unwrap_err();
        assert!(err.contains("node 1 and node 2 differ at applied index 3"), "{err}");
    }

    #[test]
    fn a_table_that_changed_at_the_same_index_is_caught() {
        // The unchanged table is judged by equality, the changed one is
        // encoded again and compared with the first seen at that index.
        let mut check = Check::default();
        let granted = table(vec![grant(b"a")]);
        check.observed(0, 5, &granted).unwrap();
        check.observed(0, 5, &granted).unwrap();
        let err = check.observed(0, 5, &LockTable::new()).unwrap_err();
        assert!(err.contains("node 1 and node 1 differ at applied index 5"), "{err}");
        assert_eq!(check.compared(), 1);
    }

    #[test]
    fn equal_tables_at_one_index_and_different_tables_at_different_indexes_pass() {
        let mut check = Check::default();
        check.observed(0, 4, &LockTable::new()).unwrap();
        check.observed(0, 5, &table(vec![grant(b"a")])).unwrap();
        // A lagging node shows index 4's table, then catches up.
        check.observed(1, 4, &LockTable::new()).unwrap();
        check.observed(1, 5, &table(vec![grant(b"a")])).unwrap();
        // The same grant at the same index, on a third node and on a
        // restarted one.
        check.observed(2, 5, &table(vec![grant(b"a")])).unwrap();
        check.observed(0, 5, &table(vec![grant(b"a")])).unwrap();
        // A table built another way but equal (a retry by the holder) is
        // equal bytes.
        check.observed(2, 5, &table(vec![grant(b"a"), grant(b"a")])).unwrap();
        assert_eq!(check.compared(), 5);
    }
}
