//! Raft log storage on disk: [`EngineStore`] (raft-engine, synced before
//! `write` returns) and [`AsyncEngineStore`] (the same behind an I/O thread
//! that syncs groups of writes), the shell's side of the node's writes
//! ([`Write`]). The vocabulary (the writes, [`Durable`], [`Recovered`], the
//! in-memory [`MemStore`]) is the node's, in `fencelock-node`.

use std::path::Path;
use std::sync::Arc;

use fencelock_node::rejoin::Membership;
use fencelock_node::{Durable, Recovered, StorageError, Write, WriteBatch};
use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, HardState, Snapshot};

/// raft-engine's error, as a store's.
fn engine(err: raft_engine::Error) -> StorageError {
    StorageError::Engine(Box::new(err))
}

/// The production [`Durable`] store: raft-engine in a directory, every write
/// synced unless it may defer its sync.
///
/// Generic over raft-engine's file system only so that a test can count its
/// fsyncs; everything else uses the default.
///
/// A snapshot's table is a file of its own in `<dir>/snapshots`
/// (`snapshot-<index>-<term>.snap`, written, synced and renamed into place
/// before the log names it); the log keeps its metadata only. raft-engine
/// holds every value in memory and rewrites live ones when it purges, which
/// for the table of a million locks (1.3 GB) cost that much memory again.
pub struct EngineStore<F: raft_engine::env::FileSystem = raft_engine::env::DefaultFileSystem> {
    engine: raft_engine::Engine<F>,
    /// Where snapshot files go.
    snapshots: std::path::PathBuf,
    /// Local snapshots written since the last purge of obsolete log files.
    compactions_since_purge: u32,
}

impl<F: raft_engine::env::FileSystem> std::fmt::Debug for EngineStore<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineStore").field("dir", &self.engine.path()).finish()
    }
}

/// The one raft group this store holds.
const GROUP: u64 = 1;
/// The membership record lives in a group of its own, which a snapshot's
/// install (a `Clean` of the raft group) leaves alone.
const MEMBERSHIP_GROUP: u64 = 2;
const MEMBERSHIP_KEY: &[u8] = b"membership";
const HARD_STATE_KEY: &[u8] = b"hard_state";
const CONF_STATE_KEY: &[u8] = b"conf_state";
const SNAPSHOT_KEY: &[u8] = b"snapshot";
/// How many local snapshots pass between purges of obsolete log files.
const PURGE_EVERY_COMPACTIONS: u32 = 8;

#[derive(Clone, Debug)]
struct EntryExt;

impl raft_engine::MessageExt for EntryExt {
    type Entry = Entry;

    fn index(entry: &Entry) -> u64 {
        entry.index
    }
}

impl EngineStore {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path) -> Result<EngineStore, StorageError> {
        let config = raft_engine::Config {
            dir: dir.to_string_lossy().into_owned(),
            // A torn write at the tail (a crash mid-write) is dropped; it was
            // never synced, so nothing was acknowledged from it.
            recovery_mode: raft_engine::RecoveryMode::TolerateTailCorruption,
            // No LZ4: entries are small, and compressing a snapshot of a
            // large table held the I/O thread (and every write queued
            // behind it) for seconds.
            batch_compression_threshold: raft_engine::ReadableSize(0),
            ..Default::default()
        };
        let engine = raft_engine::Engine::open(config).map_err(engine)?;
        EngineStore::with_engine(engine, dir)
    }
}

#[cfg(test)]
impl<F: raft_engine::env::FileSystem> EngineStore<F> {
    /// Opens the store on `file_system` (a test's, which counts fsyncs).
    pub(crate) fn open_with_file_system(
        dir: &Path,
        file_system: Arc<F>,
    ) -> Result<EngineStore<F>, StorageError> {
        let config = raft_engine::Config {
            dir: dir.to_string_lossy().into_owned(),
            recovery_mode: raft_engine::RecoveryMode::TolerateTailCorruption,
            // No LZ4: entries are small, and compressing a snapshot of a
            // large table held the I/O thread (and every write queued
            // behind it) for seconds.
            batch_compression_threshold: raft_engine::ReadableSize(0),
            ..Default::default()
        };
        let engine = raft_engine::Engine::open_with_file_system(config, file_system).map_err(engine)?;
        EngineStore::with_engine(engine, dir)
    }
}

