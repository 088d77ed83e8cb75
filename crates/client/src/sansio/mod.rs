//! The client's sans-IO core: everything a client decides, with no socket,
//! thread or clock of its own. Time comes in as an argument (`now`), answers
//! come in as values, and each function returns what should happen next.
//!
//! Both faces are thin shells around it: the blocking [`Client`](crate::Client)
//! (threads and `std::net`) and the async client of `fencelock-client-async`
//! (tokio). A client in another language can follow it step by step.
//!
//! - [`calls`]: each operation's request, and how its answer reads
//!   (`Response` → result or [`ClientError`](crate::ClientError)).
//! - [`retry`]: one call's retry loop ([`RetryLoop`]): which node to try
//!   next, how long to pause (backoff with jitter), when to give up, when
//!   to tell the caller that it keeps retrying. Retry rules 1–4 of
//!   `docs/protocol.md`.
//! - [`inbound`]: what a connection's bytes read as: responses, a refusal
//!   of the whole connection, or a broken stream.
//! - [`lease`]: one held lock's lease as the client may count on it
//!   ([`Lease`]): the drift margin ρ of `docs/leases.md`, when to renew,
//!   when it is lost, the time left.
//!
//! - [`observe`]: an election observer's fold ([`ObserverState`]): a
//!   watch's answers in, each change of leader out, once, in log order.
//!
//! It does not own the frame format (`fencelock-net`), opening connections, or the
//! background renewal's schedule across locks (each shell has its own).

pub mod calls;
pub mod inbound;
pub mod lease;
pub mod observe;
pub mod pool;
pub mod retry;

pub use lease::{Drift, Lease, DEFAULT_DRIFT};
pub use observe::{Leader, LeaderChange, ObserverState};
pub use retry::{Outcome, RetryLoop, Retrying, Try, Verdict, RETRY_NOTICE_AFTER};
