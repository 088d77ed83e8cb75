//! Tests of the stores on disk: raft-engine's semantics across reopen, the
//! snapshot files, fsyncs reached before a write returns, and the
//! asynchronous store's order and failures.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use raft::prelude::{Entry, HardState, Snapshot};

use crate::{AsyncEngineStore, Durable, EngineStore, MemStore, Recovered, StorageError, WriteBatch};

fn entry(index: u64, term: u64) -> Entry {
    Entry { index, term, ..Default::default() }
}

fn hard_state(term: u64, commit: u64) -> HardState {
    HardState { term, commit, ..Default::default() }
}

/// Writes a log, overwrites a suffix, installs a snapshot over a longer
/// log, and reads it all back after reopening.
fn check_store_semantics(mut open: impl FnMut() -> Box<dyn Durable>) {
    let mut store = open();
    assert!(store.recover().unwrap().is_blank());
    let membership = crate::rejoin::Membership {
        known: [2, 3].into_iter().collect(),
        rejoin: Some(crate::rejoin::Floor { term: 4, last_index: 8 }),
    };
    store.write(&WriteBatch { membership: Some(membership.clone()), ..Default::default() }).unwrap();
    drop(store);
    // A store with only a rejoin floor is not blank: the node decided.
    let mut store = open();
    assert!(!store.recover().unwrap().is_blank());
    let entries: Vec<Entry> = (1..=10).map(|i| entry(i, 1)).collect();
    store.write(&WriteBatch { entries, hard_state: Some(hard_state(1, 3)), ..Default::default() }).unwrap();
    // A new leader's entries replace the suffix from 6 on.
    let replacing: Vec<Entry> = (6..=7).map(|i| entry(i, 2)).collect();
    store.write(&WriteBatch { entries: replacing, ..Default::default() }).unwrap();
    drop(store);

    let mut store = open();
    let recovered = store.recover().unwrap();
    let terms: Vec<(u64, u64)> = recovered.entries.iter().map(|e| (e.index, e.term)).collect();
    assert_eq!(terms, [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 2), (7, 2)]);
    assert_eq!(recovered.hard_state, hard_state(1, 3));

    // A snapshot from the leader at 5 replaces the whole log, suffix included.
    let mut snapshot = Snapshot::default();
    snapshot.mut_metadata().index = 5;
    snapshot.mut_metadata().term = 3;
    snapshot.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
    snapshot.set_data(fencelock_fsm::LockTable::new().snapshot().into());
    store
        .write(&WriteBatch {
            snapshot: Some(snapshot.clone()),
            install: true,
            hard_state: Some(hard_state(3, 5)),
            ..Default::default()
        })
        .unwrap();
    drop(store);

    let mut store = open();
    let recovered = store.recover().unwrap();
    assert!(recovered.entries.is_empty(), "stale suffix survived: {:?}", recovered.entries);
    assert_eq!(recovered.membership, membership, "the snapshot's install lost the membership record");
    assert_eq!(recovered.snapshot.get_metadata().index, 5);
    assert_eq!(recovered.hard_state, hard_state(3, 5));
    assert_eq!(recovered.conf_state.unwrap().voters, [1, 2, 3]);

    // Appending after the snapshot, then compacting with a local snapshot.
    let after: Vec<Entry> = (6..=12).map(|i| entry(i, 3)).collect();
    store.write(&WriteBatch { entries: after, ..Default::default() }).unwrap();
    let mut local = snapshot.clone();
    local.mut_metadata().index = 9;
    store.write(&WriteBatch { snapshot: Some(local), install: false, ..Default::default() }).unwrap();
    drop(store);
    let recovered = open().recover().unwrap();
    let indexes: Vec<u64> = recovered.entries.iter().map(|e| e.index).collect();
    assert_eq!(indexes, [10, 11, 12]);
    assert_eq!(recovered.snapshot.get_metadata().index, 9);
}

#[test]
fn the_engine_store_keeps_raft_log_semantics_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    check_store_semantics(move || Box::new(EngineStore::open(&path).unwrap()));
}

