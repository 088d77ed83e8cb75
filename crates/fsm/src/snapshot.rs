//! The snapshot format of the lock table, a permanent format.
//!
//! ```text
//! offset  size  field
//!      0     4  magic "FLKT"
//!      4     2  format version, little-endian (1)
//!      6     2  reserved, must be 0
//!      8     8  body length in bytes, little-endian
//!     16     4  CRC-32 (IEEE) of the body, little-endian
//!     20     n  body: a protobuf `fencelock.TableSnapshot`
//! ```
//!
//! The body lists the locks in ascending key order, so equal tables give
//! equal bytes. Restoring checks everything (length, checksum, each record,
//! key order, token uniqueness, the token counter) before it builds the table,
//! so a corrupt snapshot gives an error and never a half-restored table.

use std::collections::BTreeSet;

use imbl::{OrdMap, OrdSet};

use fencelock_types::{
    pb, ClusterId, FencingToken, InvalidReason, Key, LeaseMs, Owner, Share, Value, PERMITS_MAX,
};
use protobuf::Message;

use crate::{Holder, Lock, LockTable, MemberAddrs, Session, Shared};

/// The longest member address a snapshot may hold (a host name of 253
/// bytes, a colon and a port, with room to spare).
pub const MEMBER_ADDR_MAX: usize = 300;

/// The snapshot format version this build writes. It reads this one only.
pub const SNAPSHOT_VERSION: u16 = 1;

const MAGIC: [u8; 4] = *b"FLKT";
const HEADER_LEN: usize = 20;

