//! The client protocol's answer to a driver error: its stable error code,
//! and, for `NOT_LEADER`, where the leader is. Used by every module that
//! answers clients (the handler, the backups).

use fencelock_net::error_response;
use fencelock_raft::{NodeId, RequestError};
use fencelock_types::client_pb::{self as proto, ErrorCode};

/// The stable error code for each driver error.
pub(crate) fn error_to_response(
    id: u64,
    err: &RequestError,
    leader_addr: impl Fn(Option<NodeId>) -> Option<String>,
) -> proto::Response {
    let code = match err {
        RequestError::NotLeader { .. } => ErrorCode::NOT_LEADER,
        RequestError::LeadershipLost { .. } => ErrorCode::TIMEOUT,
        RequestError::Dropped | RequestError::Overloaded | RequestError::Stopped => ErrorCode::UNAVAILABLE,
        RequestError::LeaseOutOfBounds { .. } | RequestError::BadMemberChange(_) => {
            ErrorCode::INVALID_ARGUMENT
        }
        RequestError::MemberChangeBusy(_)
        | RequestError::TransferFailed(_)
        | RequestError::LevelNotReached { .. } => ErrorCode::UNAVAILABLE,
        RequestError::TooManyWaiters { .. }
        | RequestError::TooManyWatches { .. }
        | RequestError::QuotaExceeded(_) => ErrorCode::RESOURCE_EXHAUSTED,
        RequestError::Held { .. }
        | RequestError::Delayed { .. }
        | RequestError::WaitTimedOut { .. }
        | RequestError::Internal(_) => ErrorCode::INTERNAL,
    };
    let mut response = error_response(id, code, err.to_string());
    if let RequestError::NotLeader { leader_hint } = err {
        if let Some(error) = response.error.as_mut() {
            error.leader_id = leader_hint.map_or(0, |leader| leader.0);
            error.leader_addr = leader_addr(*leader_hint).unwrap_or_default();
        }
    }
    response
}
