//! The fencelock raft driver: runs a [`Node`] (the pure node of
//! `fencelock-node`, re-exported here whole) with a real clock, real
//! threads and a store on disk.
//!
//! [`shell`] is the thin part that runs a node with a real clock:
//! `fencelockd` drives a [`shell::Driver`] from its event loop, with an
//! [`AsyncEngineStore`] (raft-engine behind an I/O thread that syncs groups
//! of writes); [`shell::spawn`] runs one on a thread of its own, over
//! bounded crossbeam channels (the in-process test cluster and the
//! benchmark). The snapshot worker encodes and decodes large tables off the
//! node's thread. This crate owns the stores on disk ([`EngineStore`],
//! [`AsyncEngineStore`]), the worker and the shells; it does not own the
//! node's logic, its vocabulary or its invariants (see `fencelock-node`).

pub use fencelock_node::*;

pub mod shell;
mod storage;
mod worker;

pub use storage::{AsyncEngineStore, EngineStore, Persisted};

#[cfg(test)]
mod tests;
