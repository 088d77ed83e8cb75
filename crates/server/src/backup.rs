//! Backups (`fencelock snapshot save`): a consistent copy of the lock table,
//! served in chunks.
//!
//! The first request of a backup (backup id 0) becomes a linearizable read
//! of the whole table (`Query::Table`, through ReadIndex on the leader: the
//! copy holds every lock acknowledged before the request). The node loop
//! answers it with a clone of the table (O(1)); the clone is encoded in the
//! lock table's snapshot format on a thread of its own, never on the loop,
//! and kept here while the client fetches it, chunk by chunk, naming the
//! backup's id and the offset it wants. A backup is dropped once its last
//! chunk is answered, or [`BACKUP_IDLE`] after its last request; at most
//! [`BACKUPS_MAX`] are kept (or being encoded) at once.
//!
//! [`Cache`] is the bookkeeping, without threads or clocks of its own (time
//! is an argument), so that its bounds are tested alone.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use fencelock_fsm::LockTable;
use fencelock_net::{error_response, ResponseSink};
use fencelock_raft::reply::TableAt;
use fencelock_raft::shell::Responder;
use fencelock_raft::{Answer, NodeId, Reply};
use fencelock_types::client_pb::{self as proto, ErrorCode, Response_oneof_kind as Out};
use fencelock_types::FencingToken;
use slog::{info, warn, Logger};

use crate::errors::error_to_response;

/// The most bytes one chunk carries: well below the client's frame limit
/// (16 MiB), and small enough not to hold the loop while it is written.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Backups kept, or being encoded, at once. Each holds a whole encoded
/// table in memory (about 1,300 bytes a lock at worst).
pub const BACKUPS_MAX: usize = 2;

/// A backup is dropped this long after its last request.
pub const BACKUP_IDLE: Duration = Duration::from_secs(60);

/// A backup's bytes and what they hold.
#[derive(Debug, PartialEq, Eq)]
pub struct Encoded {
    pub bytes: Vec<u8>,
    /// The applied index the table was copied at.
    pub index: u64,
    pub last_token: u64,
    pub locks: u64,
}

impl Encoded {
    pub fn of(table: &LockTable, index: u64) -> Encoded {
        Encoded {
            bytes: table.snapshot(),
            index,
            last_token: table.last_token().map_or(0, FencingToken::get),
            locks: table.len() as u64,
        }
    }
}

/// Why a backup could not be started or a chunk served. The messages
/// (`Display`) are what the client sees.
#[derive(Debug, PartialEq, Eq)]
pub enum BackupError {
    Busy,
    Unknown(u64),
    PastEnd { id: u64, offset: u64, total: u64 },
    NewNotAtZero(u64),
}

impl std::fmt::Display for BackupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackupError::Busy => write!(
                f,
                "{BACKUPS_MAX} backups are under way on this node already; try again once one is done (an \
                 abandoned one is dropped {} s after its last request)",
                BACKUP_IDLE.as_secs()
            ),
            BackupError::Unknown(id) => write!(f, "backup {id} is unknown or expired; start again"),
            BackupError::PastEnd { id, offset, total } => {
                write!(f, "offset {offset} is past the end of backup {id} ({total} bytes)")
            }
            BackupError::NewNotAtZero(offset) => {
                write!(f, "a new backup (backup_id 0) starts at offset 0, not {offset}")
            }
        }
    }
}

impl BackupError {
    fn code(&self) -> ErrorCode {
        match self {
            BackupError::Busy => ErrorCode::RESOURCE_EXHAUSTED,
            BackupError::Unknown(_) | BackupError::PastEnd { .. } | BackupError::NewNotAtZero(_) => {
                ErrorCode::INVALID_ARGUMENT
            }
        }
    }
}

/// One chunk, as answered.
#[derive(Debug, PartialEq, Eq)]
pub struct Chunk {
    pub id: u64,
    pub offset: u64,
    pub bytes: Vec<u8>,
    pub total: u64,
    pub index: u64,
    pub last_token: u64,
    pub locks: u64,
}

enum Slot {
    /// Reserved: the table is being read or encoded.
    Encoding,
    Ready {
        backup: Arc<Encoded>,
        last_used: Instant,
    },
}

