//! Apply results: the checked [`ApplyResult`] enum and its codec.
//!
//! Lock outcomes (held by another owner, stale token, not found) are values
//! here, never errors: applying a command always yields a result.

use protobuf::Message;

use crate::pb::{self, Result_oneof_kind as Kind};
use crate::{DecodeError, FencingToken, InvalidReason, LeaseMs};

/// What applying one command did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyResult {
    /// The key is held under `token` with a lease of `lease_ms`. `existing`
    /// says the owner already held it and kept its token (a retried acquire).
    Granted { token: FencingToken, lease_ms: LeaseMs, existing: bool },
    /// Another owner holds the key under `holder_token`.
    GrantRejected { holder_token: FencingToken },
    /// The lock held under `token` was removed.
    Released { token: FencingToken },
    /// No lock to release or renew: the key is free (`holder_token`
    /// `None`), or held under another token, `holder_token`.
    NotFound { holder_token: Option<FencingToken> },
    /// An Expire was processed; `existed` says whether it removed a lock.
    Expired { existed: bool },
    /// An Expire with a lock-delay ended the live lock under `token`: its
    /// key is held back for `delay_ms`, granted to no one, until a later
    /// Expire of the same token removes it.
    Delayed { token: FencingToken, delay_ms: LeaseMs },
    /// Nothing happened, by design.
    Noop,
    /// The lease of the lock held under `token` now lasts `lease_ms`.
    Renewed { token: FencingToken, lease_ms: LeaseMs },
    /// The command was refused before it touched the table.
    Invalid { reason: InvalidReason },
    /// A Release or Renew with a user, of the lock `token` holds for
    /// another user: nothing changed.
    Denied { token: FencingToken },
    /// The lock held under `token` now carries the value of the Proclaim.
    Proclaimed { token: FencingToken },
    /// A GrantShared of another kind than the key is: the key is a
    /// semaphore of `permits`, or a read-write lock (`permits` 0).
    Mismatch { permits: u32 },
    /// A command named a session that is not open (closed, lapsed, or
    /// never opened): nothing changed.
    NoSession { session: FencingToken },
}

impl ApplyResult {
    pub fn to_pb(&self) -> pb::Result {
        let kind = match *self {
            ApplyResult::Granted { token, lease_ms, existing } => Kind::granted(pb::Granted {
                token: token.get(),
                lease_ms: lease_ms.get(),
                existing,
                ..Default::default()
            }),
            ApplyResult::GrantRejected { holder_token } => Kind::grant_rejected(pb::GrantRejected {
                holder_token: holder_token.get(),
                ..Default::default()
            }),
            ApplyResult::Released { token } => {
                Kind::released(pb::Released { token: token.get(), ..Default::default() })
            }
            ApplyResult::NotFound { holder_token } => Kind::not_found(pb::NotFound {
                holder_token: holder_token.map_or(0, FencingToken::get),
                ..Default::default()
            }),
            ApplyResult::Expired { existed } => Kind::expired(pb::Expired { existed, ..Default::default() }),
            ApplyResult::Delayed { token, delay_ms } => Kind::delayed(pb::Delayed {
                token: token.get(),
                delay_ms: delay_ms.get(),
                ..Default::default()
            }),
            ApplyResult::Noop => Kind::noop(pb::NoopResult::default()),
            ApplyResult::Renewed { token, lease_ms } => Kind::renewed(pb::Renewed {
                token: token.get(),
                lease_ms: lease_ms.get(),
                ..Default::default()
            }),
            ApplyResult::Invalid { reason } => {
                Kind::invalid(pb::Invalid { reason: reason.to_pb(), ..Default::default() })
            }
            ApplyResult::Denied { token } => {
                Kind::denied(pb::Denied { token: token.get(), ..Default::default() })
            }
            ApplyResult::Proclaimed { token } => {
                Kind::proclaimed(pb::Proclaimed { token: token.get(), ..Default::default() })
            }
            ApplyResult::Mismatch { permits } => {
                Kind::mismatch(pb::Mismatch { permits, ..Default::default() })
            }
            ApplyResult::NoSession { session } => {
                Kind::no_session(pb::NoSession { session: session.get(), ..Default::default() })
            }
        };
        pb::Result { kind: Some(kind), ..Default::default() }
    }

    /// Checks a decoded protobuf result, as a client or peer receives it.
    pub fn from_pb(result: &pb::Result) -> Result<ApplyResult, DecodeError> {
        let kind = result.kind.as_ref().ok_or(DecodeError::Missing { message: "Result", field: "kind" })?;
        Ok(match kind {
            Kind::granted(granted) => ApplyResult::Granted {
                token: token_field("Granted", granted.token)?,
                lease_ms: lease_field("Granted", granted.lease_ms)?,
                existing: granted.existing,
            },
            Kind::grant_rejected(rejected) => ApplyResult::GrantRejected {
                holder_token: token_field("GrantRejected", rejected.holder_token)?,
            },
            Kind::released(released) => {
                ApplyResult::Released { token: token_field("Released", released.token)? }
            }
            Kind::not_found(not_found) => {
                ApplyResult::NotFound { holder_token: FencingToken::new(not_found.holder_token) }
            }
            Kind::expired(expired) => ApplyResult::Expired { existed: expired.existed },
            Kind::delayed(delayed) => ApplyResult::Delayed {
                token: token_field("Delayed", delayed.token)?,
                delay_ms: lease_field("Delayed", delayed.delay_ms)?,
            },
            Kind::noop(_) => ApplyResult::Noop,
            Kind::renewed(renewed) => ApplyResult::Renewed {
                token: token_field("Renewed", renewed.token)?,
                lease_ms: lease_field("Renewed", renewed.lease_ms)?,
            },
            Kind::invalid(invalid) => ApplyResult::Invalid {
                reason: InvalidReason::from_pb(invalid.reason)
                    .ok_or(DecodeError::Missing { message: "Invalid", field: "reason" })?,
            },
            Kind::denied(denied) => ApplyResult::Denied { token: token_field("Denied", denied.token)? },
            Kind::proclaimed(proclaimed) => {
                ApplyResult::Proclaimed { token: token_field("Proclaimed", proclaimed.token)? }
            }
            Kind::mismatch(mismatch) => ApplyResult::Mismatch { permits: mismatch.permits },
            Kind::no_session(none) => {
                ApplyResult::NoSession { session: token_field("NoSession", none.session)? }
            }
        })
    }
}

fn token_field(message: &'static str, value: u64) -> Result<FencingToken, DecodeError> {
    FencingToken::new(value).ok_or(DecodeError::Invalid { message, reason: InvalidReason::ZeroToken })
}

fn lease_field(message: &'static str, value: u64) -> Result<LeaseMs, DecodeError> {
    LeaseMs::new(value).map_err(|reason| DecodeError::Invalid { message, reason })
}

/// Encodes the results of one entry, in command order.
pub fn encode_results(results: &[ApplyResult]) -> Vec<u8> {
    let batch =
        pb::ResultBatch { results: results.iter().map(ApplyResult::to_pb).collect(), ..Default::default() };
    batch.write_to_bytes().expect("encoding a ResultBatch into a Vec cannot fail")
}

/// Decodes what [`encode_results`] wrote; any malformed part fails the whole.
pub fn decode_results(bytes: &[u8]) -> Result<Vec<ApplyResult>, DecodeError> {
    let batch = pb::ResultBatch::parse_from_bytes(bytes)?;
    batch.results.iter().map(ApplyResult::from_pb).collect()
}
