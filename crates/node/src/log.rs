//! The raft log as the node sees it: an in-memory [`LogCache`] that raft-rs
//! reads, the writes the node asks for ([`Write`]), the interface of a store
//! that makes them ([`Durable`]), what a store gives back at open
//! ([`Recovered`]), and a store in memory ([`MemStore`]).
//!
//! The node does no I/O: raft-rs reads the cache, and each turn's write
//! leaves the node as an action that a shell makes and reports durable.
//! The stores on disk (raft-engine's, synced, and the one behind an I/O
//! thread) live in `fencelock-raft`; the simulator keeps a model of a disk.

use std::sync::{Arc, Mutex, PoisonError};

use raft::prelude::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError as RaftStorageError};

use crate::rejoin::Membership;

/// One write: what a `Ready` asks to persist, or a local snapshot, or a
/// membership or conf-state record. It owns its parts, to wait in a queue
/// or cross to an I/O thread.
#[derive(Clone, Debug, Default)]
pub struct WriteBatch {
    /// A snapshot to store. With `install`, it replaces the whole log (a
    /// snapshot received from the leader); without, it only drops the entries
    /// it covers (a snapshot taken locally, for compaction).
    pub snapshot: Option<Snapshot>,
    pub install: bool,
    /// Entries to append; an entry at an index already stored replaces it and
    /// everything after it.
    pub entries: Vec<Entry>,
    pub hard_state: Option<HardState>,
    pub conf_state: Option<ConfState>,
    /// What the node keeps about its membership (see [`crate::rejoin`]).
    pub membership: Option<Membership>,
    /// The write may skip its fsync and become durable with the next synced
    /// one: raft-rs said it need not be synced (only the commit index moved,
    /// which a restart can learn again). False, the default, syncs.
    pub may_defer_sync: bool,
}

impl WriteBatch {
    pub fn is_empty(&self) -> bool {
        self.snapshot.is_none()
            && self.entries.is_empty()
            && self.hard_state.is_none()
            && self.conf_state.is_none()
            && self.membership.is_none()
    }
}

/// A write the node asks its shell to make ([`crate::Action::Write`]).
#[derive(Clone, Debug)]
pub struct Write {
    /// Its number: the node's writes are numbered 1, 2, 3... from open and
    /// must be made in that order. The shell reports progress as "the
    /// first `n` are durable" ([`crate::Event::Persisted`]).
    pub n: u64,
    pub batch: WriteBatch,
    /// The write is on the path of every commit (a follower's, whose
    /// acknowledgement waits for it): a shell whose disk is idle should
    /// make it at once, on its own thread, rather than queue it.
    pub urgent: bool,
}

/// What a store holds after a restart.
#[derive(Debug, Default, Clone)]
pub struct Recovered {
    pub hard_state: HardState,
    /// `None` for a store that was never written.
    pub conf_state: Option<ConfState>,
    /// The last stored snapshot; the default (index 0) when there is none.
    pub snapshot: Snapshot,
    /// The entries after the snapshot, in index order.
    pub entries: Vec<Entry>,
    pub membership: Membership,
    /// The file the snapshot's data was read from, if a file of its own:
    /// what an error about corrupt data names.
    pub snapshot_file: Option<String>,
}

impl Recovered {
    /// Whether the store was never written: no raft state at all, and no
    /// membership record (a node that decided to rejoin keeps its floor).
    pub fn is_blank(&self) -> bool {
        self.membership == Membership::default()
            && self.conf_state.is_none()
            && self.entries.is_empty()
            && self.snapshot.get_metadata().index == 0
            && self.hard_state == HardState::default()
    }
}

/// Durable storage of the raft log, hard state, conf state and snapshot,
/// written on the caller's thread. The node never calls it: it asks for
/// writes ([`Write`]) and a shell makes them, here or through an
/// `fencelock-raft`'s `AsyncEngineStore`.
pub trait Durable {
    /// Reads back what was written before a restart.
    fn recover(&mut self) -> Result<Recovered, StorageError>;

    /// Writes `batch` atomically and, unless it says it may defer that,
    /// syncs it (and every write before it) before returning.
    fn write(&mut self, batch: &WriteBatch) -> Result<(), StorageError>;
}

/// A storage failure. The driver treats every one as fatal for the node.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// raft-engine's error, boxed: the node's vocabulary does not know the
    /// engine (`fencelock-raft`'s stores do).
    #[error("raft-engine: {0}")]
    Engine(Box<dyn std::error::Error + Send + Sync>),
    #[error("stored {what} is corrupt: {detail}")]
    Corrupt { what: &'static str, detail: String },
    #[error("store is poisoned by a panic in another thread")]
    Poisoned,
    #[error("storage I/O thread: {0}")]
    Thread(String),
    #[error("write {got} handed to the store out of order (expected {expected})")]
    OutOfOrder { expected: u64, got: u64 },
    /// A snapshot file could not be written or read: the I/O error, boxed.
    #[error("snapshot file {path}: {err}")]
    SnapshotFile { path: String, err: Box<dyn std::error::Error + Send + Sync> },
}

/// The in-memory raft log that raft-rs reads through [`raft::Storage`].
#[derive(Debug, Default)]
pub struct LogCache {
    hard_state: HardState,
    conf_state: ConfState,
    /// The last snapshot, with its data; its index is where the log starts.
    snapshot: Snapshot,
    /// `entries[i].index == snapshot index + 1 + i`.
    entries: Vec<Entry>,
}