/// The backups of one node: ids, bounds, expiry. Time is an argument.
#[derive(Default)]
pub struct Cache {
    /// The last id handed out; ids start at 1 and are never reused.
    last_id: u64,
    slots: BTreeMap<u64, Slot>,
}

impl Cache {
    /// Takes a place for a new backup, if one is free, and names it.
    pub fn reserve(&mut self, now: Instant) -> Result<u64, BackupError> {
        self.expire(now);
        if self.slots.len() >= BACKUPS_MAX {
            return Err(BackupError::Busy);
        }
        self.last_id += 1;
        self.slots.insert(self.last_id, Slot::Encoding);
        Ok(self.last_id)
    }

    /// Gives a reserved place back (the read failed, or its asker left).
    pub fn cancel(&mut self, id: u64) {
        if matches!(self.slots.get(&id), Some(Slot::Encoding)) {
            self.slots.remove(&id);
        }
    }

    /// Stores the encoded backup in its reserved place.
    pub fn fill(&mut self, id: u64, backup: Encoded, now: Instant) {
        if let Some(slot @ Slot::Encoding) = self.slots.get_mut(&id) {
            *slot = Slot::Ready { backup: Arc::new(backup), last_used: now };
        }
    }

    /// The chunk of backup `id` from `offset` on. The one that reaches the
    /// end drops the backup; any other restarts its idle time.
    pub fn chunk(&mut self, id: u64, offset: u64, now: Instant) -> Result<Chunk, BackupError> {
        self.expire(now);
        let Some(Slot::Ready { backup, last_used }) = self.slots.get_mut(&id) else {
            return Err(BackupError::Unknown(id));
        };
        let total = backup.bytes.len() as u64;
        if offset >= total {
            return Err(BackupError::PastEnd { id, offset, total });
        }
        let end = total.min(offset.saturating_add(CHUNK_BYTES as u64));
        let chunk = Chunk {
            id,
            offset,
            bytes: backup.bytes[offset as usize..end as usize].to_vec(),
            total,
            index: backup.index,
            last_token: backup.last_token,
            locks: backup.locks,
        };
        *last_used = now;
        if end == total {
            self.slots.remove(&id);
        }
        Ok(chunk)
    }

    /// Backups kept or being encoded.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.len()
    }

    fn expire(&mut self, now: Instant) {
        self.slots.retain(|_, slot| match slot {
            Slot::Encoding => true,
            Slot::Ready { last_used, .. } => now.saturating_duration_since(*last_used) < BACKUP_IDLE,
        });
    }
}

/// The backups a node serves: the [`Cache`], shared by the client
/// listener and the encoding threads.
pub struct Backups {
    cache: Mutex<Cache>,
    logger: Logger,
}

