//! A blocking, thread-safe Rust client for fencelock.
//!
//! This crate owns the client side of the client protocol
//! (`crates/types/proto/client.proto`): pipelined connections (one per node
//! in use, many requests in flight, responses matched by id; no reader
//! thread: a waiting caller reads for all of them), the retry loop
//! (follow `NOT_LEADER` to the leader, move on from unavailable or
//! unreachable nodes with backoff, give up after
//! [`ClientConfig::retry_for`]), and lock guards renewed by one background
//! thread per [`Client`]. It does not own the frame format (that is
//! `fencelock-net`), nor any server-side logic, nor a command line (that is
//! `fencelock-cli`). It never decides that a lock is held: the server does,
//! and [`LockGuard::is_lost`] tells when the client can no longer count on it.
//!
//! Retries are safe: every acquire carries the client's owner identity, and a
//! retried acquire by the same owner returns the same token and never grants
//! twice.
//!
//! ```no_run
//! use std::time::Duration;
//! use fencelock_client::{Client, ClientConfig, ClientError};
//!
//! let client = Client::connect(ClientConfig::new(["127.0.0.1:7101", "127.0.0.1:7102"]))?;
//! match client.acquire("jobs/nightly", Duration::from_secs(10), Duration::from_secs(30)) {
//!     Ok(guard) => {
//!         // Pass the token with every write to the protected resource.
//!         println!("holding jobs/nightly with token {}", guard.token());
//!         assert!(!guard.is_lost());
//!         guard.release()?;
//!     }
//!     Err(ClientError::WaitTimedOut { holder_token }) => println!("still held by {holder_token:?}"),
//!     Err(other) => return Err(other.into()),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Modules, each using only those before it: `error`, `types`, `sansio`,
//! `config`, `sync`, `connection`, `local`, `renewer`, `client` (`Client`
//! and the calls), then `backup`, `members`, `session`, `guard`, `watch`,
//! each adding its calls to `Client`; `fenced` stands alone.

mod backup;
mod client;
mod config;
mod connection;
mod error;
mod fenced;
mod guard;
mod local;
mod members;
mod renewer;
pub mod sansio;
mod session;
mod sync;
mod types;
mod watch;

pub use backup::BackupInfo;
pub use client::Client;
pub use config::{jitter_seed, ClientConfig, TlsConfig, DEFAULT_REQUEST_TIMEOUT, DEFAULT_RETRY_FOR};
pub use error::ClientError;
pub use fenced::{FencedRegister, StaleToken};
pub use fencelock_types::Share;
pub use guard::LockGuard;
pub use local::LocalHold;
pub use members::Membership;
pub use sansio::observe::{Leader, LeaderChange};
pub use sansio::{Drift, Retrying, DEFAULT_DRIFT, RETRY_NOTICE_AFTER};
pub use session::SessionGuard;
pub use types::{
    Grant, LockInfo, Member, NodeStatus, Released, Renewed, Session, ShareKind, WatchBatch, WatchEvent,
    WatchEventKind,
};
pub use watch::{Observer, Watch};

#[cfg(test)]
mod tests;