#[test]
fn snapshot_data_lives_in_a_file_of_its_own_and_only_the_latest_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = |index: u64, data: &[u8]| {
        let mut snapshot = Snapshot::default();
        snapshot.set_data(data.to_vec().into());
        snapshot.mut_metadata().index = index;
        snapshot.mut_metadata().term = 1;
        snapshot.mut_metadata().set_conf_state(raft::prelude::ConfState::from((vec![1], vec![])));
        snapshot
    };
    let files = || {
        let mut names: Vec<String> = std::fs::read_dir(dir.path().join("snapshots"))
            .unwrap()
            .map(|file| file.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    let mut store = EngineStore::open(dir.path()).unwrap();
    store
        .write(&WriteBatch { entries: (1..=20).map(|i| entry(i, 1)).collect(), ..Default::default() })
        .unwrap();
    let big = vec![7u8; 1 << 20];
    store.write(&WriteBatch { snapshot: Some(snapshot(5, &big)), ..Default::default() }).unwrap();
    store.write(&WriteBatch { snapshot: Some(snapshot(10, b"newer")), ..Default::default() }).unwrap();
    assert_eq!(files(), vec![crate::storage::snapshot_file_name(10, 1)]);
    drop(store);
    let mut store = EngineStore::open(dir.path()).unwrap();
    let recovered = store.recover().unwrap();
    assert_eq!(recovered.snapshot.get_metadata().index, 10);
    assert_eq!(recovered.snapshot.get_data(), b"newer");
    assert_eq!(recovered.entries.first().map(|entry| entry.index), Some(11));
    drop(store);
    // A snapshot file gone missing is a clear error, not an empty table.
    std::fs::remove_file(dir.path().join("snapshots").join(&files()[0])).unwrap();
    let err = EngineStore::open(dir.path()).unwrap().recover().unwrap_err();
    assert!(matches!(err, StorageError::SnapshotFile { .. }), "{err}");
    assert!(err.to_string().contains("snapshot-"), "{err}");
}

#[test]
fn the_engine_store_tells_blank_without_reading_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let open = || EngineStore::open(dir.path()).unwrap();
    assert!(open().is_blank().unwrap());
    // Each kind of record alone makes it not blank.
    let membership = crate::rejoin::Membership {
        rejoin: Some(crate::rejoin::Floor { term: 1, last_index: 1 }),
        ..Default::default()
    };
    let conf_state = raft::prelude::ConfState::from((vec![1], vec![]));
    let batches = [
        WriteBatch { membership: Some(membership), ..Default::default() },
        WriteBatch { entries: vec![entry(1, 1)], ..Default::default() },
        WriteBatch { hard_state: Some(hard_state(1, 0)), ..Default::default() },
        WriteBatch { conf_state: Some(conf_state), ..Default::default() },
    ];
    for (i, batch) in batches.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = EngineStore::open(dir.path()).unwrap();
        store.write(&batch).unwrap();
        drop(store);
        let mut store = EngineStore::open(dir.path()).unwrap();
        assert!(!store.is_blank().unwrap(), "batch {i}");
        assert!(!store.recover().unwrap().is_blank(), "batch {i}: the two views disagree");
    }
}

/// A progress callback that wakes no one.
fn nowhere() -> Box<dyn Fn() + Send> {
    Box::new(|| {})
}

/// An [`AsyncEngineStore`] as a [`Durable`]: each write is submitted in
/// order; `urgent` asks for inline writes.
struct Submitting {
    store: AsyncEngineStore,
    recovered: Option<Recovered>,
    submitted: u64,
    urgent: bool,
}

impl Submitting {
    fn spawn(dir: &std::path::Path) -> (Submitting, crossbeam_channel::Receiver<crate::Persisted>) {
        let (store, recovered, progress) =
            AsyncEngineStore::spawn(EngineStore::open(dir).unwrap(), "io".into(), nowhere()).unwrap();
        (Submitting { store, recovered: Some(recovered), submitted: 0, urgent: false }, progress)
    }

