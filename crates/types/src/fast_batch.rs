//! A fast path for [`decode_batch`](crate::decode_batch): a batch of the
//! commands every lock takes (Grant, Release, Expire, Renew), in the form
//! our encoder writes, decoded without the generic protobuf machinery.
//!
//! It owns no meaning of its own. It accepts only an unambiguous subset of
//! the wire format: each field at most once, in increasing field order,
//! with its declared wire type, no unknown field, every length inside its
//! message. Anything else (another command kind, a repeated field, a
//! truncated varint) answers `None`, and the caller decodes the whole batch
//! with protobuf. What it accepts it turns into the same `pb` messages and
//! checks with the same [`Command::from_pb`], so for every input it decodes,
//! the result is protobuf's (a property test checks this on random and on
//! damaged batches). Replicas of different versions therefore read a log
//! entry the same way.

use crate::pb::{self, Command_oneof_kind as Kind};
use crate::{Command, InvalidReason};

/// Wire types (protobuf encoding).
const VARINT: u64 = 0;
const LEN: u64 = 2;

/// The batch's `commands` field: field 1, length-delimited.
const BATCH_COMMAND_TAG: u64 = (1 << 3) | LEN;

/// The most fields a hot command has.
const FIELDS_MAX: usize = 5;

/// Decodes `bytes` if it is a batch of hot commands in canonical form;
/// `None` means "use protobuf", never "invalid".
pub(crate) fn decode(bytes: &[u8]) -> Option<Vec<Result<Command, InvalidReason>>> {
    let mut batch = Reader::new(bytes);
    // Each command takes at least 4 bytes: a good first guess of the count.
    let mut commands = Vec::with_capacity(bytes.len() / 32);
    while !batch.is_done() {
        if batch.varint()? != BATCH_COMMAND_TAG {
            return None;
        }
        commands.push(command(batch.slice()?)?);
    }
    Some(commands)
}

/// One `pb::Command` holding one hot kind, and nothing else.
fn command(bytes: &[u8]) -> Option<Result<Command, InvalidReason>> {
    let mut message = Reader::new(bytes);
    let tag = message.varint()?;
    if tag & 7 != LEN {
        return None;
    }
    let body = message.slice()?;
    if !message.is_done() {
        return None;
    }
    let kind = match tag >> 3 {
        1 => {
            let [key, lease_ms, owner, value, session] = fields(body, &[LEN, VARINT, LEN, LEN, VARINT])?;
            Kind::grant(pb::Grant {
                key: key.bytes(),
                lease_ms: lease_ms.number(),
                owner: owner.bytes(),
                value: value.bytes(),
                session: session.number(),
                ..Default::default()
            })
        }
        2 => {
            let [key, token, user, _, _] = fields(body, &[LEN, VARINT, LEN])?;
            Kind::release(pb::Release {
                key: key.bytes(),
                token: token.number(),
                user: user.bytes(),
                ..Default::default()
            })
        }
        3 => {
            let [key, token, delay_ms, _, _] = fields(body, &[LEN, VARINT, VARINT])?;
            Kind::expire(pb::Expire {
                key: key.bytes(),
                token: token.number(),
                delay_ms: delay_ms.number(),
                ..Default::default()
            })
        }
        4 => {
            let [key, token, lease_ms, user, _] = fields(body, &[LEN, VARINT, VARINT, LEN])?;
            Kind::renew(pb::Renew {
                key: key.bytes(),
                token: token.number(),
                lease_ms: lease_ms.number(),
                user: user.bytes(),
                ..Default::default()
            })
        }
        _ => return None,
    };
    Some(Command::from_pb(pb::Command { kind: Some(kind), ..Default::default() }))
}

/// A field's value as read, or absent (its proto3 default).
#[derive(Clone, Copy, Default)]
enum Field<'a> {
    #[default]
    Absent,
    Number(u64),
    Bytes(&'a [u8]),
}

impl Field<'_> {
    fn number(self) -> u64 {
        match self {
            Field::Number(value) => value,
            _ => 0,
        }
    }

    fn bytes(self) -> Vec<u8> {
        match self {
            Field::Bytes(bytes) => bytes.to_vec(),
            _ => Vec::new(),
        }
    }
}

/// The fields of a message whose field `n` (from 1) has wire type
/// `types[n - 1]`; `None` unless each comes at most once, in order, with
/// its wire type, and no other field comes.
fn fields<'a>(bytes: &'a [u8], types: &[u64]) -> Option<[Field<'a>; FIELDS_MAX]> {
    let mut message = Reader::new(bytes);
    let mut fields = [Field::Absent; FIELDS_MAX];
    let mut last = 0;
    while !message.is_done() {
        let tag = message.varint()?;
        let number = usize::try_from(tag >> 3).ok()?;
        if number <= last || types.get(number.wrapping_sub(1)) != Some(&(tag & 7)) {
            return None;
        }
        last = number;
        let field = fields.get_mut(number - 1)?;
        *field = match tag & 7 {
            VARINT => Field::Number(message.varint()?),
            _ => Field::Bytes(message.slice()?),
        };
    }
    Some(fields)
}

/// Reads varints and length-delimited slices from a byte string.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, at: 0 }
    }

    fn is_done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    /// A varint of at most 10 bytes that fits in 64 bits.
    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.bytes.get(self.at)?;
            self.at += 1;
            if shift == 63 && byte > 1 {
                return None;
            }
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(value);
            }
        }
        None
    }

    /// A length, then that many bytes.
    fn slice(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        let end = self.at.checked_add(len)?;
        let slice = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(slice)
    }
}
