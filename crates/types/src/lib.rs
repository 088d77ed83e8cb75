//! The replicated vocabulary of fencelock: the commands that travel in raft
//! log entries, the results the state machine gives for them, and their codec.
//!
//! Two layers live here:
//! - [`pb`], the protobuf messages generated from `proto/fencelock.proto`. They
//!   are the permanent on-disk and on-wire format: fields are added, never
//!   renumbered.
//! - Checked Rust types ([`Command`], [`ApplyResult`], [`Key`], [`Owner`],
//!   [`LeaseMs`], [`FencingToken`]). A value of these types is valid by
//!   construction: a [`Key`] is never empty nor over [`KEY_LEN_MAX`], a
//!   [`FencingToken`] is never 0. Code above this crate works with these and
//!   never with raw generated structs.
//!
//! Architecture invariants: this crate owns no logic beyond validation and
//! conversion. It knows nothing of raft, clocks, threads or I/O, and it never
//! panics on bytes from outside: every decoder returns an error instead.
//!
//! ```
//! use fencelock_types::{decode_batch, encode_batch, Command, Key, LeaseMs, Owner, Value};
//!
//! let grant = Command::Grant {
//!     key: Key::new(b"jobs/nightly".to_vec())?,
//!     lease_ms: LeaseMs::new(10_000)?,
//!     owner: Owner::new(b"worker-7".to_vec())?,
//!     value: Value::none(),
//!     session: None,
//! };
//! let entry = encode_batch(&[grant.clone()]);
//! let decoded = decode_batch(&entry)?;
//! assert_eq!(decoded, vec![Ok(grant)]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod command;
mod fast_batch;
pub mod hello;
mod result;

pub use command::{decode_batch, encode_batch, encode_owned_batch, raises, Command, Raises};
pub use result::ApplyResult;

use std::fmt;
use std::num::NonZeroU64;

/// The protobuf messages generated from `proto/fencelock.proto`: the
/// replicated commands, results and snapshot (permanent formats).
pub mod pb {
    #![allow(warnings, clippy::all, clippy::pedantic, missing_debug_implementations)]
    include!(concat!(env!("OUT_DIR"), "/fencelock.rs"));
}

/// The protobuf messages generated from `proto/client.proto`: the client
/// protocol and the peer handshake (stable formats).
pub mod client_pb {
    #![allow(warnings, clippy::all, clippy::pedantic, missing_debug_implementations)]
    include!(concat!(env!("OUT_DIR"), "/client.rs"));
}

/// The longest key, in bytes. Longer keys are refused with
/// [`InvalidReason::KeyTooLong`].
pub const KEY_LEN_MAX: usize = 1024;

/// The longest owner identity, in bytes.
pub const OWNER_LEN_MAX: usize = 256;

/// The longest value a lock may carry ([`Value`]), in bytes.
pub const VALUE_LEN_MAX: usize = 4096;

/// The most permits a semaphore may have.
pub const PERMITS_MAX: u32 = 100_000;

/// The command level this build applies. A level says which commands every
/// replica of a cluster knows, so that a rolling upgrade never has a new
/// leader propose what an old replica would skip (an old build applies a
/// command it does not know as `UnknownCommand`, changing nothing, while a
/// new one would grant, and issue a token: the counters would part):
/// - 1: Grant, Release, Expire, Renew, Noop, Bootstrap;
/// - 2: also GrantShared, Proclaim, RaiseLevel;
/// - 3: also OpenSession, RenewSession, CloseSession, ExpireSession, and
///   Grant and GrantShared under a session.
///
/// A cluster founded by this build starts at this level (Bootstrap); an
/// older cluster is raised by [`Command::RaiseLevel`] once every member
/// says, in its hello, that it applies it. The table refuses a command of
/// a level above its own ([`InvalidReason::LevelNotReached`]).
pub const LEVEL: u32 = 3;

/// The lock-delay for `key` under `rules` (prefix, delay): the rule of the
/// longest prefix the key starts with, if any. The leader's configuration
/// and the state machine's ExpireSession read the rules alike.
pub fn lock_delay_for(rules: &[(Vec<u8>, LeaseMs)], key: &[u8]) -> Option<LeaseMs> {
    rules
        .iter()
        .filter(|(prefix, _)| key.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, delay)| *delay)
}

/// The longest lease a command may carry: 30 days, in milliseconds. Servers
/// configure tighter bounds; this one only keeps deadline arithmetic far from
/// overflow on every replica.
pub const LEASE_MS_MAX: u64 = 30 * 24 * 60 * 60 * 1000;

/// The length of a [`ClusterId`] in bytes.
pub const CLUSTER_ID_LEN: usize = 16;

/// A cluster's name, chosen at random by its first leader and kept in the
/// replicated state: nodes refuse peers that name another cluster.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterId([u8; CLUSTER_ID_LEN]);

