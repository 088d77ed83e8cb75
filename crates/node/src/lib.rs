//! The fencelock node, pure: turns proposed lock commands into committed,
//! durably stored and applied ones, around raft-rs's `RawNode`, without a
//! thread, a clock, a socket or a file of its own.
//!
//! ```text
//!              events (with the time)                      actions
//!  client request on a conn ─┐                       ┌─▶ send to a peer
//!  connection closed         │                       ├─▶ answer a client
//!  peer hello / message      ├─▶ Node ── one Ready ──┼─▶ write N (the shell makes it)
//!  write N persisted         │   Registry, Replica   ├─▶ applied changes
//!  tick                     ─┘   (raft-rs, LockTable)└─▶ role changes
//! ```
//!
//! [`Node`] is the whole node as a sans-IO state machine: it reads no clock,
//! owns no thread, socket or disk. Time comes with each event, and what
//! should happen leaves as [`Action`]s, writes included: a shell makes them
//! and reports them durable ([`Event::Persisted`]). Inside, [`Replica`]
//! joins consensus (raft-rs, below the log) and the lock service (the
//! table and what derives from it, above the log). This crate owns the
//! node's whole logic and vocabulary; it does not own the stores on disk,
//! the snapshot worker or the shells that run a node with a real clock:
//! those are `fencelock-raft`'s. `cargo xtask tidy` keeps it pure: a clock
//! read, a thread, a file, a channel or a process in its source fails CI.
//! The simulator runs the same `Node` on a modelled disk.
//!
//! Architecture invariants:
//! - The `Ready` order of raft-rs's async ready (`advance_append_async`,
//!   `on_persist_ready`): entries and hard state are durable (one write per
//!   `Ready`) before the messages that depend on them (votes, append
//!   acknowledgements) leave; the node holds those until the shell reports
//!   the write durable. Raft counts entries persisted only when reported,
//!   and only entries persisted locally are applied; the node meanwhile
//!   steps, proposes and applies.
//! - Results reach proposers by the request id carried in the entry's
//!   context, and only when the entry was proposed by this node in the term
//!   recorded for the request; never by position.
//! - The leader proposes at most one command per key at a time, in the order
//!   it accepted them, and decides every Grant against the applied table;
//!   nothing is proposed before the leader has applied an entry of its own
//!   term. So a normal workload never meets `GrantRejected`, and an Expire
//!   and a Renew of one lock are never in flight together.
//! - Losing leadership fails every pending request with a retryable error.
//! - A storage error is fatal: the shell stops the node.
//! - A node never forgets that it heard from a peer: the record is durable
//!   before anything that the peer's first message caused leaves the node.
//!   A node that lost its data ([`rejoin`]) neither votes nor campaigns
//!   until it has caught up past the floor its peers reported.
//!
//! See [`Node`] for an example.

pub mod answer;
pub mod gate;
mod log;
mod node;
mod queue;
mod registry;
pub mod rejoin;
mod replica;
pub mod reply;
pub mod scan;
mod types;
pub mod watch;

pub use log::{Durable, LogCache, MemStore, Recovered, StorageError, Write, WriteBatch};
pub use node::{Action, ClientRequest, Event, Node, NodeConfig};
pub use registry::{Answered, ConnId, Registry};
pub use replica::{
    ConfView, Effects, GrantRef, LogProgress, NodeStatus, Replica, Role, SnapshotJob, Stats, PROMOTE_LAG_MAX,
    TRANSFER_WAIT_MS,
};
pub use reply::{Answer, Asked};
pub use types::{
    human_ms, AppliedEvent, Config, ConfigError, FatalError, HeldLock, Member, MemberChange, MemberRole,
    NodeId, Query, Quota, Reply, RequestError, RequestId, Response, RoleChange,
};

#[cfg(test)]
mod tests;