/// Why bytes could not be restored as a lock table.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot is {len} bytes, shorter than its {HEADER_LEN}-byte header")]
    TooShort { len: usize },
    #[error("not a lock-table snapshot (bad magic)")]
    BadMagic,
    #[error("snapshot format version {0} is not supported (this build reads {SNAPSHOT_VERSION})")]
    UnsupportedVersion(u16),
    #[error("snapshot header has reserved bits set ({0:#06x})")]
    ReservedBits(u16),
    #[error("snapshot body is {actual} bytes, header says {declared}")]
    LengthMismatch { declared: u64, actual: u64 },
    #[error("snapshot checksum mismatch")]
    Checksum,
    #[error("snapshot body is not a TableSnapshot: {0}")]
    Protobuf(String),
    #[error("lock record {index} is invalid: {reason}")]
    InvalidRecord { index: usize, reason: InvalidReason },
    #[error("lock record {index} is out of key order")]
    KeysOutOfOrder { index: usize },
    #[error("lock record {index} repeats token {token}")]
    DuplicateToken { index: usize, token: FencingToken },
    #[error("lock record {index} holds token {token}, past the last issued token")]
    TokenPastLast { index: usize, token: FencingToken },
    #[error("the cluster id is not {} bytes", fencelock_types::CLUSTER_ID_LEN)]
    BadClusterId,
    #[error("member record {index} is invalid: {reason}")]
    InvalidMember { index: usize, reason: &'static str },
    #[error("shared record {index} is invalid: {reason}")]
    InvalidShared { index: usize, reason: &'static str },
    #[error("session record {index} is invalid: {reason}")]
    InvalidSession { index: usize, reason: &'static str },
    #[error("a holder of {key} names session {session}, which is not open or not its owner's")]
    HolderOutOfSession { key: Key, session: u64 },
}

impl LockTable {
    /// Encodes the table as a snapshot. Equal tables give equal bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(HEADER_LEN + 16 + self.locks.len() * 48);
        bytes.resize(HEADER_LEN, 0);
        self.write_body(&mut bytes).expect("writing protobuf into a Vec cannot fail");
        let body_len = bytes.len() - HEADER_LEN;
        let crc = crc32fast::hash(&bytes[HEADER_LEN..]);
        let mut header = [0u8; HEADER_LEN];
        header[..4].copy_from_slice(&MAGIC);
        header[4..6].copy_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        header[8..16].copy_from_slice(&(body_len as u64).to_le_bytes());
        header[16..20].copy_from_slice(&crc.to_le_bytes());
        bytes[..HEADER_LEN].copy_from_slice(&header);
        bytes
    }

    /// Appends the `TableSnapshot` body, byte for byte as its generated
    /// code writes it (fields in number order, default values left out),
    /// without building the message first: that copied every key and owner
    /// twice, on the thread that serves the node.
    fn write_body(&self, bytes: &mut Vec<u8>) -> protobuf::ProtobufResult<()> {
        use protobuf::rt::{bytes_size, value_size};
        use protobuf::wire_format::WireType::{WireTypeLengthDelimited, WireTypeVarint};

        let mut out = protobuf::CodedOutputStream::vec(bytes);
        let last_token = self.last_token.map_or(0, FencingToken::get);
        if last_token != 0 {
            out.write_uint64(1, last_token)?;
        }
        for (key, lock) in &self.locks {
            let (key, owner) = (key.as_bytes(), lock.owner.as_bytes());
            let (token, lease_ms) = (lock.token.get(), lock.lease_ms.get());
            let mut len = 0;
            if !key.is_empty() {
                len += bytes_size(1, key);
            }
            if token != 0 {
                len += value_size(2, token, WireTypeVarint);
            }
            if !owner.is_empty() {
                len += bytes_size(3, owner);
            }
            if lease_ms != 0 {
                len += value_size(4, lease_ms, WireTypeVarint);
            }
            if lock.delayed {
                len += 2;
            }
            let value = lock.value.as_bytes();
            if !value.is_empty() {
                len += bytes_size(6, value);
            }
            let session = lock.session.map_or(0, FencingToken::get);
            if session != 0 {
                len += value_size(7, session, WireTypeVarint);
            }
            out.write_tag(2, WireTypeLengthDelimited)?;
            out.write_raw_varint32(len)?;
            if !key.is_empty() {
                out.write_bytes(1, key)?;
            }
            if token != 0 {
                out.write_uint64(2, token)?;
            }
            if !owner.is_empty() {
                out.write_bytes(3, owner)?;
            }
            if lease_ms != 0 {
                out.write_uint64(4, lease_ms)?;
            }
            if lock.delayed {
                out.write_bool(5, true)?;
            }
            if !value.is_empty() {
                out.write_bytes(6, value)?;
            }
            if session != 0 {
                out.write_uint64(7, session)?;
            }
        }
        if let Some(id) = &self.cluster_id {
            out.write_bytes(3, id.as_bytes())?;
        }
        for (id, addrs) in &self.members {
            let record = pb::MemberRecord {
                id: *id,
                peer_addr: addrs.peer_addr.clone(),
                client_addr: addrs.client_addr.clone(),
                ..Default::default()
            };
            out.write_message(4, &record)?;
        }
        for (key, shared) in &self.shared {
            let holders = shared
                .holders
                .iter()
                .map(|(token, holder)| pb::HolderRecord {
                    token: token.get(),
                    owner: holder.owner.as_bytes().to_vec(),
                    lease_ms: holder.lease_ms.get(),
                    share: holder.share.to_pb().0,
                    delayed: holder.delayed,
                    session: holder.session.map_or(0, FencingToken::get),
                    ..Default::default()
                })
                .collect();
            let record = pb::SharedRecord {
                key: key.as_bytes().to_vec(),
                permits: shared.permits,
                holders,
                ..Default::default()
            };
            out.write_message(5, &record)?;
        }
        // Level 1 is left out, as builds before levels wrote it.
        if self.level > 1 {
            out.write_uint32(6, self.level)?;
        }
        for (id, session) in &self.sessions {
            let record = pb::SessionRecord {
                session: id.get(),
                owner: session.owner.as_bytes().to_vec(),
                ttl_ms: session.ttl_ms.get(),
                ..Default::default()
            };
            out.write_message(7, &record)?;
        }
        out.flush()
    }

    /// Rebuilds a table from [`LockTable::snapshot`] bytes, or says why not.
    pub fn restore(bytes: &[u8]) -> Result<LockTable, SnapshotError> {
        let body = check_header(bytes)?;
        let snapshot = pb::TableSnapshot::parse_from_bytes(body)
            .map_err(|err| SnapshotError::Protobuf(err.to_string()))?;
        let last_token = FencingToken::new(snapshot.last_token);
        let cluster_id = match snapshot.cluster_id.as_slice() {
            [] => None,
            id => Some(ClusterId::from_slice(id).map_err(|_| SnapshotError::BadClusterId)?),
        };

        let mut tokens = BTreeSet::new();
        let mut sessions: OrdMap<FencingToken, Session> = OrdMap::new();
        for (index, record) in snapshot.sessions.into_iter().enumerate() {
            let invalid = |reason: &'static str| SnapshotError::InvalidSession { index, reason };
            let id = FencingToken::new(record.session).ok_or(invalid("session 0"))?;
            if sessions.keys().next_back().is_some_and(|last| *last >= id) {
                return Err(invalid("out of id order"));
            }
            if last_token.is_none_or(|last| id > last) {
                return Err(invalid("an id past the last issued token"));
            }
            if !tokens.insert(id) {
                return Err(invalid("an id that is also a lock's token"));
            }
            let owner = Owner::new(record.owner).map_err(|_| invalid("a bad owner"))?;
            let ttl_ms = LeaseMs::new(record.ttl_ms).map_err(|_| invalid("a bad ttl"))?;
            sessions.insert(id, Session { owner, ttl_ms, holds: OrdSet::new() });
        }
        // A holder naming a session joins its holdings: the session must be
        // open and its owner the holder's, and no holder held back is in one.
        let mut join = |key: &Key, token: FencingToken, owner: &Owner, delayed: bool, session: u64| {
            let Some(id) = FencingToken::new(session) else { return Ok(None) };
            match sessions.get_mut(&id) {
                Some(open) if open.owner == *owner && !delayed => {
                    open.holds.insert((key.clone(), token));
                    Ok(Some(id))
                }
                _ => Err(SnapshotError::HolderOutOfSession { key: key.clone(), session }),
            }
        };

        // Keys come sorted (checked below): collected in order, the map is
        // built in one pass instead of by one insertion per lock.
        let mut locks = Vec::with_capacity(snapshot.locks.len());
        for (index, record) in snapshot.locks.into_iter().enumerate() {
            let invalid = |reason| SnapshotError::InvalidRecord { index, reason };
            let key = Key::new(record.key).map_err(invalid)?;
            let owner = Owner::new(record.owner).map_err(invalid)?;
            let lease_ms = LeaseMs::new(record.lease_ms).map_err(invalid)?;
            let token = FencingToken::new(record.token).ok_or(invalid(InvalidReason::ZeroToken))?;
            let value = Value::new(record.value).map_err(invalid)?;
            if locks.last().is_some_and(|(previous, _): &(Key, Lock)| *previous >= key) {
                return Err(SnapshotError::KeysOutOfOrder { index });
            }
            if last_token.is_none_or(|last| token > last) {
                return Err(SnapshotError::TokenPastLast { index, token });
            }
            if !tokens.insert(token) {
                return Err(SnapshotError::DuplicateToken { index, token });
            }
            let session = join(&key, token, &owner, record.delayed, record.session)?;
            locks.push((key, Lock { token, owner, lease_ms, delayed: record.delayed, value, session }));
        }
        let mut identities: OrdMap<Vec<u8>, usize> = OrdMap::new();
        for (_, lock) in locks.iter().filter(|(_, lock)| !lock.delayed) {
            match identities.get_mut(lock.owner.identity()) {
                Some(count) => *count += 1,
                None => {
                    identities.insert(lock.owner.identity().to_vec(), 1);
                }
            }
        }
        let mut members = OrdMap::new();
        for (index, record) in snapshot.members.into_iter().enumerate() {
            let invalid = |reason| SnapshotError::InvalidMember { index, reason };
            if record.id == 0 {
                return Err(invalid("node id 0"));
            }
            if members.keys().next_back().is_some_and(|last| *last >= record.id) {
                return Err(invalid("out of id order"));
            }
            let addr_ok = |addr: &str| !addr.is_empty() && addr.len() <= MEMBER_ADDR_MAX;
            if !addr_ok(&record.peer_addr) || !addr_ok(&record.client_addr) {
                return Err(invalid("an address is empty or too long"));
            }
            members.insert(
                record.id,
                MemberAddrs { peer_addr: record.peer_addr, client_addr: record.client_addr },
            );
        }
        let mut shared_keys: Vec<(Key, Shared)> = Vec::with_capacity(snapshot.shared.len());
        let mut shared_holders = 0;
        for (index, record) in snapshot.shared.into_iter().enumerate() {
            let invalid = |reason: &'static str| SnapshotError::InvalidShared { index, reason };
            let key = Key::new(record.key).map_err(|_| invalid("a bad key"))?;
            if shared_keys.last().is_some_and(|(previous, _): &(Key, Shared)| *previous >= key) {
                return Err(invalid("out of key order"));
            }
            if locks.binary_search_by(|(locked, _)| locked.cmp(&key)).is_ok() {
                return Err(invalid("a key that is also a plain lock"));
            }
            if record.holders.is_empty() {
                return Err(invalid("no holders"));
            }
            let mut holders = OrdMap::new();
            for holder in record.holders {
                let owner = Owner::new(holder.owner).map_err(|_| invalid("a bad owner"))?;
                let lease_ms = LeaseMs::new(holder.lease_ms).map_err(|_| invalid("a bad lease"))?;
                let token = FencingToken::new(holder.token).ok_or(invalid("token 0"))?;
                let share = match (holder.share, record.permits) {
                    (pb::Share::PERMIT, permits) if permits > 0 => Share::Permit(permits),
                    (pb::Share::READ, 0) => Share::Read,
                    (pb::Share::WRITE, 0) => Share::Write,
                    _ => return Err(invalid("a share of another kind than the key")),
                };
                if last_token.is_none_or(|last| token > last) {
                    return Err(SnapshotError::TokenPastLast { index, token });
                }
                if !tokens.insert(token) {
                    return Err(SnapshotError::DuplicateToken { index, token });
                }
                if holders.values().any(|other: &Holder| other.owner == owner) {
                    return Err(invalid("an owner holding the key twice"));
                }
                let session = join(&key, token, &owner, holder.delayed, holder.session)?;
                holders.insert(token, Holder { owner, lease_ms, share, delayed: holder.delayed, session });
            }
            let valid = if record.permits > 0 {
                record.permits <= PERMITS_MAX && holders.len() <= record.permits as usize
            } else {
                holders.values().all(|holder| holder.share == Share::Read) || holders.len() == 1
            };
            if !valid {
                return Err(invalid("more holders than the kind allows"));
            }
            // Held back holders count for no one, as plain locks.
            for holder in holders.values().filter(|holder| !holder.delayed) {
                match identities.get_mut(holder.owner.identity()) {
                    Some(count) => *count += 1,
                    None => {
                        identities.insert(holder.owner.identity().to_vec(), 1);
                    }
                }
            }
            shared_holders += holders.len();
            shared_keys.push((key, Shared { permits: record.permits, holders }));
        }
        // A session counts as one of its owner's locks.
        for session in sessions.values() {
            match identities.get_mut(session.owner.identity()) {
                Some(count) => *count += 1,
                None => {
                    identities.insert(session.owner.identity().to_vec(), 1);
                }
            }
        }
        Ok(LockTable {
            locks: OrdMap::from_iter(locks),
            last_token,
            cluster_id,
            identities,
            members,
            shared: OrdMap::from_iter(shared_keys),
            shared_holders,
            level: snapshot.level.max(1),
            sessions,
        })
    }
}

/// Checks the header and returns the body.
fn check_header(bytes: &[u8]) -> Result<&[u8], SnapshotError> {
    let Some((header, body)) = bytes.split_first_chunk::<HEADER_LEN>() else {
        return Err(SnapshotError::TooShort { len: bytes.len() });
    };
    let (magic, rest) = header.split_at(4);
    if magic != MAGIC {
        return Err(SnapshotError::BadMagic);
    }
    let version = u16::from_le_bytes([rest[0], rest[1]]);
    if version != SNAPSHOT_VERSION {
        return Err(SnapshotError::UnsupportedVersion(version));
    }
    let reserved = u16::from_le_bytes([rest[2], rest[3]]);
    if reserved != 0 {
        return Err(SnapshotError::ReservedBits(reserved));
    }
    let mut len = [0; 8];
    len.copy_from_slice(&rest[4..12]);
    let declared = u64::from_le_bytes(len);
    let actual = body.len() as u64;
    if declared != actual {
        return Err(SnapshotError::LengthMismatch { declared, actual });
    }
    let crc = u32::from_le_bytes([rest[12], rest[13], rest[14], rest[15]]);
    if crc32fast::hash(body) != crc {
        return Err(SnapshotError::Checksum);
    }
    Ok(body)
}
