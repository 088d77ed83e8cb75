//! The fencelock raft driver: turns proposed lock commands into committed,
//! durably stored and applied ones, around raft-rs's `RawNode`.
//!
//! ```text
//!              inputs                                   effects
//!  propose(id, commands) ─┐                        ┌─▶ messages to peers
//!  read(id, query)        ├─▶ Replica ── one Ready ─┼─▶ replies, by request id
//!  step(peer message)     │   (raft-rs + LockTable) ├─▶ applied events (lease timer)
//!  tick()                 ┘        │                └─▶ role changes
//!                                  ▼
//!                        Durable store (one write per Ready)
//! ```
//!
//! [`Replica`] is the core. It reads no clock and owns no thread or socket:
//! time arrives as `tick()`, peers as `step()`, and what should happen leaves
//! as [`Effects`]. Its only I/O is the [`Durable`] store it is given: memory
//! in tests ([`MemStore`]), a modelled disk in the simulator, raft-engine on
//! disk in production. A store is synchronous ([`EngineStore`]: each write
//! is synced before `write` returns) or asynchronous ([`AsyncEngineStore`],
//! what `fencelockd` runs: `write` queues, an I/O thread syncs groups of
//! writes, and the owner reports progress with [`Replica::on_persisted`]).
//! [`shell::spawn`] runs a replica on a thread, over bounded crossbeam
//! channels.
//!
//! Architecture invariants:
//! - The `Ready` order of raft-rs's `five_mem_node` example: entries and hard
//!   state are durable (one write per `Ready`) before the messages that
//!   depend on them (votes, append acknowledgements) are sent and before any
//!   result is handed out. With an asynchronous store, raft-rs's async ready
//!   (`advance_append_async`, `on_persist_ready`): those messages wait for
//!   the store's sync (its I/O thread sends them), raft counts entries
//!   persisted only when reported, and only entries persisted locally are
//!   applied; the driver meanwhile steps, proposes and applies.
//! - Results reach proposers by the request id carried in the entry's
//!   context, and only when the entry was proposed by this node in the term
//!   recorded for the request; never by position.
//! - The leader proposes at most one command per key at a time, in the order
//!   it accepted them, and decides every Grant against the applied table;
//!   nothing is proposed before the leader has applied an entry of its own
//!   term. So a normal workload never meets `GrantRejected`, and an Expire
//!   and a Renew of one lock are never in flight together.
//! - Losing leadership fails every pending request with a retryable error.
//! - A storage error is fatal: the replica reports it and must be dropped.
//! - A node never forgets that it heard from a peer: the record is durable
//!   before anything that the peer's first message caused leaves the node.
//!   A node that lost its data ([`rejoin`]) neither votes nor campaigns
//!   until it has caught up past the floor its peers reported.
//!
//! ```
//! use fencelock_raft::{Config, MemStore, NodeId, Replica, RequestId, Response};
//! use fencelock_types::{ApplyResult, Command, Key, LeaseMs, Owner};
//!
//! let logger = slog::Logger::root(slog::Discard, slog::o!());
//! let config = Config::new(NodeId(1), vec![NodeId(1)]);
//! let mut replica = Replica::open(config, MemStore::new(), &logger)?;
//! replica.campaign()?;
//! // A one-node cluster elects itself and commits its own-term entry.
//! while !replica.is_leader_ready() {
//!     replica.run_ready()?;
//! }
//! let grant = Command::Grant {
//!     key: Key::new(b"jobs/nightly".to_vec())?,
//!     lease_ms: LeaseMs::new(10_000)?,
//!     owner: Owner::new(b"worker-1".to_vec())?,
//! };
//! replica.propose(RequestId(7), vec![grant]);
//! replica.run_ready()?;
//! let replies = replica.take_effects().replies;
//! assert!(matches!(
//!     replies.as_slice(),
//!     [(RequestId(7), Ok(Response::Applied(results)))] if matches!(results[0], ApplyResult::Granted { .. })
//! ));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod node;
mod queue;
mod registry;
pub mod rejoin;
mod replica;
pub mod shell;
mod storage;
mod types;

pub use node::{Action, ClientRequest, Event, Node, NodeConfig};
pub use registry::{Answered, ConnId, Registry};
pub use replica::{Effects, GrantRef, NodeStatus, Replica, Role, Stats};
pub use storage::{
    AsyncEngineStore, Durable, EngineStore, LogCache, MemStore, OwnedWriteBatch, Persisted, Recovered,
    StorageError, WriteBatch,
};
pub use types::{
    AppliedEvent, Config, ConfigError, FatalError, NodeId, Query, Reply, RequestError, RequestId, Response,
    RoleChange,
};

#[cfg(test)]
mod tests;
