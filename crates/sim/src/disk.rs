//! The simulated disk behind each node's driver: what was synced survives a
//! crash, what was written without a sync is lost with it, and a crash can
//! strike in the middle of a turn, between two writes.
//!
//! The driver defers the sync only of writes raft-rs says need none (the
//! commit index moved); everything else is synced before the driver acts on
//! it. A crash mid-turn makes the turn's remaining writes fail: the turn is
//! fatal, and what it would have sent after its write never leaves the node.

use std::sync::{Arc, Mutex};

use fencelock_raft::{Durable, MemStore, Recovered, StorageError, WriteBatch};
use raft::prelude::{ConfState, Entry, HardState, Snapshot};

#[derive(Clone, Debug, Default)]
pub struct SimDisk {
    synced: MemStore,
    state: Arc<Mutex<DiskState>>,
}

#[derive(Debug, Default)]
struct DiskState {
    /// Writes still allowed before the disk "dies"; `None`: no crash armed.
    writes_left: Option<u32>,
    /// Written but not yet synced: lost by a crash.
    unsynced: Vec<OwnedBatch>,
}

#[derive(Clone, Debug)]
struct OwnedBatch {
    snapshot: Option<Snapshot>,
    install: bool,
    entries: Vec<Entry>,
    hard_state: Option<HardState>,
    conf_state: Option<ConfState>,
}

impl SimDisk {
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    /// Arms a crash: the disk takes `writes` more writes, then fails.
    pub fn crash_after(&self, writes: u32) {
        if let Ok(mut state) = self.state.lock() {
            state.writes_left = Some(writes);
        }
    }

    /// Disarms an armed crash (the heal).
    pub fn disarm(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.writes_left = None;
        }
    }

    /// The node died: what was not synced is gone, and the disk works again
    /// for the restart.
    pub fn crash(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.unsynced.clear();
            state.writes_left = None;
        }
    }
}

impl Durable for SimDisk {
    fn recover(&mut self) -> Result<Recovered, StorageError> {
        self.synced.recover()
    }

    fn write(&mut self, batch: WriteBatch<'_>) -> Result<(), StorageError> {
        let mut state = self.state.lock().map_err(|_| StorageError::Poisoned)?;
        match state.writes_left.as_mut() {
            Some(0) => {
                return Err(StorageError::Corrupt { what: "simulated disk", detail: "crashed".into() })
            }
            Some(n) => *n -= 1,
            None => {}
        }
        state.unsynced.push(OwnedBatch {
            snapshot: batch.snapshot.cloned(),
            install: batch.install,
            entries: batch.entries.to_vec(),
            hard_state: batch.hard_state.cloned(),
            conf_state: batch.conf_state.cloned(),
        });
        if batch.may_defer_sync {
            return Ok(());
        }
        // A sync makes everything written before it durable too.
        for owned in std::mem::take(&mut state.unsynced) {
            self.synced.write(WriteBatch {
                snapshot: owned.snapshot.as_ref(),
                install: owned.install,
                entries: &owned.entries,
                hard_state: owned.hard_state.as_ref(),
                conf_state: owned.conf_state.as_ref(),
                may_defer_sync: false,
            })?;
        }
        Ok(())
    }
}
