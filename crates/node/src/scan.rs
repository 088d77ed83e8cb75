//! A raft message from a peer, sized up from its bytes before it is
//! decoded: how many entries, members and unknown fields decoding would
//! build. Decoding is where a hostile peer's bytes turn into memory (16 MiB
//! of empty entries is eight million `Entry` structs, over a gigabyte), so
//! the transport asks here first and drops a message over the bounds
//! without decoding it. The gate ([`crate::gate`]) checks the decoded
//! message afterwards, with the same bounds and much more.
//!
//! It owns the counting only: it walks the protobuf wire format of
//! `eraftpb::Message` (and the `Entry`, `Snapshot`, `SnapshotMetadata` and
//! `ConfState` inside it) without allocating, in time linear in the bytes.
//! Whether the message decodes is protobuf's to say.

use crate::gate::{ENTRIES_MAX, MEMBERS_MAX};

/// Fields of no known number that a message may carry in all: raft-rs
/// 0.7's peers send none; a newer peer might send a few.
pub const UNKNOWN_FIELDS_MAX: usize = 64;

/// Nesting deeper than the schema below is malformed.
const DEPTH_MAX: usize = 4;

/// What a message would build when decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Size {
    pub entries: usize,
    /// Node ids in the snapshot's configuration, its lists together.
    pub members: usize,
    pub unknown_fields: usize,
}

/// Why a message is not decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TooLarge {
    #[error("a raft message with more than {ENTRIES_MAX} entries")]
    Entries,
    #[error("a raft message whose configuration names more than {max} node ids", max = 4 * MEMBERS_MAX)]
    Members,
    #[error("a raft message with more than {UNKNOWN_FIELDS_MAX} unknown fields")]
    UnknownFields,
    #[error("a raft message that is not protobuf: {0}")]
    Malformed(&'static str),
}

/// The protobuf messages inside a raft message, as far as counting goes.
#[derive(Clone, Copy)]
enum Schema {
    Message,
    Entry,
    Snapshot,
    Metadata,
    ConfState,
}

/// What a field of a schema is.
enum Field {
    Known,
    /// One entry of `Message.entries`, itself an `Entry`.
    Entry,
    /// A node id list of `ConfState` (packed or not).
    Members,
    Nested(Schema),
    Unknown,
}

impl Schema {
    fn field(self, number: u64) -> Field {
        match (self, number) {
            (Schema::Message, 7) => Field::Entry,
            (Schema::Message, 9) => Field::Nested(Schema::Snapshot),
            // msg_type .. priority (raft-rs 0.7).
            (Schema::Message, 1..=16) => Field::Known,
            // entry_type, term, index, data, sync_log, context.
            (Schema::Entry, 1..=6) => Field::Known,
            (Schema::Snapshot, 1) => Field::Known,
            (Schema::Snapshot, 2) => Field::Nested(Schema::Metadata),
            (Schema::Metadata, 1) => Field::Nested(Schema::ConfState),
            (Schema::Metadata, 2..=3) => Field::Known,
            (Schema::ConfState, 1..=4) => Field::Members,
            (Schema::ConfState, 5) => Field::Known,
            _ => Field::Unknown,
        }
    }
}

/// Sizes up an encoded `eraftpb::Message`; `Err` if decoding it would
/// build more than the bounds allow, or it is not protobuf at all.
pub fn peer_message(bytes: &[u8]) -> Result<Size, TooLarge> {
    let mut size = Size::default();
    walk(bytes, Schema::Message, 0, &mut size)?;
    Ok(size)
}

fn walk(bytes: &[u8], schema: Schema, depth: usize, size: &mut Size) -> Result<(), TooLarge> {
    if depth > DEPTH_MAX {
        return Err(TooLarge::Malformed("nested too deep"));
    }
    let mut at = 0;
    while at < bytes.len() {
        let tag = varint(bytes, &mut at)?;
        let (number, wire_type) = (tag >> 3, tag & 7);
        let value = match wire_type {
            0 => {
                varint(bytes, &mut at)?;
                None
            }
            1 => Some(take(bytes, &mut at, 8)?),
            2 => {
                let len =
                    usize::try_from(varint(bytes, &mut at)?).map_err(|_| TooLarge::Malformed("a length"))?;
                Some(take(bytes, &mut at, len)?)
            }
            5 => Some(take(bytes, &mut at, 4)?),
            _ => return Err(TooLarge::Malformed("a wire type raft does not use")),
        };
        match schema.field(number) {
            Field::Known => {}
            Field::Unknown => {
                size.unknown_fields += 1;
                if size.unknown_fields > UNKNOWN_FIELDS_MAX {
                    return Err(TooLarge::UnknownFields);
                }
            }
            Field::Entry => {
                size.entries += 1;
                if size.entries > ENTRIES_MAX {
                    return Err(TooLarge::Entries);
                }
                if let (2, Some(entry)) = (wire_type, value) {
                    walk(entry, Schema::Entry, depth + 1, size)?;
                }
            }
            Field::Members => {
                // Packed: one id per varint, each ending in a byte under
                // 0x80; else one id.
                size.members += match (wire_type, value) {
                    (2, Some(packed)) => packed.iter().filter(|byte| **byte < 0x80).count(),
                    _ => 1,
                };
                if size.members > 4 * MEMBERS_MAX {
                    return Err(TooLarge::Members);
                }
            }
            Field::Nested(inner) => {
                if let (2, Some(message)) = (wire_type, value) {
                    walk(message, inner, depth + 1, size)?;
                }
            }
        }
    }
    Ok(())
}

