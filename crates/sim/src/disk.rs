//! The simulated disk behind each node's driver: what was synced survives a
//! crash, what was written without a sync is lost with it, and a crash can
//! strike in the middle of a turn, between two writes.
//!
//! A synchronous disk (the driver writes and syncs on its own thread)
//! defers the sync only of writes raft-rs says need none (the commit index
//! moved); everything else is synced before the driver acts on it. An
//! asynchronous disk (`AsyncEngineStore` in production) only queues each
//! write: the world syncs the queue later, after a simulated fsync, and
//! tells the driver with `Replica::on_persisted`; a crash before then loses
//! the whole queue. Asked for inline writes (a follower's), an asynchronous
//! disk with nothing queued syncs the write at once, as `AsyncEngineStore`
//! then does on the driver's thread. A crash mid-turn makes the turn's
//! remaining writes fail: the turn is fatal, and what it would have sent
//! after its write never leaves the node.

use std::sync::{Arc, Mutex};

use fencelock_raft::{Durable, MemStore, OwnedWriteBatch, Recovered, StorageError, WriteBatch};

#[derive(Clone, Debug, Default)]
pub struct SimDisk {
    synced: MemStore,
    state: Arc<Mutex<DiskState>>,
    /// Writes are queued until [`SimDisk::sync_queued`].
    asynchronous: bool,
    /// Asked for inline writes: an asynchronous disk with nothing queued
    /// syncs the write at once, as `AsyncEngineStore` does on the
    /// caller's thread.
    inline: bool,
}

#[derive(Debug, Default)]
struct DiskState {
    /// Writes still allowed before the disk "dies"; `None`: no crash armed.
    writes_left: Option<u32>,
    /// Written but not yet synced: lost by a crash.
    unsynced: Vec<OwnedWriteBatch>,
    /// Writes taken since the node (re)started.
    written: u64,
    /// Of those, how many are synced.
    durable: u64,
}

impl SimDisk {
    pub fn new(asynchronous: bool) -> SimDisk {
        SimDisk { asynchronous, ..SimDisk::default() }
    }

    /// An asynchronous disk's fsync: makes every queued write durable and
    /// returns how many writes since the node started are now durable.
    pub fn sync_queued(&mut self) -> Result<u64, StorageError> {
        let mut state = self.state.lock().map_err(|_| StorageError::Poisoned)?;
        sync(&mut self.synced, &mut state)?;
        Ok(state.written)
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
            state.written = 0;
            state.durable = 0;
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
        let mut owned = OwnedWriteBatch::from_batch(&batch);
        owned.may_defer_sync = false;
        state.unsynced.push(owned);
        state.written += 1;
        let inline = self.asynchronous && self.inline && state.unsynced.len() == 1;
        if !inline && (batch.may_defer_sync || self.asynchronous) {
            return Ok(());
        }
        // A sync makes everything written before it durable too.
        sync(&mut self.synced, &mut state)
    }

    fn is_async(&self) -> bool {
        self.asynchronous
    }

    fn prefer_inline(&mut self, inline: bool) {
        self.inline = inline;
    }

    fn durable_now(&self) -> Option<u64> {
        let state = self.state.lock().ok()?;
        self.asynchronous.then_some(state.durable)
    }
}

/// Makes every write so far durable.
fn sync(synced: &mut MemStore, state: &mut DiskState) -> Result<(), StorageError> {
    for owned in std::mem::take(&mut state.unsynced) {
        synced.write(owned.as_batch())?;
    }
    state.durable = state.written;
    Ok(())
}