    /// Submits `batch`; whether it was made inline.
    fn submit(&mut self, batch: WriteBatch) -> bool {
        self.submitted += 1;
        let write = crate::Write { n: self.submitted, batch, urgent: self.urgent };
        self.store.submit(write).unwrap()
    }
}

impl Durable for Submitting {
    fn recover(&mut self) -> Result<Recovered, StorageError> {
        Ok(self.recovered.take().expect("recovered once"))
    }

    fn write(&mut self, batch: &WriteBatch) -> Result<(), StorageError> {
        self.submit(batch.clone());
        Ok(())
    }
}

#[test]
fn the_asynchronous_engine_store_refuses_a_write_out_of_order() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _progress) = Submitting::spawn(dir.path());
    let skipped = crate::Write { n: 2, batch: WriteBatch::default(), urgent: false };
    let result = store.store.submit(skipped);
    assert!(matches!(result, Err(StorageError::OutOfOrder { expected: 1, got: 2 })), "{result:?}");
}

#[test]
fn the_asynchronous_engine_store_keeps_raft_log_semantics_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    // Dropping the store lets its I/O thread write what is queued first.
    check_store_semantics(move || Box::new(Submitting::spawn(&path).0));
}

#[test]
fn the_asynchronous_engine_store_reports_each_write_durable_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, progress) = Submitting::spawn(dir.path());
    for index in 1..=50 {
        assert!(!store.submit(WriteBatch { entries: vec![entry(index, 1)], ..Default::default() }));
    }
    let mut last = 0;
    while last < 50 {
        let durable = progress.recv_timeout(std::time::Duration::from_secs(10)).unwrap().unwrap();
        assert!(durable > last, "progress went from {last} to {durable}");
        last = durable;
    }
    assert_eq!(last, 50);
    let syncs = store.store.syncs();
    assert!((1..=50).contains(&syncs), "{syncs} syncs for 50 writes");
    drop(store);
    let recovered = EngineStore::open(dir.path()).unwrap().recover().unwrap();
    assert_eq!(recovered.entries.len(), 50);
}

#[test]
fn inline_writes_are_durable_at_once_and_never_overtake_queued_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, progress) = Submitting::spawn(dir.path());
    // Alone, an urgent write is made inline, durable when `submit` returns.
    store.urgent = true;
    assert!(store.submit(WriteBatch { entries: vec![entry(1, 1)], ..Default::default() }));
    assert_eq!(store.store.durable(), 1);
    // Mixed with queued writes, in bursts: an inline write waits its turn
    // (it is queued while the I/O thread has work), so the log stays in
    // order, and the durable count only grows and never passes the writes.
    let mut written = 1;
    let mut last_durable = 1;
    for index in 2..=400u64 {
        store.urgent = index % 3 == 0;
        let inline = store.submit(WriteBatch { entries: vec![entry(index, 1)], ..Default::default() });
        written += 1;
        let durable = store.store.durable();
        assert!(!inline || durable == written, "made inline, yet only {durable} of {written} durable");
        assert!(durable >= last_durable && durable <= written, "durable {durable} after {written} writes");
        last_durable = durable;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.store.durable() != written {
        assert!(std::time::Instant::now() < deadline, "never all durable: {}", store.store.durable());
        let _ = progress.recv_timeout(std::time::Duration::from_millis(10));
    }
    drop(store);
    let recovered = EngineStore::open(dir.path()).unwrap().recover().unwrap();
    let indexes: Vec<u64> = recovered.entries.iter().map(|entry| entry.index).collect();
    assert_eq!(indexes, (1..=400).collect::<Vec<u64>>());
}

#[test]
fn the_memory_store_keeps_raft_log_semantics_across_reopen() {
    let store = MemStore::new();
    check_store_semantics(move || Box::new(store.clone()));
}

/// raft-engine's default file system, counting the fsyncs of its files,
/// and failing them while `fail` is set.
struct CountingFileSystem {
    inner: raft_engine::env::DefaultFileSystem,
    syncs: Arc<std::sync::atomic::AtomicU64>,
    fail: Arc<std::sync::atomic::AtomicBool>,
}

