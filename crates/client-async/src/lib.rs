//! An async (tokio) Rust client for fencelock.
//!
//! This crate owns the async face of the client: pipelined connections on
//! tokio (one per node in use, one reader task each), the shell of the
//! retry loop, and lock guards each renewed by a task of its own, with a
//! lost-lock signal ([`AsyncLockGuard::lost`]) and the time left
//! ([`AsyncLockGuard::time_left`]). Every decision (which node, how long to
//! pause, when to give up, what a request holds and what an answer means,
//! how long a lease may be counted on with the drift margin ρ) is the
//! sans-IO core's, `fencelock_client::sansio`, which the blocking
//! [`fencelock_client::Client`] runs too: the two behave alike and are
//! tested alike (`crates/server/tests/clients.rs`). It shares the blocking
//! client's configuration ([`ClientConfig`]), errors and answers. It does
//! not own the frame format (`fencelock-net`) nor any server-side logic.
//!
//! Within one process a key is never held twice by guards of one owner,
//! async or blocking ([`fencelock_client::LocalHold`]): a second acquire
//! waits for the first guard, or fails.
//!
//! ```no_run
//! use std::time::Duration;
//! use fencelock_client_async::{AsyncClient, ClientConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = AsyncClient::connect(ClientConfig::new(["127.0.0.1:7101", "127.0.0.1:7102"]))?;
//! let guard = client.acquire("jobs/nightly", Duration::from_secs(10), Duration::from_secs(30)).await?;
//! tokio::select! {
//!     reason = guard.lost() => eprintln!("lost jobs/nightly: {reason}"),
//!     () = do_the_job(guard.token()) => {}
//! }
//! guard.release().await?;
//! # Ok(())
//! # }
//! # async fn do_the_job(_token: u64) {}
//! ```

mod client;
mod connection;
mod guard;

pub use client::AsyncClient;
pub use fencelock_client::{
    ClientConfig, ClientError, Drift, Grant, LockInfo, NodeStatus, Released, Renewed, Retrying, TlsConfig,
};
pub use guard::AsyncLockGuard;

/// docs/recipes.md, whose Rust examples (blocking and async) compile as
/// doctests of this crate, which can use both clients.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/recipes.md")]
pub struct RecipesDoc;
