//! The fencelock raft driver: turns proposed lock commands into committed,
//! durably stored and applied ones, around raft-rs's `RawNode`.
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
//! and reports them durable ([`Event::Persisted`]). Inside, [`Replica`] is
//! raft-rs and the lock table. [`shell`] is the thin part that runs a node
//! with a real clock: `fencelockd` drives a [`shell::Driver`] from its event
//! loop, with an [`AsyncEngineStore`] (raft-engine behind an I/O thread that
//! syncs groups of writes); [`shell::spawn`] runs one on a thread of its
//! own, over bounded crossbeam channels (the in-process test cluster and the
//! benchmark). The simulator runs the same `Node` on a modelled disk.
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

pub mod gate;
mod node;
mod queue;
mod registry;
pub mod rejoin;
mod replica;
pub mod shell;
mod storage;
mod types;
pub mod watch;
mod worker;

pub use node::{Action, ClientRequest, Event, Node, NodeConfig};
pub use registry::{Answered, ConnId, Registry};
pub use replica::{Effects, GrantRef, NodeStatus, Replica, Role, Stats, PROMOTE_LAG_MAX, TRANSFER_WAIT_MS};
pub use storage::{
    AsyncEngineStore, Durable, EngineStore, LogCache, MemStore, Persisted, Recovered, StorageError, Write,
    WriteBatch,
};
pub use types::{
    human_ms, AppliedEvent, Config, ConfigError, FatalError, HeldLock, Member, MemberChange, MemberRole,
    NodeId, Query, Quota, Reply, RequestError, RequestId, Response, RoleChange,
};

#[cfg(test)]
mod tests;