impl ClusterId {
    pub fn new(bytes: [u8; CLUSTER_ID_LEN]) -> ClusterId {
        ClusterId(bytes)
    }

    /// Checks bytes from the wire or the disk.
    pub fn from_slice(bytes: &[u8]) -> Result<ClusterId, InvalidReason> {
        bytes.try_into().map(ClusterId).map_err(|_| InvalidReason::BadClusterId)
    }

    pub fn as_bytes(&self) -> &[u8; CLUSTER_ID_LEN] {
        &self.0
    }

    /// Parses the 32 lowercase or uppercase hex digits [`Display`](fmt::Display) writes.
    pub fn from_hex(text: &str) -> Option<ClusterId> {
        if text.len() != 2 * CLUSTER_ID_LEN || !text.is_ascii() {
            return None;
        }
        let mut bytes = [0u8; CLUSTER_ID_LEN];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(ClusterId(bytes))
    }
}

/// 32 lowercase hex digits.
impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl fmt::Debug for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterId({self})")
    }
}

/// Why a command was refused, changing nothing in the lock table. Every
/// replica computes the same reason for the same bytes applied to the same
/// table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum InvalidReason {
    #[error("entry is not a decodable command batch")]
    Undecodable,
    #[error("unknown command kind")]
    UnknownCommand,
    #[error("key is empty")]
    EmptyKey,
    #[error("key is longer than {KEY_LEN_MAX} bytes")]
    KeyTooLong,
    #[error("lease_ms is 0")]
    ZeroLease,
    #[error("lease_ms is over {LEASE_MS_MAX}")]
    LeaseTooLong,
    #[error("owner is empty")]
    EmptyOwner,
    #[error("owner is longer than {OWNER_LEN_MAX} bytes")]
    OwnerTooLong,
    #[error("token is 0, which is never issued")]
    ZeroToken,
    #[error("every fencing token has been issued")]
    TokensExhausted,
    #[error("a cluster id is {CLUSTER_ID_LEN} bytes")]
    BadClusterId,
    #[error("value is longer than {VALUE_LEN_MAX} bytes")]
    ValueTooLong,
    #[error("a shared acquire is READ, WRITE, or PERMIT of 1 to {PERMITS_MAX} permits")]
    BadShare,
    #[error("the command needs a command level the cluster has not reached")]
    LevelNotReached,
    /// Unlike the others, decided by the table: a Proclaim whose token is a
    /// live reader, writer or permit of its key. Answering `NotFound` would
    /// tell a holder that it lost a key it holds.
    #[error("a shared holder (read, write or permit) carries no value to proclaim")]
    SharedHolderHasNoValue,
}

/// An error decoding bytes that came from outside: a log entry, a snapshot, a
/// peer or a client.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("malformed protobuf: {0}")]
    Protobuf(#[from] protobuf::ProtobufError),
    #[error("message {message} has no {field}")]
    Missing { message: &'static str, field: &'static str },
    #[error("invalid value in {message}: {reason}")]
    Invalid { message: &'static str, reason: InvalidReason },
}

/// A fencing token. Tokens start at 1 and strictly increase over the whole
/// lock table; 0 is never a token, which the type makes unrepresentable.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(NonZeroU64);

impl FencingToken {
    /// The first token a table issues.
    pub const FIRST: FencingToken = FencingToken(NonZeroU64::MIN);

    /// Returns the token for `value`, or `None` for 0.
    pub fn new(value: u64) -> Option<FencingToken> {
        NonZeroU64::new(value).map(FencingToken)
    }

    pub fn get(self) -> u64 {
        self.0.get()
    }

    /// The token after this one, or `None` when the `u64` space is spent.
    pub fn next(self) -> Option<FencingToken> {
        self.0.checked_add(1).map(FencingToken)
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({})", self.0)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Turns a token field of the wire format into a token, 0 meaning none.
fn optional_token(value: u64) -> Option<FencingToken> {
    FencingToken::new(value)
}

/// The raw wire value of an optional token, 0 meaning none.
fn token_value(token: Option<FencingToken>) -> u64 {
    token.map_or(0, FencingToken::get)
}

/// Defines a byte-string newtype that is 1 to `$max` bytes long.
macro_rules! bounded_bytes {
    ($(#[$doc:meta])* $name:ident, $max:expr, $empty:ident, $too_long:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Vec<u8>);

        impl $name {
            pub fn new(bytes: Vec<u8>) -> Result<$name, InvalidReason> {
                if bytes.is_empty() {
                    return Err(InvalidReason::$empty);
                }
                if bytes.len() > $max {
                    return Err(InvalidReason::$too_long);
                }
                Ok($name(bytes))
            }

            pub fn as_bytes(&self) -> &[u8] {
                &self.0
            }

            pub fn into_bytes(self) -> Vec<u8> {
                self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}(\"{}\")", stringify!($name), self.0.escape_ascii())
            }
        }

        /// Printable ASCII as is, other bytes escaped.
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0.escape_ascii())
            }
        }
    };
}