/// The name of the file that holds the data of the snapshot at `index`.
pub(crate) fn snapshot_file_name(index: u64, term: u64) -> String {
    format!("snapshot-{index:020}-{term:020}.snap")
}

fn file_error(path: &Path) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
    move |err| StorageError::SnapshotFile { path: path.display().to_string(), err: Box::new(err) }
}

impl<F: raft_engine::env::FileSystem> EngineStore<F> {
    fn with_engine(engine: raft_engine::Engine<F>, dir: &Path) -> Result<EngineStore<F>, StorageError> {
        let snapshots = dir.join("snapshots");
        std::fs::create_dir_all(&snapshots).map_err(file_error(&snapshots))?;
        Ok(EngineStore { engine, snapshots, compactions_since_purge: 0 })
    }

    /// Writes a snapshot's data to its file, durably: a temporary file,
    /// synced, renamed into place, and the directory synced.
    fn write_snapshot_file(&self, snapshot: &Snapshot) -> Result<(), StorageError> {
        use std::io::Write as _;
        let metadata = snapshot.get_metadata();
        let path = self.snapshots.join(snapshot_file_name(metadata.index, metadata.term));
        let partial = path.with_extension("partial");
        let mut file = std::fs::File::create(&partial).map_err(file_error(&partial))?;
        file.write_all(snapshot.get_data()).map_err(file_error(&partial))?;
        file.sync_all().map_err(file_error(&partial))?;
        drop(file);
        std::fs::rename(&partial, &path).map_err(file_error(&path))?;
        std::fs::File::open(&self.snapshots)
            .and_then(|dir| dir.sync_all())
            .map_err(file_error(&self.snapshots))
    }

    /// Removes every snapshot file but the one of `keep` (index, term):
    /// once the log names that one durably, the others are garbage. Best
    /// effort; a file left behind is removed next time.
    fn remove_other_snapshot_files(&self, keep: (u64, u64)) {
        let keep = snapshot_file_name(keep.0, keep.1);
        let Ok(files) = std::fs::read_dir(&self.snapshots) else { return };
        for file in files.flatten() {
            if file.file_name().to_str() != Some(keep.as_str()) {
                let _ = std::fs::remove_file(file.path());
            }
        }
    }

    /// Whether the store was never written ([`Recovered::is_blank`]),
    /// without reading the log.
    pub fn is_blank(&self) -> Result<bool, StorageError> {
        let hard_state: Option<HardState> = self.engine.get_message(GROUP, HARD_STATE_KEY).map_err(engine)?;
        let conf_state: Option<ConfState> = self.engine.get_message(GROUP, CONF_STATE_KEY).map_err(engine)?;
        Ok(hard_state.is_none_or(|hard_state| hard_state == HardState::default())
            && conf_state.is_none()
            && self.engine.get(GROUP, SNAPSHOT_KEY).is_none()
            && self.engine.first_index(GROUP).is_none()
            && self.engine.get(MEMBERSHIP_GROUP, MEMBERSHIP_KEY).is_none())
    }
}

impl<F: raft_engine::env::FileSystem> Durable for EngineStore<F> {
    fn recover(&mut self) -> Result<Recovered, StorageError> {
        let hard_state: HardState =
            self.engine.get_message(GROUP, HARD_STATE_KEY).map_err(engine)?.unwrap_or_default();
        let conf_state: Option<ConfState> = self.engine.get_message(GROUP, CONF_STATE_KEY).map_err(engine)?;
        let mut snapshot: Snapshot =
            self.engine.get_message(GROUP, SNAPSHOT_KEY).map_err(engine)?.unwrap_or_default();
        let metadata = snapshot.get_metadata();
        let mut snapshot_file = None;
        // Stores written before snapshot files keep the data in the log.
        if metadata.index > 0 && snapshot.get_data().is_empty() {
            let path = self.snapshots.join(snapshot_file_name(metadata.index, metadata.term));
            let data = std::fs::read(&path).map_err(file_error(&path))?;
            snapshot.set_data(data.into());
            snapshot_file = Some(path.display().to_string());
        }
        let mut entries = Vec::new();
        if let (Some(first), Some(last)) = (self.engine.first_index(GROUP), self.engine.last_index(GROUP)) {
            self.engine
                .fetch_entries_to::<EntryExt>(GROUP, first, last + 1, None, &mut entries)
                .map_err(engine)?;
        }
        let snapshot_index = snapshot.get_metadata().index;
        entries.retain(|entry| entry.index > snapshot_index);
        if let Some(first) = entries.first() {
            if first.index != snapshot_index + 1 {
                return Err(StorageError::Corrupt {
                    what: "raft log",
                    detail: format!("log starts at {} after a snapshot at {snapshot_index}", first.index),
                });
            }
        }
        let membership = match self.engine.get(MEMBERSHIP_GROUP, MEMBERSHIP_KEY) {
            Some(bytes) => Membership::decode(&bytes)
                .map_err(|err| StorageError::Corrupt { what: "membership record", detail: err.0 })?,
            None => Membership::default(),
        };
        Ok(Recovered { hard_state, conf_state, snapshot, entries, membership, snapshot_file })
    }