impl Backups {
    pub fn new(logger: Logger) -> Backups {
        Backups { cache: Mutex::new(Cache::default()), logger }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        // Each update is one map operation: consistent across a panic.
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Serves one backup request. A new backup (`backup_id` 0) reads the
    /// table through `read` (which hands the responder to the node as a
    /// linearizable `Query::Table`); `leader_addr` names a leader's client
    /// address in a NOT_LEADER answer.
    pub fn serve(
        self: &Arc<Self>,
        request: proto::BackupRequest,
        sink: ResponseSink,
        leader_addr: impl Fn(Option<NodeId>) -> Option<String> + Send + 'static,
        read: impl FnOnce(Responder),
    ) {
        let id = sink.id();
        if request.backup_id != 0 {
            let chunk = self.cache().chunk(request.backup_id, request.offset, Instant::now());
            sink.send(answer(id, chunk));
            return;
        }
        if request.offset != 0 {
            sink.send(refusal(id, &BackupError::NewNotAtZero(request.offset)));
            return;
        }
        let backup_id = match self.cache().reserve(Instant::now()) {
            Ok(backup_id) => backup_id,
            Err(err) => {
                sink.send(refusal(id, &err));
                return;
            }
        };
        let reserved = Reserved { backups: Arc::clone(self), id: backup_id };
        read(Responder::new(move |reply: Reply| {
            match TableAt::of(reply) {
                Ok(TableAt { table, index }) => reserved.encode(*table, index, sink),
                // `reserved` is dropped: the place is free again.
                Err(err) => sink.send(error_to_response(id, &err, leader_addr)),
            }
        }));
    }
}

/// A reserved place in the cache, given back when dropped unless filled:
/// the read may fail, or the node may drop it with its connection.
struct Reserved {
    backups: Arc<Backups>,
    id: u64,
}

impl Reserved {
    /// Encodes the table on a thread of its own and answers the first
    /// chunk from there. Runs on the node loop: it must not block.
    fn encode(self, table: LockTable, index: u64, sink: ResponseSink) -> bool {
        let request_id = sink.id();
        let logger = self.backups.logger.clone();
        // Where the thread finds the sink; if it cannot start, the sink is
        // still here to say so.
        let slot = Arc::new(Mutex::new(Some(sink)));
        let thread_slot = Arc::clone(&slot);
        let spawned = std::thread::Builder::new().name("fencelock-backup".into()).spawn(move || {
            let encoded = Encoded::of(&table, index);
            drop(table);
            info!(self.backups.logger, "backup taken";
                "backup_id" => self.id, "index" => index, "locks" => encoded.locks,
                "last_token" => encoded.last_token, "bytes" => encoded.bytes.len());
            let chunk = {
                let mut cache = self.backups.cache();
                let now = Instant::now();
                cache.fill(self.id, encoded, now);
                cache.chunk(self.id, 0, now)
            };
            let sink = thread_slot.lock().unwrap_or_else(PoisonError::into_inner).take();
            sink.is_some_and(|sink| sink.send(answer(request_id, chunk)))
        });
        if let Err(err) = spawned {
            // The reservation went with the closure.
            warn!(logger, "cannot start a thread to encode a backup"; "error" => %err);
            let message = format!("cannot start a thread to encode the backup: {err}");
            let sink = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
            return sink
                .is_some_and(|sink| sink.send(error_response(request_id, ErrorCode::UNAVAILABLE, message)));
        }
        true
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.backups.cache().cancel(self.id);
    }
}

fn answer(id: u64, chunk: Result<Chunk, BackupError>) -> proto::Response {
    match chunk {
        Ok(chunk) => proto::Response {
            id,
            kind: Some(Out::backup(proto::BackupResponse {
                backup_id: chunk.id,
                total_bytes: chunk.total,
                offset: chunk.offset,
                chunk: chunk.bytes,
                index: chunk.index,
                last_token: chunk.last_token,
                locks: chunk.locks,
                ..Default::default()
            })),
            ..Default::default()
        },
        Err(err) => refusal(id, &err),
    }
}

fn refusal(id: u64, err: &BackupError) -> proto::Response {
    error_response(id, err.code(), err.to_string())
}

#[cfg(test)]
mod tests {
    use fencelock_types::{Command, Key, LeaseMs, Owner};

    use super::*;

    fn encoded(len: usize) -> Encoded {
        Encoded { bytes: (0..len).map(|i| i as u8).collect(), index: 7, last_token: 42, locks: 3 }
    }

    #[test]
    fn a_backup_is_served_in_chunks_and_dropped_once_read_to_the_end() {
        let now = Instant::now();
        let mut cache = Cache::default();
        let id = cache.reserve(now).unwrap();
        // Reserved but not encoded yet: nothing to serve.
        assert_eq!(cache.chunk(id, 0, now), Err(BackupError::Unknown(id)));
        let len = 2 * CHUNK_BYTES + 5;
        cache.fill(id, encoded(len), now);
        let mut got = Vec::new();
        let mut offset = 0;
        while offset < len as u64 {
            let chunk = cache.chunk(id, offset, now).unwrap();
            assert_eq!((chunk.id, chunk.offset, chunk.total), (id, offset, len as u64));
            assert_eq!((chunk.index, chunk.last_token, chunk.locks), (7, 42, 3));
            assert!(!chunk.bytes.is_empty() && chunk.bytes.len() <= CHUNK_BYTES);
            offset += chunk.bytes.len() as u64;
            got.extend(chunk.bytes);
        }
        assert_eq!(got, encoded(len).bytes);
        // Read to the end: gone, and its place free.
        assert_eq!(cache.len(), 0);
        assert_eq!(cache.chunk(id, 0, now), Err(BackupError::Unknown(id)));
    }