bounded_bytes!(
    /// A lock's name: 1 to [`KEY_LEN_MAX`] arbitrary bytes. Keys order
    /// byte-wise, which is the order of listings.
    Key, KEY_LEN_MAX, EmptyKey, KeyTooLong
);

bounded_bytes!(
    /// An opaque client identity: 1 to [`OWNER_LEN_MAX`] bytes. A Grant from
    /// the owner that already holds a key is a retry, answered with the same
    /// token.
    Owner, OWNER_LEN_MAX, EmptyOwner, OwnerTooLong
);

impl Owner {
    /// Whether this owner belongs to `user`: it is `user`, or `user/`
    /// followed by a suffix the user chose (`alice/worker-3`). With TLS,
    /// owners are bound to the authenticated user this way.
    pub fn is_of_user(&self, user: &[u8]) -> bool {
        match self.0.strip_prefix(user) {
            Some(rest) => rest.is_empty() || rest.starts_with(b"/"),
            None => false,
        }
    }

    /// The identity that quotas count this owner under: the bytes before
    /// the first `/`, or the whole owner without one. With TLS that is the
    /// authenticated user (`alice/worker-3` counts as `alice`).
    pub fn identity(&self) -> &[u8] {
        match self.0.iter().position(|byte| *byte == b'/') {
            Some(at) => &self.0[..at],
            None => &self.0,
        }
    }
}

/// What a holder says of itself while it holds a key: an election
/// candidate's value (its address, say). 0 to [`VALUE_LEN_MAX`] bytes;
/// empty is no value.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Value(Vec<u8>);

impl Value {
    pub fn new(bytes: Vec<u8>) -> Result<Value, InvalidReason> {
        if bytes.len() > VALUE_LEN_MAX {
            return Err(InvalidReason::ValueTooLong);
        }
        Ok(Value(bytes))
    }

    /// No value.
    pub fn none() -> Value {
        Value(Vec::new())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Value(\"{}\")", self.0.escape_ascii())
    }
}

/// Printable ASCII as is, other bytes escaped.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.escape_ascii())
    }
}

/// How a shared acquire holds its key: as a reader or the writer of a
/// read-write lock, or as one of the `permits` of a semaphore (1 to
/// [`PERMITS_MAX`], fixed by the key's first acquire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Share {
    /// One of the readers of a read-write lock: readers hold the key
    /// together, never beside a writer.
    Read,
    /// The writer of a read-write lock: the key's only holder.
    Write,
    /// One of the permits of a semaphore of this many (1 to
    /// [`PERMITS_MAX`]): at most that many holders at once.
    Permit(u32),
}

impl Share {
    /// Checks a wire share and permits.
    pub fn from_pb(share: pb::Share, permits: u32) -> Result<Share, InvalidReason> {
        match (share, permits) {
            (pb::Share::READ, 0) => Ok(Share::Read),
            (pb::Share::WRITE, 0) => Ok(Share::Write),
            (pb::Share::PERMIT, 1..=PERMITS_MAX) => Ok(Share::Permit(permits)),
            _ => Err(InvalidReason::BadShare),
        }
    }

    /// The wire share and permits.
    pub fn to_pb(self) -> (pb::Share, u32) {
        match self {
            Share::Read => (pb::Share::READ, 0),
            Share::Write => (pb::Share::WRITE, 0),
            Share::Permit(permits) => (pb::Share::PERMIT, permits),
        }
    }

    /// The semaphore's permits, or 0 for a read-write lock's modes.
    pub fn permits(self) -> u32 {
        match self {
            Share::Permit(permits) => permits,
            Share::Read | Share::Write => 0,
        }
    }
}

/// Lets maps keyed by [`Key`] be searched with plain byte slices.
impl std::borrow::Borrow<[u8]> for Key {
    fn borrow(&self) -> &[u8] {
        &self.0
    }
}

/// A lease length in milliseconds, from 1 to [`LEASE_MS_MAX`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseMs(u64);

impl LeaseMs {
    /// The shortest lease, 1 ms.
    pub const MIN: LeaseMs = LeaseMs(1);

    pub fn new(ms: u64) -> Result<LeaseMs, InvalidReason> {
        if ms == 0 {
            return Err(InvalidReason::ZeroLease);
        }
        if ms > LEASE_MS_MAX {
            return Err(InvalidReason::LeaseTooLong);
        }
        Ok(LeaseMs(ms))
    }

    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for LeaseMs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

#[cfg(test)]
mod tests;
