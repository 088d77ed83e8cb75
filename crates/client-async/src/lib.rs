//! An async (tokio) Rust client for fencelock.
//!
//! This crate owns the async face of the client: pipelined connections on
//! tokio (one per node in use, one reader task each), the shell of the
//! retry loop, lock guards each renewed by a task of its own, with a
//! lost-lock signal ([`AsyncLockGuard::lost`]) and the time left
//! ([`AsyncLockGuard::time_left`]), leader election
//! ([`AsyncClient::campaign`], [`AsyncLockGuard::proclaim`]), read-write
//! locks and semaphores ([`AsyncClient::acquire_shared`] with a [`Share`]:
//! each holder has a token and a guard of its own;
//! [`AsyncClient::holders`] lists them), and the long-poll loops of watches
//! ([`AsyncWatch`]) and election observers ([`AsyncObserver`]). Every
//! decision (which node, how long to pause, when to give up, what a request
//! holds and what an answer means, how long a lease may be counted on with
//! the drift margin ρ, which watched change is a new leader) is the sans-IO
//! core's, `fencelock_client::sansio`, which the blocking
//! [`fencelock_client::Client`] runs too: the two behave alike and are
//! tested alike (`crates/server/tests/clients.rs`). It shares the blocking
//! client's configuration ([`ClientConfig`]), errors and answers (watch
//! batches and leader changes among them). It does not own the frame format
//! (`fencelock-net`) nor any server-side logic.
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
//!
//! An election: candidates campaign with a value, observers follow the
//! leader.
//!
//! ```no_run
//! use std::time::Duration;
//! use fencelock_client_async::AsyncClient;
//!
//! # async fn run(client: AsyncClient) -> Result<(), Box<dyn std::error::Error>> {
//! // A candidate leads once granted, until its guard is released or lost.
//! let (lease, wait) = (Duration::from_secs(10), Duration::from_secs(60));
//! let lead = client.campaign("svc/leader", "10.0.0.7:8080", lease, wait).await?;
//! lead.proclaim("10.0.0.7:8081").await?;
//!
//! // An observer, in any process, is told each leader and value in log order.
//! let mut observer = client.observe("svc/leader");
//! while let Some(change) = observer.next(Duration::from_secs(30)).await? {
//!     println!("leader: {:?}", change.leader.map(|leader| leader.value));
//! }
//! # Ok(())
//! # }
//! ```
//!
//! A read-write lock: readers hold the key together, a writer alone (it
//! waits, in order, for the readers before it). A semaphore of N is
//! [`Share::Permit`]`(N)`.
//!
//! ```no_run
//! use std::time::Duration;
//! use fencelock_client_async::{AsyncClient, Share};
//!
//! # async fn run(client: AsyncClient) -> Result<(), Box<dyn std::error::Error>> {
//! let (lease, wait) = (Duration::from_secs(10), Duration::from_secs(30));
//! let reader = client.acquire_shared("db/schema", Share::Read, lease, wait).await?;
//! for holder in client.holders("db/schema", true).await? {
//!     println!("{:?} under token {}", holder.share, holder.token);
//! }
//! reader.release().await?;
//! let slot = client.acquire_shared("pool/gpu", Share::Permit(4), lease, wait).await?;
//! slot.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Modules, each using only those before it: `connection`, `client`
//! (`AsyncClient` and the calls), `shared` (a lease's state and lost
//! signal), then `session`, `guard`, `watch`, each adding its calls to
//! `AsyncClient`.

mod client;
mod connection;
mod guard;
mod session;
mod shared;
mod watch;

pub use client::AsyncClient;
pub use fencelock_client::{
    ClientConfig, ClientError, Drift, Grant, Leader, LeaderChange, LockInfo, NodeStatus, Released, Renewed,
    Retrying, Session, Share, ShareKind, TlsConfig, WatchBatch, WatchEvent, WatchEventKind,
};
pub use guard::AsyncLockGuard;
pub use session::AsyncSessionGuard;
pub use watch::{AsyncObserver, AsyncWatch};

/// docs/recipes.md, whose Rust examples (blocking and async) compile as
/// doctests of this crate, which can use both clients.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/recipes.md")]
pub struct RecipesDoc;