    fn write(&mut self, batch: &WriteBatch) -> Result<(), StorageError> {
        self.write_synced(batch, !batch.may_defer_sync)
    }
}

impl<F: raft_engine::env::FileSystem> EngineStore<F> {
    /// Writes `batch`, synced or not as `sync` says (a group of writes is
    /// synced once, at its last).
    fn write_synced(&mut self, batch: &WriteBatch, sync: bool) -> Result<(), StorageError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut log_batch = raft_engine::LogBatch::default();
        let mut compacted = false;
        let mut written_file = None;
        if let Some(snapshot) = &batch.snapshot {
            let index = snapshot.get_metadata().index;
            // The data first, in a file of its own; the log names it below.
            self.write_snapshot_file(snapshot)?;
            written_file = Some((index, snapshot.get_metadata().term));
            if batch.install {
                // Drop the whole old log, including any suffix past the
                // snapshot, then write the group's state afresh below.
                log_batch.add_command(GROUP, raft_engine::Command::Clean);
                if batch.hard_state.is_none() {
                    let hard_state: HardState =
                        self.engine.get_message(GROUP, HARD_STATE_KEY).map_err(engine)?.unwrap_or_default();
                    log_batch.put_message(GROUP, HARD_STATE_KEY.to_vec(), &hard_state).map_err(engine)?;
                }
                let conf_state = snapshot.get_metadata().get_conf_state();
                if batch.conf_state.is_none() {
                    log_batch.put_message(GROUP, CONF_STATE_KEY.to_vec(), conf_state).map_err(engine)?;
                }
            } else {
                log_batch.add_command(GROUP, raft_engine::Command::Compact { index: index + 1 });
                compacted = true;
            }
            let mut metadata_only = Snapshot::default();
            metadata_only.set_metadata(snapshot.get_metadata().clone());
            log_batch
                .put(GROUP, SNAPSHOT_KEY.to_vec(), metadata_only.write_to_bytes().map_err(corrupt_snapshot)?)
                .map_err(engine)?;
        }
        if !batch.entries.is_empty() {
            log_batch.add_entries::<EntryExt>(GROUP, &batch.entries).map_err(engine)?;
        }
        if let Some(hard_state) = &batch.hard_state {
            log_batch.put_message(GROUP, HARD_STATE_KEY.to_vec(), hard_state).map_err(engine)?;
        }
        if let Some(conf_state) = &batch.conf_state {
            log_batch.put_message(GROUP, CONF_STATE_KEY.to_vec(), conf_state).map_err(engine)?;
        }
        if let Some(membership) = &batch.membership {
            log_batch.put(MEMBERSHIP_GROUP, MEMBERSHIP_KEY.to_vec(), membership.encode()).map_err(engine)?;
        }
        // A batch that names a new snapshot file is synced: the old files
        // go once it is durable.
        self.engine.write(&mut log_batch, sync || written_file.is_some()).map_err(engine)?;
        if let Some(keep) = written_file {
            self.remove_other_snapshot_files(keep);
        }
        if compacted {
            self.compactions_since_purge += 1;
            if self.compactions_since_purge >= PURGE_EVERY_COMPACTIONS {
                self.compactions_since_purge = 0;
                self.engine.purge_expired_files().map_err(engine)?;
            }
        }
        Ok(())
    }
}

