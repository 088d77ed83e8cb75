//! The history of a run: every operation a client made, with when it was
//! invoked and when it completed (microseconds since the run started, on
//! the suite's monotonic clock), what it was, and how it ended.
//!
//! Operations that failed without a definite answer are kept as
//! [`Outcome::Unknown`]: such a call may or may not have taken effect, and
//! the checker must treat it so.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use fencelock_client::ClientError;
use serde::Serialize;

/// What an operation asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum OpKind {
    /// `acquire_raw`: a lock without a renewer, so that a holder that pauses
    /// loses it.
    Acquire {
        lease_ms: u64,
        wait_ms: u64,
    },
    /// `acquire_shared_raw`: a reader or the writer of a read-write lock,
    /// or one of `permits` permits of a semaphore (0 for a read-write
    /// lock).
    AcquireShared {
        lease_ms: u64,
        wait_ms: u64,
        share: ShareKind,
        permits: u32,
    },
    /// A write to the fenced store, carrying the holder's token.
    Write {
        token: u64,
    },
    Release {
        token: u64,
    },
    /// A linearizable `check` that `token` holds the key.
    Check {
        token: u64,
    },
    /// The holder stops for `ms` without renewing (a GC pause), between its
    /// check and its write.
    Pause {
        token: u64,
        ms: u64,
    },
    /// The holder of the election key (`token`) proclaims a new value: a
    /// write through the log, answered only while the token holds the key.
    Proclaim {
        token: u64,
    },
    /// An election observer was told a change of leader (not
    /// linearizable: from whichever node answered).
    Observe,
    /// A session was opened with this TTL (its key is empty).
    SessionOpen {
        ttl_ms: u64,
    },
    /// A keep-alive of `session` (its key is empty).
    KeepAlive {
        session: u64,
    },
    /// The close of `session` (its key is empty). Each lock it held is
    /// recorded beside it as a release invoked and answered with it.
    SessionClose {
        session: u64,
    },
}

/// How a shared acquire holds its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareKind {
    Read,
    Write,
    Permit,
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Outcome {
    Granted {
        token: u64,
        lease_ms: u64,
        /// The owner held the lock already: a retry, answered with the
        /// token granted to an earlier acquire of its.
        existing: bool,
    },
    Held {
        holder_token: Option<u64>,
    },
    WaitTimedOut {
        holder_token: Option<u64>,
    },
    /// The fenced store took the write.
    Accepted,
    /// The fenced store turned the write away: it had accepted `highest`.
    Rejected {
        highest: u64,
    },
    Released,
    /// The release found the token no longer holding the key.
    NotHeld,
    /// `check` answered that the token holds the key.
    Holds,
    /// `check` answered that it does not.
    DoesNotHold,
    /// The proclaim was applied: the token held the key.
    Proclaimed,
    /// An observer was told that `token` leads (none: no one) from log
    /// index `index` on.
    Observed {
        token: Option<u64>,
        index: u64,
    },
    Paused,
    /// A session was opened under this id.
    SessionOpened {
        session: u64,
    },
    /// A keep-alive or a close found the session open.
    SessionFound,
    /// A keep-alive or a close found it gone (closed, or lapsed).
    SessionGone,
    /// No definite answer: the call may or may not have taken effect.
    Unknown {
        error: String,
    },
    /// Refused outright: the call did not take effect.
    Failed {
        error: String,
    },
}

impl Outcome {
    /// The outcome of a call that ended in `error`, other than the acquire
    /// outcomes `Held` and `WaitTimedOut`, which are answers.
    pub fn from_error(error: &ClientError) -> Outcome {
        match error {
            // Held back by lock-delay: not granted, as for a holder.
            ClientError::Held { holder_token } | ClientError::Delayed { holder_token, .. } => {
                Outcome::Held { holder_token: *holder_token }
            }
            ClientError::WaitTimedOut { holder_token } => {
                Outcome::WaitTimedOut { holder_token: *holder_token }
            }
            // A denied renew may have renewed the batch's other locks, but
            // the suites' clients only ever renew their own.
            ClientError::InvalidArgument(_)
            | ClientError::PermissionDenied(_)
            | ClientError::ResourceExhausted(_)
            | ClientError::NoSession(_) => Outcome::Failed { error: error.to_string() },
            ClientError::Unavailable(_) | ClientError::Internal(_) => {
                Outcome::Unknown { error: error.to_string() }
            }
        }
    }

    /// True for an answer the cluster (or the store) gave, as opposed to a
    /// call that failed.
    pub fn is_definite(&self) -> bool {
        !matches!(self, Outcome::Unknown { .. } | Outcome::Failed { .. })
    }

    /// True for an answer that needed a committed log entry (a quorum):
    /// evidence that the cluster serves writes.
    pub fn is_committed(&self) -> bool {
        matches!(self, Outcome::Granted { .. } | Outcome::Released)
    }
}

/// One operation of one client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Op {
    /// Order of completion.
    pub id: u64,
    /// The client thread, 0-based.
    pub client: usize,
    pub owner: String,
    pub key: String,
    pub invoke_us: u64,
    pub complete_us: u64,
    #[serde(flatten)]
    pub kind: OpKind,
    pub outcome: Outcome,
}

/// Collects the operations of every client thread.
#[derive(Debug)]
pub struct Recorder {
    start: Instant,
    next_id: AtomicU64,
    ops: Mutex<Vec<Op>>,
}

impl Recorder {
    pub fn new(start: Instant) -> Recorder {
        Recorder { start, next_id: AtomicU64::new(0), ops: Mutex::new(Vec::new()) }
    }

    /// Microseconds since the run started.
    pub fn now_us(&self) -> u64 {
        self.at_us(Instant::now())
    }

    pub fn at_us(&self, instant: Instant) -> u64 {
        u64::try_from(instant.saturating_duration_since(self.start).as_micros()).unwrap_or(u64::MAX)
    }

    /// Adds `op` (its id is set here).
    pub fn record(&self, mut op: Op) {
        op.id = self.next_id.fetch_add(1, Ordering::SeqCst);
        self.ops.lock().unwrap_or_else(PoisonError::into_inner).push(op);
    }

    /// Every operation so far, by invoke time.
    pub fn ops(&self) -> Vec<Op> {
        let mut ops = self.ops.lock().unwrap_or_else(PoisonError::into_inner).clone();
        ops.sort_by_key(|op| (op.invoke_us, op.id));
        ops
    }
}
