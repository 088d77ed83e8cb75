//! Replicas that applied the same log prefix hold byte-identical tables:
//! the first table seen at each applied index is the one every other node
//! must show at that index.

use std::collections::BTreeMap;

use fencelock_fsm::LockTable;

#[derive(Debug, Default)]
pub struct Check {
    /// Applied index → (first node seen there, CRC-32 of its table snapshot).
    digests: BTreeMap<u64, (usize, u32)>,
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
        let digest = digest(table);
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
