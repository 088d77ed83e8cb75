//! Plain answers of the client API: [`LockInfo`], [`NodeStatus`], [`Member`]
//! and [`Grant`], converted from the wire messages. They serialize to JSON
//! with keys and owners as (lossy) UTF-8 strings.

use std::time::Duration;

use fencelock_types::client_pb;
use serde::{Serialize, Serializer};

/// Who holds a lock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LockInfo {
    #[serde(serialize_with = "lossy_utf8")]
    pub key: Vec<u8>,
    /// The holder's fencing token.
    pub token: u64,
    #[serde(serialize_with = "lossy_utf8")]
    pub owner: Vec<u8>,
    /// The lease of the last grant or renewal.
    pub lease_ms: u64,
    /// The time left on the lease, by the answering node's clock (the
    /// leader's for a linearizable read); 0 when it has run out or is not
    /// known.
    pub remaining_ms: u64,
    /// The lock expired and its key is held back by lock-delay: no one
    /// holds it (`token` and `owner` were the last holder's) and no one is
    /// granted it before the delay is over; `lease_ms` is the delay and
    /// `remaining_ms` what is left of it.
    pub delayed: bool,
    /// What the holder says of itself (its acquire's value, or its last
    /// proclaim; an election leader's value); empty for none.
    #[serde(serialize_with = "lossy_utf8")]
    pub value: Vec<u8>,
    /// How the holder holds the key: `exclusive` (a plain lock), `read` or
    /// `write` (a read-write lock), `permit` (one of a semaphore's
    /// `permits`).
    pub share: ShareKind,
    /// A semaphore's permits; 0 otherwise.
    pub permits: u32,
    /// The session the holder holds the key under (`lease_ms` and
    /// `remaining_ms` are then the session's); `None` for a lease of its
    /// own. In JSON only when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<u64>,
}

/// How a holder holds its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareKind {
    Exclusive,
    Read,
    Write,
    Permit,
}

impl From<client_pb::LockInfo> for LockInfo {
    fn from(info: client_pb::LockInfo) -> LockInfo {
        LockInfo {
            key: info.key,
            token: info.token,
            owner: info.owner,
            lease_ms: info.lease_ms,
            remaining_ms: info.remaining_ms,
            delayed: info.delayed,
            value: info.value,
            share: match info.share {
                client_pb::Share::EXCLUSIVE => ShareKind::Exclusive,
                client_pb::Share::READ => ShareKind::Read,
                client_pb::Share::WRITE => ShareKind::Write,
                client_pb::Share::PERMIT => ShareKind::Permit,
            },
            permits: info.permits,
            session: (info.session != 0).then_some(info.session),
        }
    }
}

/// What changed on a watched key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchEventKind {
    /// A new holder, under a new token.
    Granted,
    /// The holder released the lock (or an admin released it by force).
    Released,
    /// The holder's lease ran out.
    Expired,
    /// The holder's lease ran out and the key is held back by lock-delay.
    Delayed,
    /// The lock-delay is over: the key is free.
    DelayLifted,
    /// The holder proclaimed a new value.
    Proclaimed,
    /// A kind this client does not know (a newer server).
    Unknown,
}

impl WatchEventKind {
    /// Whether the key has no holder after this change.
    pub fn frees(self) -> bool {
        matches!(
            self,
            WatchEventKind::Released
                | WatchEventKind::Expired
                | WatchEventKind::Delayed
                | WatchEventKind::DelayLifted
        )
    }
}

/// One change of a watched key, with the log index of the entry that made
/// it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WatchEvent {
    pub index: u64,
    #[serde(serialize_with = "lossy_utf8")]
    pub key: Vec<u8>,
    pub kind: WatchEventKind,
    /// The token of the lock the change is about.
    pub token: u64,
    /// The lock's owner, and its value after the change.
    #[serde(serialize_with = "lossy_utf8")]
    pub owner: Vec<u8>,
    #[serde(serialize_with = "lossy_utf8")]
    pub value: Vec<u8>,
}