/// What the I/O thread of an [`AsyncEngineStore`] reports: the count of
/// writes since open that are durable, or the failure that ended it.
pub type Persisted = Result<u64, StorageError>;

/// [`EngineStore`] behind an I/O thread, the shell's side of the node's
/// writes in production. [`AsyncEngineStore::submit`] queues a write and
/// returns at once; the thread writes what is queued in order, syncing
/// once for all of it (group commit), and reports the count of durable
/// writes on the channel [`AsyncEngineStore::spawn`] returns. The node
/// thus goes on stepping and proposing while the disk syncs.
///
/// An urgent write ([`Write::urgent`], a follower's) is made on the
/// caller's thread instead whenever the I/O thread has nothing queued, so
/// that order holds: every write is made after all writes before it.
#[derive(Debug)]
pub struct AsyncEngineStore<F: raft_engine::env::FileSystem = raft_engine::env::DefaultFileSystem> {
    /// `None` only while dropping.
    jobs: Option<crossbeam_channel::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The engine, used by the I/O thread and by inline writes, never both
    /// at once: inline writes wait for `outstanding` to be 0.
    store: Arc<std::sync::Mutex<EngineStore<F>>>,
    /// Shared with the I/O thread.
    counts: Arc<Counts>,
    /// Writes submitted since open: the next must be numbered one more.
    submitted: u64,
}

/// What an [`AsyncEngineStore`] and its I/O thread both count.
#[derive(Debug, Default)]
struct Counts {
    /// Syncs done.
    syncs: std::sync::atomic::AtomicU64,
    /// Writes durable since open.
    durable: std::sync::atomic::AtomicU64,
    /// Jobs queued and not yet done by the I/O thread (its last act on a
    /// group is to count it out).
    outstanding: std::sync::atomic::AtomicU64,
    /// The I/O thread failed: set before it reports the failure, so that
    /// whoever heard of it finds every later write refused.
    failed: std::sync::atomic::AtomicBool,
}

impl<F: raft_engine::env::FileSystem> Drop for AsyncEngineStore<F> {
    /// Lets the I/O thread finish what is queued and close the engine, so
    /// that the directory can be opened again at once.
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<F: raft_engine::env::FileSystem + 'static> AsyncEngineStore<F> {
    /// Recovers `store`, then hands it to a thread named `name`, which
    /// calls `progress` after each report it sends (to wake the owner's
    /// loop: one call per synced group). Returns what was recovered, for
    /// the node, and the channel of reports.
    pub fn spawn(
        mut store: EngineStore<F>,
        name: String,
        progress: Box<dyn Fn() + Send>,
    ) -> Result<(AsyncEngineStore<F>, Recovered, crossbeam_channel::Receiver<Persisted>), StorageError> {
        let recovered = store.recover()?;
        let (jobs, queued) = crossbeam_channel::unbounded::<Job>();
        let (report, persisted) = crossbeam_channel::unbounded();
        let store = Arc::new(std::sync::Mutex::new(store));
        let counts = Arc::new(Counts::default());
        let (thread_store, thread_counts) = (Arc::clone(&store), Arc::clone(&counts));
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let progress = progress.as_ref();
                let failed = report.clone();
                stop_loudly(&failed, progress, &thread_counts, || {
                    write_queued(&thread_store, &queued, &report, progress, &thread_counts)
                })
            })
            .map_err(|err| StorageError::Thread(format!("cannot start: {err}")))?;
        let store = AsyncEngineStore { jobs: Some(jobs), thread: Some(thread), store, counts, submitted: 0 };
        Ok((store, recovered, persisted))
    }

    /// Takes write `write.n`: `Ok(true)` when it is durable already (made
    /// inline), `Ok(false)` when queued, to be reported on the channel.
    pub fn submit(&mut self, write: Write) -> Result<bool, StorageError> {
        if self.counts.failed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StorageError::Thread("stopped after a failed write".into()));
        }
        let expected = self.submitted + 1;
        if write.n != expected {
            return Err(StorageError::OutOfOrder { expected, got: write.n });
        }
        self.submitted = write.n;
        if write.urgent && self.write_inline(&write.batch)? {
            return Ok(true);
        }
        self.counts.outstanding.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let sent =
            self.jobs.as_ref().is_some_and(|jobs| jobs.send(Job::Write(Box::new(write.batch))).is_ok());
        if sent {
            Ok(false)
        } else {
            Err(StorageError::Thread("stopped after a failed write".into()))
        }
    }

    /// The writes durable so far, those made inline included.
    pub fn durable(&self) -> u64 {
        self.counts.durable.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The syncs done so far (each covers a group of writes).
    pub fn syncs(&self) -> u64 {
        self.counts.syncs.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Writes `batch` on this thread if the I/O thread has nothing to do:
    /// `Ok(false)` when it did not.
    fn write_inline(&mut self, batch: &WriteBatch) -> Result<bool, StorageError> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.counts.outstanding.load(SeqCst) != 0 {
            return Ok(false);
        }
        let mut store =
            self.store.lock().map_err(|_| StorageError::Thread("the I/O thread panicked".into()))?;
        store.write(batch)?;
        if !batch.may_defer_sync {
            self.counts.syncs.fetch_add(1, SeqCst);
        }
        self.counts.durable.fetch_add(1, SeqCst);
        Ok(true)
    }
}