impl CountingFileSystem {
    fn new() -> CountingFileSystem {
        CountingFileSystem {
            inner: raft_engine::env::DefaultFileSystem,
            syncs: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            fail: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }
}

/// A file handle that counts its syncs.
struct CountingHandle {
    inner: Arc<<raft_engine::env::DefaultFileSystem as raft_engine::env::FileSystem>::Handle>,
    syncs: Arc<std::sync::atomic::AtomicU64>,
    fail: Arc<std::sync::atomic::AtomicBool>,
}

impl raft_engine::env::Handle for CountingHandle {
    fn truncate(&self, offset: usize) -> std::io::Result<()> {
        self.inner.truncate(offset)
    }

    fn file_size(&self) -> std::io::Result<usize> {
        self.inner.file_size()
    }

    fn sync(&self) -> std::io::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("injected fsync failure"));
        }
        self.inner.sync()?;
        self.syncs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

impl raft_engine::env::FileSystem for CountingFileSystem {
    type Handle = CountingHandle;
    type Reader = <raft_engine::env::DefaultFileSystem as raft_engine::env::FileSystem>::Reader;
    type Writer = <raft_engine::env::DefaultFileSystem as raft_engine::env::FileSystem>::Writer;

    fn create<P: AsRef<std::path::Path>>(&self, path: P) -> std::io::Result<CountingHandle> {
        let inner = Arc::new(self.inner.create(path)?);
        Ok(CountingHandle { inner, syncs: Arc::clone(&self.syncs), fail: Arc::clone(&self.fail) })
    }

    fn open<P: AsRef<std::path::Path>>(
        &self,
        path: P,
        perm: raft_engine::env::Permission,
    ) -> std::io::Result<CountingHandle> {
        let inner = Arc::new(self.inner.open(path, perm)?);
        Ok(CountingHandle { inner, syncs: Arc::clone(&self.syncs), fail: Arc::clone(&self.fail) })
    }

    fn delete<P: AsRef<std::path::Path>>(&self, path: P) -> std::io::Result<()> {
        self.inner.delete(path)
    }

    fn rename<P: AsRef<std::path::Path>>(&self, src_path: P, dst_path: P) -> std::io::Result<()> {
        self.inner.rename(src_path, dst_path)
    }

    fn new_reader(&self, handle: Arc<CountingHandle>) -> std::io::Result<Self::Reader> {
        self.inner.new_reader(Arc::clone(&handle.inner))
    }

    fn new_writer(&self, handle: Arc<CountingHandle>) -> std::io::Result<Self::Writer> {
        self.inner.new_writer(Arc::clone(&handle.inner))
    }
}

#[test]
fn every_synced_write_of_the_engine_store_reaches_an_fsync_before_it_returns() {
    // The store's counters cannot tell a skipped fsync; the file system can.
    let dir = tempfile::tempdir().unwrap();
    let file_system = Arc::new(CountingFileSystem::new());
    let syncs = Arc::clone(&file_system.syncs);
    let mut store = EngineStore::open_with_file_system(dir.path(), file_system).unwrap();
    for index in 1..=20 {
        let before = syncs.load(Ordering::SeqCst);
        let entries = [entry(index, 1)];
        store.write(&WriteBatch { entries: entries.to_vec(), ..Default::default() }).unwrap();
        assert!(syncs.load(Ordering::SeqCst) > before, "write {index} returned without an fsync");
    }
    // A write that may defer its sync is not synced on its own.
    let before = syncs.load(Ordering::SeqCst);
    let entries = [entry(21, 1)];
    store
        .write(&WriteBatch { entries: entries.to_vec(), may_defer_sync: true, ..Default::default() })
        .unwrap();
    assert_eq!(syncs.load(Ordering::SeqCst), before, "a deferrable write was synced");
}