impl From<client_pb::WatchEvent> for WatchEvent {
    fn from(event: client_pb::WatchEvent) -> WatchEvent {
        use client_pb::WatchEventKind as Kind;
        WatchEvent {
            index: event.index,
            key: event.key,
            kind: match event.kind {
                Kind::WATCH_EVENT_KIND_GRANTED => WatchEventKind::Granted,
                Kind::WATCH_EVENT_KIND_RELEASED => WatchEventKind::Released,
                Kind::WATCH_EVENT_KIND_EXPIRED => WatchEventKind::Expired,
                Kind::WATCH_EVENT_KIND_DELAYED => WatchEventKind::Delayed,
                Kind::WATCH_EVENT_KIND_DELAY_LIFTED => WatchEventKind::DelayLifted,
                Kind::WATCH_EVENT_KIND_PROCLAIMED => WatchEventKind::Proclaimed,
                Kind::WATCH_EVENT_KIND_UNSPECIFIED => WatchEventKind::Unknown,
            },
            token: event.token,
            owner: event.owner,
            value: event.value,
        }
    }
}

/// One answer of a watch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WatchBatch {
    /// The changes after the asked index, in log order.
    pub events: Vec<WatchEvent>,
    /// Every change up to this index has been told: the position to watch
    /// from next.
    pub index: u64,
    /// The holders of the watched keys as of `index`: at the start, or
    /// when the position was `compacted` away.
    pub current: Option<Vec<LockInfo>>,
    /// The asked position was older than the node's history: changes may
    /// have been missed; `current` says where things stand.
    pub compacted: bool,
}

impl From<client_pb::WatchResponse> for WatchBatch {
    fn from(response: client_pb::WatchResponse) -> WatchBatch {
        WatchBatch {
            events: response.events.into_iter().map(WatchEvent::from).collect(),
            index: response.index,
            current: response.has_current.then(|| response.current.into_iter().map(LockInfo::from).collect()),
            compacted: response.compacted,
        }
    }
}

/// How a release ended: `released`, or not, and then which token holds
/// the key (`None`: the key is free).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    pub released: bool,
    pub holder_token: Option<u64>,
}

/// How a renewal of one lock ended: `renewed` to `lease`, or not, and then
/// which token holds the key (`None`: the key is free).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewed {
    pub renewed: bool,
    pub lease: Duration,
    pub holder_token: Option<u64>,
}

/// A lock granted without a guard, by
/// [`Client::acquire_raw`](crate::Client::acquire_raw): nothing renews or
/// releases it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The fencing token.
    pub token: u64,
    /// The lease granted, counted from when the request was sent.
    pub lease: Duration,
    /// This owner held the lock already (the acquire was a retry, say of
    /// one whose answer was lost): `token` is the token granted then.
    pub existing: bool,
}

/// An open session, from
/// [`Client::open_session`](crate::Client::open_session): locks, shared
/// holds and candidacies acquired under it live as long as it does, and
/// one keep-alive ([`Client::keep_alive`](crate::Client::keep_alive))
/// renews them all. Nothing keeps it alive by itself; a
/// [`SessionGuard`](crate::SessionGuard) does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Session {
    /// The session's id: a token from the cluster's fencing-token counter,
    /// never issued twice.
    pub id: u64,
    /// Its time to live: each keep-alive renews it for this long.
    pub ttl: Duration,
}

/// A node of the cluster, as the answering node knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Member {
    pub id: u64,
    pub peer_addr: String,
    /// Empty when the answering node does not know it yet.
    pub client_addr: String,
    /// The answering node had a raft message from this member within the
    /// last election timeout (always true of itself). A leader hears from
    /// every member that can reach it; a follower only from its leader.
    pub reachable: bool,
    /// `voter` or `learner` (`voter (joining)`, `voter (leaving)` while a
    /// joint change is under way).
    pub role: String,
}