fn varint(bytes: &[u8], at: &mut usize) -> Result<u64, TooLarge> {
    let mut value = 0u64;
    for shift in (0..70).step_by(7) {
        let byte = *bytes.get(*at).ok_or(TooLarge::Malformed("a truncated varint"))?;
        *at += 1;
        value |= u64::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
        if byte < 0x80 {
            return Ok(value);
        }
    }
    Err(TooLarge::Malformed("a varint over 10 bytes"))
}

fn take<'a>(bytes: &'a [u8], at: &mut usize, len: usize) -> Result<&'a [u8], TooLarge> {
    let end = at.checked_add(len).ok_or(TooLarge::Malformed("a length"))?;
    let slice = bytes.get(*at..end).ok_or(TooLarge::Malformed("a length past the end"))?;
    *at = end;
    Ok(slice)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use protobuf::Message as _;
    use raft::prelude::{ConfState, Entry, Message, MessageType, Snapshot};

    use super::*;

    fn append(entries: usize, data: &[u8]) -> Message {
        let mut message = Message::default();
        message.set_msg_type(MessageType::MsgAppend);
        message.to = 2;
        message.from = 1;
        message.term = 3;
        message.set_entries(
            (0..entries)
                .map(|n| Entry {
                    index: n as u64 + 1,
                    term: 3,
                    data: data.to_vec().into(),
                    ..Default::default()
                })
                .collect::<Vec<_>>()
                .into(),
        );
        message
    }

    #[test]
    fn an_append_is_counted_as_it_decodes() {
        for entries in [0, 1, 7, 300] {
            let bytes = append(entries, b"commands").write_to_bytes().unwrap();
            let size = peer_message(&bytes).unwrap();
            assert_eq!(size, Size { entries, members: 0, unknown_fields: 0 });
        }
        let mut snapshot = Message::default();
        snapshot.set_msg_type(MessageType::MsgSnapshot);
        let mut body = Snapshot { data: vec![7; 1000].into(), ..Default::default() };
        let conf = ConfState { voters: vec![1, 2, 300], learners: vec![4], ..Default::default() };
        body.mut_metadata().set_conf_state(conf);
        snapshot.set_snapshot(body);
        let size = peer_message(&snapshot.write_to_bytes().unwrap()).unwrap();
        assert_eq!(size, Size { entries: 0, members: 4, unknown_fields: 0 });
    }

    /// The bomb of issue 31: 16 MiB of empty entries, refused before a
    /// single one is built, and a message just at the bound taken.
    #[test]
    fn a_bomb_of_empty_entries_is_refused_before_decoding() {
        let empty_entry = [0x3a, 0x00];
        let bomb: Vec<u8> = empty_entry.iter().copied().cycle().take(16 << 20).collect();
        assert_eq!(peer_message(&bomb), Err(TooLarge::Entries));
        let at_bound: Vec<u8> = empty_entry.iter().copied().cycle().take(2 * ENTRIES_MAX).collect();
        assert_eq!(peer_message(&at_bound).unwrap().entries, ENTRIES_MAX);
        let over: Vec<u8> = empty_entry.iter().copied().cycle().take(2 * ENTRIES_MAX + 2).collect();
        assert_eq!(peer_message(&over), Err(TooLarge::Entries));
    }

    #[test]
    fn members_and_unknown_fields_are_bounded_and_garbage_is_malformed() {
        // A snapshot whose configuration packs a million voters.
        let mut conf_state = vec![0x0a];
        let ids = vec![0x01; 1 << 20];
        push_len(&mut conf_state, &ids);
        let mut metadata = vec![0x0a];
        push_len(&mut metadata, &conf_state);
        let mut snapshot = vec![0x12];
        push_len(&mut snapshot, &metadata);
        let mut message = vec![0x4a];
        push_len(&mut message, &snapshot);
        assert_eq!(peer_message(&message), Err(TooLarge::Members));
        // Field 99, a varint, over and over.
        let unknown: Vec<u8> = [0x98, 0x06, 0x01].iter().copied().cycle().take(3 * 100).collect();
        assert_eq!(peer_message(&unknown), Err(TooLarge::UnknownFields));
        for garbage in [&[0x08][..], &[0x3a, 0x05, 0x00], &[0x0b], &[0xff; 11]] {
            assert!(matches!(peer_message(garbage), Err(TooLarge::Malformed(_))), "{garbage:?}");
        }
    }

    fn push_len(out: &mut Vec<u8>, body: &[u8]) {
        let mut len = body.len() as u64;
        while len >= 0x80 {
            out.push((len as u8) | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
        out.extend_from_slice(body);
    }

    proptest::proptest! {
        /// Whatever the bytes, the scan ends without a panic, and whatever
        /// it passes that protobuf decodes has the entries it counted.
        #[test]
        fn the_count_is_the_decoded_count(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            if let Ok(size) = peer_message(&bytes) {
                if let Ok(message) = Message::parse_from_bytes(&bytes) {
                    proptest::prop_assert_eq!(size.entries, message.get_entries().len());
                }
            }
        }
    }
}
