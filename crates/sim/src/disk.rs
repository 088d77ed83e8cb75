//! The simulated disk behind each node: what was synced survives a crash,
//! what was written without a sync is lost with it, and a crash can strike
//! in the middle of a turn, between two writes.
//!
//! The world makes each write the node asks for ([`Action::Write`]) here. A
//! synchronous disk (a shell that writes on the node's thread) syncs every
//! write at once except those raft-rs says need no sync (the commit index
//! moved), which become durable with the next synced one; the world reports
//! each write done at once. An asynchronous disk (`AsyncEngineStore` in
//! production) only queues each write: the world syncs the queue later,
//! after a simulated fsync, and then reports it; a crash before then loses
//! the whole queue. An urgent write (a follower's) on an asynchronous disk
//! with nothing queued is synced at once, as `AsyncEngineStore` then does
//! on the shell's thread. A crash mid-turn makes the turn's remaining writes
//! fail: nothing the turn would have sent leaves the node.
//!
//! [`Action::Write`]: fencelock_raft::Action::Write

use std::sync::{Arc, Mutex};

use fencelock_raft::{Durable, MemStore, Recovered, StorageError, Write, WriteBatch};

#[derive(Clone, Debug, Default)]
pub struct SimDisk {
    synced: MemStore,
    state: Arc<Mutex<DiskState>>,
    /// Writes are queued until [`SimDisk::sync_queued`].
    asynchronous: bool,
}

#[derive(Debug, Default)]
struct DiskState {
    /// Writes still allowed before the disk "dies"; `None`: no crash armed.
    writes_left: Option<u32>,
    /// Written but not yet synced: lost by a crash.
    unsynced: Vec<WriteBatch>,
    /// Writes taken since the node (re)started.
    written: u64,
    /// Of those, how many are synced.
    durable: u64,
    /// Of those, how many the world has reported done to the node: all of
    /// them on a synchronous disk, the synced ones on an asynchronous one.
    done: u64,
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
        state.done = state.written;
        Ok(state.done)
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
            state.done = 0;
        }
    }

    pub fn is_async(&self) -> bool {
        self.asynchronous
    }

    /// What the disk held at the last sync, for a node that (re)starts.
    pub fn recover(&self) -> Result<Recovered, StorageError> {
        self.synced.clone().recover()
    }

    /// Makes (or queues) the node's write `write.n`, or fails it if the disk
    /// has died. Returns how many writes since the node started are done:
    /// the world reports that count to the node when it grows.
    pub fn write(&mut self, write: Write) -> Result<u64, StorageError> {
        let mut state = self.state.lock().map_err(|_| StorageError::Poisoned)?;
        match state.writes_left.as_mut() {
            Some(0) => {
                return Err(StorageError::Corrupt { what: "simulated disk", detail: "crashed".into() })
            }
            Some(n) => *n -= 1,
            None => {}
        }
        let expected = state.written + 1;
        if write.n != expected {
            return Err(StorageError::OutOfOrder { expected, got: write.n });
        }
        let deferred = write.batch.may_defer_sync;
        state.unsynced.push(write.batch);
        state.written = write.n;
        if self.asynchronous {
            if write.urgent && state.unsynced.len() == 1 {
                sync(&mut self.synced, &mut state)?;
            }
            state.done = state.durable;
        } else {
            if !deferred {
                // A sync makes everything written before it durable too.
                sync(&mut self.synced, &mut state)?;
            }
            state.done = state.written;
        }
        Ok(state.done)
    }
}

/// Makes every write so far durable.
fn sync(synced: &mut MemStore, state: &mut DiskState) -> Result<(), StorageError> {
    for batch in std::mem::take(&mut state.unsynced) {
        synced.write(&batch)?;
    }
    state.durable = state.written;
    Ok(())
}