impl From<fencelock_types::client_pb::Member> for Member {
    fn from(member: fencelock_types::client_pb::Member) -> Member {
        Member {
            id: member.id,
            peer_addr: member.peer_addr,
            client_addr: member.client_addr,
            reachable: member.reachable,
            role: member.role,
        }
    }
}

/// One node's view of itself and the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeStatus {
    pub node_id: u64,
    /// `leader`, `follower`, `candidate` or `pre-candidate`.
    pub role: String,
    pub term: u64,
    /// 0 when no leader is known.
    pub leader_id: u64,
    /// The leader's client address; empty when not known.
    pub leader_addr: String,
    pub commit_index: u64,
    pub applied_index: u64,
    pub last_index: u64,
    pub snapshot_index: u64,
    /// The size of the node's last snapshot, in bytes.
    pub snapshot_bytes: u64,
    /// Locks in this node's applied table.
    pub locks: u64,
    pub last_token: u64,
    pub members: Vec<Member>,
    /// The node lost its data and rejoined, and does not vote until it
    /// has caught up with the cluster.
    pub rejoining: bool,
    /// The cluster's id (32 hex digits); empty until the node has learnt it.
    pub cluster_id: String,
    /// The node started with an empty data directory and waits for the
    /// peers in `waiting_for` before it knows how it starts.
    pub starting: bool,
    pub waiting_for: Vec<u64>,
    /// The voters this node reaches, itself included, are a majority. On
    /// the leader: whether it can commit.
    pub quorum: bool,
}

impl From<client_pb::StatusResponse> for NodeStatus {
    fn from(status: client_pb::StatusResponse) -> NodeStatus {
        NodeStatus {
            node_id: status.node_id,
            role: status.role,
            term: status.term,
            leader_id: status.leader_id,
            leader_addr: status.leader_addr,
            commit_index: status.commit_index,
            applied_index: status.applied_index,
            last_index: status.last_index,
            snapshot_index: status.snapshot_index,
            snapshot_bytes: status.snapshot_bytes,
            locks: status.locks,
            last_token: status.last_token,
            members: status.members.into_iter().map(Member::from).collect(),
            rejoining: status.rejoining,
            cluster_id: status.cluster_id,
            starting: status.starting,
            waiting_for: status.waiting_for,
            quorum: status.quorum,
        }
    }
}

/// Writes bytes as a string, replacing invalid UTF-8: keys and owners are
/// usually text, and JSON has no byte strings.
pub(crate) fn lossy_utf8<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&String::from_utf8_lossy(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_info_serializes_bytes_as_strings() {
        let info = LockInfo {
            key: b"jobs/a".to_vec(),
            token: 7,
            owner: vec![b'w', 0xff],
            lease_ms: 1000,
            remaining_ms: 250,
            delayed: false,
            value: b"10.0.0.1:80".to_vec(),
            share: ShareKind::Exclusive,
            permits: 0,
            session: None,
        };
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"key": "jobs/a", "token": 7, "owner": "w\u{fffd}", "lease_ms": 1000, "remaining_ms": 250, "delayed": false, "value": "10.0.0.1:80", "share": "exclusive", "permits": 0})
        );
        // Under a session: one more field, the rest as they were.
        let json = serde_json::to_value(LockInfo { session: Some(12), ..info }).unwrap();
        assert_eq!(json["session"], serde_json::json!(12));
        assert_eq!(json.as_object().map(serde_json::Map::len), Some(10));
    }

    #[test]
    fn a_holders_session_reads_from_the_wire_with_0_as_none() {
        let wire = client_pb::LockInfo { key: b"k".to_vec(), token: 9, session: 4, ..Default::default() };
        assert_eq!(LockInfo::from(wire.clone()).session, Some(4));
        assert_eq!(LockInfo::from(client_pb::LockInfo { session: 0, ..wire }).session, None);
    }
}
