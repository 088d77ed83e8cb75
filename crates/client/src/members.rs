//! Membership and leadership calls (admin only under TLS): list, add a
//! learner, promote, remove, and hand leadership over. Each goes to the
//! leader and is retried like any call; every change is safe to retry (a
//! change that already applied is answered with the membership as it is).

use fencelock_types::client_pb::{
    LeaderTransferRequest, MemberAddRequest, MemberListRequest, MemberPromoteRequest, MemberRemoveRequest,
    MemberResponse, Request_oneof_kind, Response_oneof_kind,
};
use serde::Serialize;

use crate::client::unexpected;
use crate::{Client, ClientError, Member};

/// The cluster's members, as the leader applied them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Membership {
    pub members: Vec<Member>,
    /// The leader's applied log index when it answered: for a change, the
    /// index at which it applied; for a list, where the leader's log was
    /// (it moves with every write, not only with the configuration).
    pub index: u64,
}

impl From<MemberResponse> for Membership {
    fn from(response: MemberResponse) -> Membership {
        Membership {
            members: response.members.into_iter().map(Member::from).collect(),
            index: response.index,
        }
    }
}

impl Client {
    /// The members (linearizable: from the leader).
    pub fn member_list(&self) -> Result<Membership, ClientError> {
        self.member_call("member list", Request_oneof_kind::member_list(MemberListRequest::default()))
    }

    /// Adds node `id` as a learner, reached by peers at `peer_addr` and by
    /// clients at `client_addr` (HOST:PORT each).
    pub fn member_add(&self, id: u64, peer_addr: &str, client_addr: &str) -> Result<Membership, ClientError> {
        let request = MemberAddRequest {
            id,
            peer_addr: peer_addr.to_string(),
            client_addr: client_addr.to_string(),
            ..Default::default()
        };
        self.member_call("member add", Request_oneof_kind::member_add(request))
    }

    /// Makes learner `id` a voter. The server answers UNAVAILABLE while it
    /// has not caught up, which this call retries until its retry budget
    /// runs out.
    pub fn member_promote(&self, id: u64) -> Result<Membership, ClientError> {
        let request = MemberPromoteRequest { id, ..Default::default() };
        self.member_call("member promote", Request_oneof_kind::member_promote(request))
    }

    /// Removes node `id`. Removing the leader hands leadership over first;
    /// the retry at the new leader removes it.
    pub fn member_remove(&self, id: u64) -> Result<Membership, ClientError> {
        let request = MemberRemoveRequest { id, ..Default::default() };
        self.member_call("member remove", Request_oneof_kind::member_remove(request))
    }

    /// Hands leadership to voter `id`; returns the new leader's id.
    pub fn leader_transfer(&self, id: u64) -> Result<u64, ClientError> {
        let request = LeaderTransferRequest { id, ..Default::default() };
        match self.inner.call_simple(Request_oneof_kind::leader_transfer(request))? {
            Response_oneof_kind::leader_transfer(response) => Ok(response.leader_id),
            other => Err(unexpected("leader transfer", &other)),
        }
    }

    fn member_call(&self, call: &str, request: Request_oneof_kind) -> Result<Membership, ClientError> {
        match self.inner.call_simple(request)? {
            Response_oneof_kind::member(response) => Ok(Membership::from(response)),
            other => Err(unexpected(call, &other)),
        }
    }
}