impl LogCache {
    pub fn from_recovered(recovered: Recovered) -> LogCache {
        let snapshot_index = recovered.snapshot.get_metadata().index;
        let entries: Vec<Entry> =
            recovered.entries.into_iter().filter(|entry| entry.index > snapshot_index).collect();
        LogCache {
            hard_state: recovered.hard_state,
            conf_state: recovered.conf_state.unwrap_or_default(),
            snapshot: recovered.snapshot,
            entries,
        }
    }

    pub fn snapshot_index(&self) -> u64 {
        self.snapshot.get_metadata().index
    }

    pub fn last_snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    pub fn conf_state(&self) -> &ConfState {
        &self.conf_state
    }

    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    fn last(&self) -> u64 {
        self.snapshot_index() + self.entries.len() as u64
    }

    /// Appends entries, replacing any stored suffix they conflict with.
    pub fn append(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else { return };
        let snapshot_index = self.snapshot_index();
        assert!(first.index > snapshot_index, "appending below the snapshot at {snapshot_index}");
        assert!(
            first.index <= self.last() + 1,
            "appending {} leaves a hole after {}",
            first.index,
            self.last()
        );
        self.entries.truncate((first.index - snapshot_index - 1) as usize);
        self.entries.extend_from_slice(entries);
    }

    /// Installs a snapshot received from the leader: the log restarts after it.
    pub fn install_snapshot(&mut self, snapshot: Snapshot) {
        self.conf_state = snapshot.get_metadata().get_conf_state().clone();
        let meta = snapshot.get_metadata();
        if self.hard_state.commit < meta.index {
            self.hard_state.commit = meta.index;
        }
        if self.hard_state.term < meta.term {
            self.hard_state.term = meta.term;
        }
        self.entries.clear();
        self.snapshot = snapshot;
    }

    /// Keeps a snapshot taken locally and drops the entries it covers.
    pub fn compact(&mut self, snapshot: Snapshot) {
        let index = snapshot.get_metadata().index;
        let snapshot_index = self.snapshot_index();
        assert!(index >= snapshot_index, "compaction goes backwards: {index} < {snapshot_index}");
        assert!(index <= self.last(), "compacting past the last entry");
        self.entries.drain(..(index - snapshot_index) as usize);
        self.snapshot = snapshot;
    }

    pub fn set_hard_state(&mut self, hard_state: HardState) {
        self.hard_state = hard_state;
    }

    pub fn set_commit(&mut self, commit: u64) {
        self.hard_state.commit = commit;
    }

    pub fn set_conf_state(&mut self, conf_state: ConfState) {
        self.conf_state = conf_state;
    }
}

impl raft::Storage for LogCache {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.hard_state.clone(), self.conf_state.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let snapshot_index = self.snapshot_index();
        if low <= snapshot_index {
            return Err(raft::Error::Store(RaftStorageError::Compacted));
        }
        if high > self.last() + 1 {
            return Err(raft::Error::Store(RaftStorageError::Unavailable));
        }
        let start = (low - snapshot_index - 1) as usize;
        let end = (high - snapshot_index - 1) as usize;
        let mut entries = self.entries[start..end].to_vec();
        raft::util::limit_size(&mut entries, max_size.into());
        Ok(entries)
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        let snapshot_index = self.snapshot_index();
        if index == snapshot_index {
            return Ok(self.snapshot.get_metadata().term);
        }
        if index < snapshot_index {
            return Err(raft::Error::Store(RaftStorageError::Compacted));
        }
        match self.entries.get((index - snapshot_index - 1) as usize) {
            Some(entry) => Ok(entry.term),
            None => Err(raft::Error::Store(RaftStorageError::Unavailable)),
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.snapshot_index() + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snapshot_index() < request_index {
            return Err(raft::Error::Store(RaftStorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(self.snapshot.clone())
    }
}

/// An in-memory [`Durable`] store. Clones share the same data, so a test can
/// drop a node and restart it on "the same disk".
#[derive(Debug, Default, Clone)]
pub struct MemStore {
    disk: Arc<Mutex<Recovered>>,
}

impl MemStore {
    pub fn new() -> MemStore {
        MemStore::default()
    }
}

impl Durable for MemStore {
    fn recover(&mut self) -> Result<Recovered, StorageError> {
        let disk = self.disk.lock().map_err(|_: PoisonError<_>| StorageError::Poisoned)?;
        Ok(disk.clone())
    }

    fn write(&mut self, batch: &WriteBatch) -> Result<(), StorageError> {
        let mut disk = self.disk.lock().map_err(|_: PoisonError<_>| StorageError::Poisoned)?;
        if let Some(snapshot) = &batch.snapshot {
            let index = snapshot.get_metadata().index;
            if batch.install {
                disk.entries.clear();
                disk.conf_state = Some(snapshot.get_metadata().get_conf_state().clone());
            } else {
                disk.entries.retain(|entry| entry.index > index);
            }
            disk.snapshot = snapshot.clone();
        }
        if let Some(first) = batch.entries.first() {
            disk.entries.retain(|entry| entry.index < first.index);
            disk.entries.extend_from_slice(&batch.entries);
        }
        if let Some(hard_state) = &batch.hard_state {
            disk.hard_state = hard_state.clone();
        }
        if let Some(conf_state) = &batch.conf_state {
            disk.conf_state = Some(conf_state.clone());
        }
        if let Some(membership) = &batch.membership {
            disk.membership = membership.clone();
        }
        Ok(())
    }
}