    #[test]
    fn chunks_can_be_asked_again_and_offsets_past_the_end_are_refused() {
        let now = Instant::now();
        let mut cache = Cache::default();
        let id = cache.reserve(now).unwrap();
        cache.fill(id, encoded(CHUNK_BYTES + 10), now);
        let first = cache.chunk(id, 0, now).unwrap();
        // A retry of the same chunk (its answer was lost) gets it again.
        assert_eq!(cache.chunk(id, 0, now).unwrap(), first);
        // Any offset inside is served, unaligned too.
        assert_eq!(cache.chunk(id, 3, now).unwrap().bytes.len(), CHUNK_BYTES);
        let total = (CHUNK_BYTES + 10) as u64;
        for offset in [total, total + 1, u64::MAX] {
            assert_eq!(cache.chunk(id, offset, now), Err(BackupError::PastEnd { id, offset, total }));
        }
        // A refused offset does not drop the backup.
        assert_eq!(cache.chunk(id, CHUNK_BYTES as u64, now).unwrap().bytes.len(), 10);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn at_most_two_backups_at_once_and_an_idle_one_expires() {
        let start = Instant::now();
        let mut cache = Cache::default();
        let first = cache.reserve(start).unwrap();
        let second = cache.reserve(start).unwrap();
        assert_ne!(first, second);
        assert_eq!(cache.reserve(start), Err(BackupError::Busy));
        assert!(BackupError::Busy.to_string().contains("2 backups are under way"));
        // A reservation being encoded never expires; a cancelled one frees
        // its place.
        cache.cancel(second);
        let third = cache.reserve(start + BACKUP_IDLE * 10).unwrap();
        assert!(third > second, "ids are never reused");
        cache.fill(first, encoded(10), start);
        cache.fill(third, encoded(CHUNK_BYTES + 1), start);
        assert_eq!(cache.reserve(start), Err(BackupError::Busy));
        // Asking for a chunk restarts a backup's idle time.
        let later = start + BACKUP_IDLE - Duration::from_secs(1);
        cache.chunk(third, 0, later).unwrap();
        // `first` was last used at `start`: expired once its idle time is up.
        let expired_at = start + BACKUP_IDLE;
        assert_eq!(cache.chunk(first, 0, expired_at), Err(BackupError::Unknown(first)));
        assert_eq!(cache.len(), 1);
        assert!(cache.chunk(third, 0, expired_at).is_ok());
        // Cancelling a backup that is ready does nothing.
        cache.cancel(third);
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.chunk(third, 0, expired_at + BACKUP_IDLE), Err(BackupError::Unknown(third)));
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn unknown_ids_are_refused_and_codes_are_stable() {
        let now = Instant::now();
        let mut cache = Cache::default();
        for id in [0, 1, u64::MAX] {
            let err = cache.chunk(id, 0, now).unwrap_err();
            assert_eq!(err, BackupError::Unknown(id));
            assert_eq!(err.code(), ErrorCode::INVALID_ARGUMENT);
        }
        assert_eq!(BackupError::Unknown(9).to_string(), "backup 9 is unknown or expired; start again");
        assert_eq!(BackupError::Busy.code(), ErrorCode::RESOURCE_EXHAUSTED);
        // A fill for a place that is gone is dropped.
        cache.fill(5, encoded(3), now);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn an_encoded_table_is_its_snapshot_with_its_counter_and_size() {
        let mut table = LockTable::new();
        for name in ["a", "b"] {
            table.apply(Command::Grant {
                session: None,
                key: Key::new(name.as_bytes().to_vec()).unwrap(),
                lease_ms: LeaseMs::new(1_000).unwrap(),
                owner: Owner::new(b"o".to_vec()).unwrap(),
                value: fencelock_types::Value::none(),
            });
        }
        let encoded = Encoded::of(&table, 12);
        assert_eq!((encoded.index, encoded.last_token, encoded.locks), (12, 2, 2));
        assert_eq!(LockTable::restore(&encoded.bytes).unwrap(), table);
    }
}
