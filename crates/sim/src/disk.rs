//! The simulated disk behind each node's driver: what was written survives a
//! crash, and a crash can strike in the middle of a turn, between two
//! writes, after which nothing of that turn leaves the node.
//!
//! The driver syncs every write it makes before acting on it, so a write
//! that returned is durable; the fault this disk models is the node dying
//! with later writes of the same turn not done (they fail, the turn is
//! fatal, and its messages and replies are dropped with the node).

use std::sync::{Arc, Mutex};

use fencelock_raft::{Durable, MemStore, Recovered, StorageError, WriteBatch};

#[derive(Clone, Debug, Default)]
pub struct SimDisk {
    store: MemStore,
    /// Writes still allowed before the disk "dies"; `None`: no crash armed.
    writes_left: Arc<Mutex<Option<u32>>>,
}

impl SimDisk {
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    /// Arms a crash: the disk takes `writes` more writes, then fails.
    pub fn crash_after(&self, writes: u32) {
        if let Ok(mut left) = self.writes_left.lock() {
            *left = Some(writes);
        }
    }

    /// Disarms the crash, for the restart.
    pub fn repair(&self) {
        if let Ok(mut left) = self.writes_left.lock() {
            *left = None;
        }
    }
}

impl Durable for SimDisk {
    fn recover(&mut self) -> Result<Recovered, StorageError> {
        self.store.recover()
    }

    fn write(&mut self, batch: WriteBatch<'_>) -> Result<(), StorageError> {
        let mut left = self.writes_left.lock().map_err(|_| StorageError::Poisoned)?;
        match left.as_mut() {
            Some(0) => {
                return Err(StorageError::Corrupt { what: "simulated disk", detail: "crashed".into() })
            }
            Some(n) => *n -= 1,
            None => {}
        }
        self.store.write(batch)
    }
}