/// What the shell hands the I/O thread, in order.
#[derive(Debug)]
enum Job {
    Write(Box<WriteBatch>),
}

/// The I/O thread: everything queued goes out in one group, synced once;
/// then its writes are reported durable (the node holds the messages that
/// wait for them until it hears so).
fn write_queued<F: raft_engine::env::FileSystem>(
    store: &std::sync::Mutex<EngineStore<F>>,
    queued: &crossbeam_channel::Receiver<Job>,
    report: &crossbeam_channel::Sender<Persisted>,
    progress: &dyn Fn(),
    counts: &Counts,
) {
    use std::sync::atomic::Ordering::SeqCst;
    let mut group = Vec::new();
    // Ends when the owner (the only sender) is dropped.
    while let Ok(first) = queued.recv() {
        group.clear();
        group.push(first);
        group.extend(queued.try_iter());
        let jobs = group.len() as u64;
        let Ok(mut store) = store.lock() else {
            counts.failed.store(true, SeqCst);
            let _ = report.send(Err(StorageError::Thread("the engine's lock is poisoned".into())));
            progress();
            return;
        };
        let sync_at = group.iter().rposition(|Job::Write(batch)| !batch.may_defer_sync);
        let mut written = 0;
        for (at, Job::Write(batch)) in group.iter().enumerate() {
            // One sync, at the last write that needs one, makes every
            // write before it durable too.
            if let Err(err) = store.write_synced(batch, Some(at) == sync_at) {
                // The owner stops at once: nothing after this is durable.
                counts.failed.store(true, SeqCst);
                let _ = report.send(Err(err));
                progress();
                return;
            }
            written += 1;
        }
        drop(store);
        if sync_at.is_some() {
            counts.syncs.fetch_add(1, SeqCst);
        }
        let durable = counts.durable.fetch_add(written, SeqCst) + written;
        // No one listening is no reason to stop writing what was queued.
        let _ = report.send(Ok(durable));
        // After the report: an owner's event loop is woken once a group.
        progress();
        // The last act on a group: from here an inline write may follow.
        counts.outstanding.fetch_sub(jobs, SeqCst);
    }
}

/// Runs the I/O thread's `body`; if it panics (raft-engine panics when an
/// fsync fails, rather than go on with a log it cannot trust), reports the
/// failure and wakes the owner, so that the node stops at once instead of
/// at its next write, having acknowledged nothing the disk did not keep.
fn stop_loudly(
    report: &crossbeam_channel::Sender<Persisted>,
    progress: &dyn Fn(),
    counts: &Counts,
    body: impl FnOnce(),
) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        counts.failed.store(true, std::sync::atomic::Ordering::SeqCst);
        let what = panic
            .downcast_ref::<&str>()
            .map(|text| (*text).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_owned());
        let _ = report.send(Err(StorageError::Thread(format!("the I/O thread panicked: {what}"))));
        progress();
    }
}

fn corrupt_snapshot(err: protobuf::ProtobufError) -> StorageError {
    StorageError::Corrupt { what: "snapshot", detail: err.to_string() }
}
