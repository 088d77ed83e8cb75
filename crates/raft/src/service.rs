//! Above the log: the lock service's state. The applied table and what a
//! node derives from it (leases on its own clock, the grant behind each
//! held lock, the watch history), and, on the leader, the requests waiting
//! for the log and the reads waiting for a ReadIndex. Nothing here knows
//! raft-rs: [`super::Replica`] feeds it applied commands and takes its next
//! batch.

use std::collections::BTreeMap;

use fencelock_fsm::{Change, LockTable};
use fencelock_lease::LeaseTracker;
use fencelock_types::{FencingToken, Key};

use crate::queue::Requests;
use crate::types::{MemberChange, Query, RequestId};
use crate::watch::Watches;

/// The lock service: the applied table and the state derived from it.
pub(crate) struct LockService {
    /// The applied lock table.
    pub(crate) table: LockTable,
    /// The index the table reflects: raft's applied index, or ahead of it
    /// while a snapshot installed from an asynchronous store is persisting.
    pub(crate) table_index: u64,
    /// This node's monotonic time, as last given to `set_now`.
    pub(crate) now_ms: u64,
    /// The leader has applied an entry of its own term: it may propose.
    pub(crate) leader_ready: bool,
    /// Requests accepted while leader, waiting or in flight, in order.
    pub(crate) requests: Requests,
    /// The last id of the leader's own requests (Expire, ghost Release).
    pub(crate) next_internal_id: u64,
    pub(crate) leases: Leases,
    pub(crate) reads: Reads,
    pub(crate) levels: Levels,
    /// Per held lock (key and token: a shared key has many), the index of
    /// the entry that last granted, re-granted or renewed it (absent for
    /// locks restored from a snapshot).
    pub(crate) grant_index: BTreeMap<(Key, FencingToken), u64>,
    /// Recent changes, and the watches parked until the next one.
    pub(crate) watches: Watches,
    /// What the command being applied changed: a buffer kept between
    /// commands.
    pub(crate) changes: Vec<Change>,
}

impl LockService {
    /// A service over `table`, the state as of log index `index`; its
    /// leases are rebuilt at the first time it is given.
    pub(crate) fn new(table: LockTable, index: u64, watches: Watches) -> LockService {
        LockService {
            table,
            table_index: index,
            now_ms: 0,
            leader_ready: false,
            requests: Requests::default(),
            next_internal_id: 0,
            leases: Leases::new(),
            reads: Reads::default(),
            levels: Levels::default(),
            grant_index: BTreeMap::new(),
            watches,
            changes: Vec::new(),
        }
    }
}

/// Deadlines on this node's clock, fed by applied changes, and the
/// leader's bookkeeping of the expiries it proposes.
pub(crate) struct Leases {
    /// Plain locks, by key.
    pub(crate) plain: LeaseTracker,
    /// The holders of read-write locks and semaphores, by key and token.
    pub(crate) shared: LeaseTracker<(Key, FencingToken)>,
    /// Sessions, by id: what is held under a session has no lease of its
    /// own here.
    pub(crate) sessions: LeaseTracker<FencingToken>,
    /// The leases must be rebuilt from the table at the next `set_now` (the
    /// table came from a snapshot at open, before any time was known).
    pub(crate) need_restore: bool,
    /// When the leader last looked for leases due.
    pub(crate) last_scan_ms: Option<u64>,
    /// On the leader: the sessions with an ExpireSession of its own
    /// pending, and its request.
    pub(crate) sessions_expiring: BTreeMap<FencingToken, RequestId>,
    /// On the leader: the renewals of sessions in flight (a RenewSession,
    /// or a Renew of something a session holds), by request. An
    /// ExpireSession is not proposed while one of its session's is: the
    /// renewal would apply first and be answered alive, and the expiry
    /// then end the session. Answered requests are pruned lazily.
    pub(crate) session_renewals: Vec<(RequestId, FencingToken)>,
}

impl Leases {
    fn new() -> Leases {
        Leases {
            plain: LeaseTracker::new(),
            shared: LeaseTracker::new(),
            sessions: LeaseTracker::new(),
            need_restore: true,
            last_scan_ms: None,
            sessions_expiring: BTreeMap::new(),
            session_renewals: Vec::new(),
        }
    }
}

/// Linearizable reads on their way: waiting for their ReadIndex, then for
/// apply to reach it.
#[derive(Default)]
pub(crate) struct Reads {
    /// Reads waiting for their ReadIndex.
    pub(crate) waiting: BTreeMap<RequestId, Query>,
    /// Reads taken by a leader that has not committed an entry of its term
    /// yet: raft-rs drops a ReadIndex then, so they are asked once it has.
    pub(crate) before_ready: Vec<RequestId>,
    /// Membership requests answered without the log (a retry of a change
    /// that applied, or one the configuration refuses), waiting for a
    /// ReadIndex to confirm this node still leads: a leader deposed
    /// without knowing it would answer from an old configuration.
    pub(crate) member_checks: BTreeMap<RequestId, MemberChange>,
    /// Reads whose ReadIndex is known, waiting for apply to reach it.
    pub(crate) at_index: Vec<(u64, RequestId)>,
}

/// The command levels the cluster's members said they apply.
#[derive(Default)]
pub(crate) struct Levels {
    /// The command level each peer said in its last hello (a build before
    /// levels says 0).
    pub(crate) peers: BTreeMap<u64, u32>,
    /// The term this node last proposed a RaiseLevel in.
    pub(crate) raised_in: Option<u64>,
}