#[test]
fn a_failed_fsync_stops_the_asynchronous_store_at_once_and_nothing_after_it_is_durable() {
    /// Lets fsyncs succeed again when the test ends, however it ends: the
    /// engine syncs as it closes.
    struct Heal(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Heal {
        fn drop(&mut self) {
            self.0.store(false, Ordering::SeqCst);
        }
    }
    /// Waits until the owner has been woken `times` times.
    fn woken_at_least(woken: &std::sync::atomic::AtomicU64, times: u64) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while woken.load(Ordering::SeqCst) < times {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        true
    }

    let dir = tempfile::tempdir().unwrap();
    let file_system = Arc::new(CountingFileSystem::new());
    let fail = Arc::clone(&file_system.fail);
    let store = EngineStore::open_with_file_system(dir.path(), file_system).unwrap();
    let woken = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let wake = Arc::clone(&woken);
    let progress = Box::new(move || {
        wake.fetch_add(1, Ordering::SeqCst);
    });
    let (mut store, _, persisted) = AsyncEngineStore::spawn(store, "io".into(), progress).unwrap();
    // Dropped before the store.
    let _heal = Heal(Arc::clone(&fail));
    let write = |n: u64| crate::Write {
        n,
        batch: WriteBatch { entries: vec![entry(n, 1)], ..Default::default() },
        urgent: false,
    };
    assert!(!store.submit(write(1)).unwrap());
    assert_eq!(persisted.recv_timeout(std::time::Duration::from_secs(10)).unwrap().unwrap(), 1);
    assert!(woken_at_least(&woken, 1));

    // raft-engine panics when an fsync fails: the owner hears it at once,
    // and is woken for it, rather than at its next write.
    fail.store(true, Ordering::SeqCst);
    assert!(!store.submit(write(2)).unwrap());
    match persisted.recv_timeout(std::time::Duration::from_secs(10)).unwrap() {
        Err(StorageError::Thread(message)) => assert!(message.contains("panicked"), "{message}"),
        other => panic!("a failed fsync was reported as {other:?}"),
    }
    assert!(woken_at_least(&woken, 2), "the owner was not woken for the failure");
    assert_eq!(store.durable(), 1, "a write whose fsync failed was counted durable");
    // Nothing more is taken, urgent or not.
    assert!(store.submit(write(3)).is_err());
    let urgent = crate::Write { urgent: true, ..write(4) };
    assert!(store.submit(urgent).is_err());
}

#[test]
fn a_corrupt_snapshot_file_stops_the_node_with_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut table = fencelock_fsm::LockTable::at_level(1);
    table.apply(fencelock_types::Command::Grant {
        key: fencelock_types::Key::new(b"k".to_vec()).unwrap(),
        lease_ms: fencelock_types::LeaseMs::new(1_000).unwrap(),
        owner: fencelock_types::Owner::new(b"o".to_vec()).unwrap(),
        value: fencelock_types::Value::none(),
        session: None,
    });
    let mut snapshot = Snapshot::default();
    snapshot.mut_metadata().index = 5;
    snapshot.mut_metadata().term = 1;
    snapshot.mut_metadata().mut_conf_state().voters = vec![1];
    snapshot.set_data(table.snapshot().into());
    let mut store = EngineStore::open(dir.path()).unwrap();
    let batch = WriteBatch {
        snapshot: Some(snapshot),
        install: true,
        hard_state: Some(hard_state(1, 5)),
        ..Default::default()
    };
    store.write(&batch).unwrap();
    drop(store);
    let open = || {
        let recovered = EngineStore::open(dir.path()).unwrap().recover().unwrap();
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        crate::Replica::open(crate::Config::new(crate::NodeId(1), vec![crate::NodeId(1)]), recovered, &logger)
    };
    assert!(open().is_ok(), "the intact snapshot restores");
    // One byte of the body flipped on disk: the checksum fails at open.
    let path = dir.path().join("snapshots").join(crate::storage::snapshot_file_name(5, 1));
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    let err = open().unwrap_err();
    assert!(matches!(err, crate::FatalError::StoredSnapshot { .. }), "{err}");
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
}
