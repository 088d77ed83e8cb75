//! Below the log: raft-rs and what it needs around it. The raw node, the
//! order in which writes become durable and the messages that wait for
//! them, snapshots sent and received, the membership record and the rejoin
//! floor, the gate's refusals, transfers and configuration changes.
//! Nothing here knows locks: what it commits goes to [`super::Replica`]'s
//! lock service.

use std::collections::VecDeque;

use fencelock_fsm::LockTable;
use raft::prelude::Message;
use raft::{RawNode, StateRole};

use super::membership::Transfer;
use crate::gate::RefusalLog;
use crate::log::{LogCache, Write, WriteBatch};
use crate::rejoin::{Floor, Membership};
use crate::types::{NodeId, RequestId};

/// Consensus: raft-rs's node and its bookkeeping.
pub(crate) struct Consensus {
    pub(crate) raw: RawNode<LogCache>,
    pub(crate) persist: Persistence,
    pub(crate) snapshots: Snapshots,
    /// The role, term and leader last reported, to notice changes.
    pub(crate) reported: (StateRole, u64, u64),
    /// The peers it has had messages from, and its rejoin floor, if any.
    pub(crate) membership: Membership,
    /// A peer was heard from for the first time: the membership record
    /// goes into the next write, and nothing leaves before that write.
    pub(crate) membership_dirty: bool,
    /// Set while a node that lost its data rejoins: it neither votes nor
    /// campaigns until it has caught up past the floor.
    pub(crate) abstaining: Option<Floor>,
    pub(crate) refusal_log: RefusalLog,
    /// The membership change this leader proposed and has not applied.
    pub(crate) member_request: Option<RequestId>,
    /// The leadership transfer waiting for its answer.
    pub(crate) transfer: Option<Transfer>,
    /// The nodes the gate takes raft messages from
    /// ([`super::membership::peers_of`]).
    pub(crate) peers: Vec<NodeId>,
    /// Bumped at every configuration change.
    pub(crate) conf_version: u64,
    /// This node applied its own removal, at this index, written by this
    /// write: it stops once that write is durable.
    pub(crate) removed: Option<(u64, u64)>,
}

/// The order of writes: what was asked, what is durable, and what waits
/// for it.
#[derive(Default)]
pub(crate) struct Persistence {
    pub(crate) disk: Disk,
    /// Readies handed to raft with `advance_append_async` whose write is
    /// not yet durable, oldest first.
    pub(crate) unpersisted: VecDeque<Unpersisted>,
    /// Votes and acknowledgements waiting until the count of durable writes
    /// reaches the first number.
    pub(crate) held: VecDeque<(u64, Vec<Message>)>,
    /// The number of the write of the last membership record: until it is
    /// durable, nothing leaves early.
    pub(crate) membership_written_at: u64,
}

/// Snapshots on their way out and in.
#[derive(Default)]
pub(crate) struct Snapshots {
    /// Peers that were sent a snapshot in this turn.
    pub(crate) sent: Vec<u64>,
    /// The snapshot being encoded ([`super::Effects::encode`]): its index
    /// and term.
    pub(crate) encoding: Option<(u64, u64)>,
    /// The table of a snapshot message that passed the gate, decoded once,
    /// for its install: the snapshot's index and term, and the table.
    pub(crate) decoded: Option<(u64, u64, LockTable)>,
    /// A snapshot is wanted before the interval is up (a new member must
    /// start from one: the initial configuration is in no log entry).
    pub(crate) wanted: bool,
}

/// The writes asked of the store, counted: the store reports them durable
/// by count, in order.
#[derive(Debug, Default)]
pub(crate) struct Disk {
    /// Writes asked for since open; the last one's number.
    pub(crate) submitted: u64,
    /// Of those, how many are durable (reported with `on_persisted`).
    pub(crate) durable: u64,
    /// Of those, how many asked for a sync.
    pub(crate) syncs: u64,
}

impl Disk {
    /// Numbers the next write.
    pub(crate) fn write(&mut self, batch: WriteBatch, urgent: bool) -> Write {
        self.submitted += 1;
        if !batch.may_defer_sync {
            self.syncs += 1;
        }
        Write { n: self.submitted, batch, urgent }
    }
}

/// A ready whose write is not yet durable.
#[derive(Debug)]
pub(crate) struct Unpersisted {
    /// The number of the write it waits for.
    pub(crate) write: u64,
    /// raft-rs's number of the ready.
    pub(crate) number: u64,
    /// The index of the snapshot it installed: applied once persisted.
    pub(crate) snapshot_index: Option<u64>,
}
