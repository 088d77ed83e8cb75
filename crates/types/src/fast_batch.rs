//! A fast path for [`decode_batch`](crate::decode_batch): a batch of the
//! commands every lock takes (Grant, Release, Expire, Renew), in the form
//! our encoder writes, decoded without the generic protobuf machinery; and
//! the same commands encoded byte for byte as protobuf encodes them.
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
use crate::{token_value, Command, InvalidReason, Owner};

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
    // A command takes 32 bytes or more, as a rule: a first guess of the
    // count, capped so that a forged entry reserves no more than it fills.
    let mut commands = Vec::with_capacity((bytes.len() / 32).min(1024));
    while !batch.is_done() {
        if batch.varint()? != BATCH_COMMAND_TAG {
            return None;
        }
        commands.push(command(batch.slice()?)?);
    }
    Some(commands)
}

/// The wire types of a hot command kind's fields, field 1 first.
fn wire_types(kind: u64) -> Option<&'static [u64]> {
    match kind {
        1 => Some(&[LEN, VARINT, LEN, LEN, VARINT]), // Grant
        2 => Some(&[LEN, VARINT, LEN]),              // Release
        3 => Some(&[LEN, VARINT, VARINT]),           // Expire
        4 => Some(&[LEN, VARINT, VARINT, LEN]),      // Renew
        _ => None,
    }
}

/// One `pb::Command` holding one hot kind in canonical form, and nothing
/// else: its kind and fields.
fn hot_command(bytes: &[u8]) -> Option<(u64, [Field<'_>; FIELDS_MAX])> {
    let mut message = Reader::new(bytes);
    let tag = message.varint()?;
    if tag & 7 != LEN {
        return None;
    }
    let body = message.slice()?;
    if !message.is_done() {
        return None;
    }
    let kind = tag >> 3;
    Some((kind, fields(body, wire_types(kind)?)?))
}

/// One hot command, checked as protobuf's would be.
fn command(bytes: &[u8]) -> Option<Result<Command, InvalidReason>> {
    let (kind, fields) = hot_command(bytes)?;
    let kind = match (kind, fields) {
        (1, [key, lease_ms, owner, value, session]) => Kind::grant(pb::Grant {
            key: key.bytes(),
            lease_ms: lease_ms.number(),
            owner: owner.bytes(),
            value: value.bytes(),
            session: session.number(),
            ..Default::default()
        }),
        (2, [key, token, user, ..]) => Kind::release(pb::Release {
            key: key.bytes(),
            token: token.number(),
            user: user.bytes(),
            ..Default::default()
        }),
        (3, [key, token, delay_ms, ..]) => Kind::expire(pb::Expire {
            key: key.bytes(),
            token: token.number(),
            delay_ms: delay_ms.number(),
            ..Default::default()
        }),
        (4, [key, token, lease_ms, user, _]) => Kind::renew(pb::Renew {
            key: key.bytes(),
            token: token.number(),
            lease_ms: lease_ms.number(),
            user: user.bytes(),
            ..Default::default()
        }),
        _ => return None,
    };
    Some(Command::from_pb(pb::Command { kind: Some(kind), ..Default::default() }))
}

/// Whether every command of the batch `bytes` is one field, of a hot kind:
/// protobuf then decodes each as that kind, whatever is inside (or fails
/// the whole batch, which then applies nothing), so none raises a level or
/// a token floor. Checked without reading the commands' fields.
pub(crate) fn only_hot_kinds(bytes: &[u8]) -> bool {
    let mut batch = Reader::new(bytes);
    while !batch.is_done() {
        if batch.varint() != Some(BATCH_COMMAND_TAG) {
            return false;
        }
        let Some(command) = batch.slice() else { return false };
        let mut command = Reader::new(command);
        let one_hot_field =
            command.varint().is_some_and(|tag| tag & 7 == LEN && wire_types(tag >> 3).is_some())
                && command.slice().is_some()
                && command.is_done();
        if !one_hot_field {
            return false;
        }
    }
    true
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

/// Appends `command` to a batch being encoded (field 1 of `CommandBatch`),
/// in the bytes protobuf writes for it, if it is a hot command; false,
/// with nothing written, for the others.
pub(crate) fn encode(command: &Command, out: &mut Vec<u8>) -> bool {
    let (kind, fields): (u64, [Out<'_>; FIELDS_MAX]) = match command {
        Command::Grant { key, lease_ms, owner, value, session } => (
            1,
            [
                Out::Bytes(key.as_bytes()),
                Out::Number(lease_ms.get()),
                Out::Bytes(owner.as_bytes()),
                Out::Bytes(value.as_bytes()),
                Out::Number(token_value(*session)),
            ],
        ),
        Command::Release { key, token, user: by } => (
            2,
            [
                Out::Bytes(key.as_bytes()),
                Out::Number(token_value(*token)),
                Out::Bytes(user(by)),
                Out::None,
                Out::None,
            ],
        ),
        Command::Expire { key, token, delay } => (
            3,
            [
                Out::Bytes(key.as_bytes()),
                Out::Number(token.get()),
                Out::Number(delay.map_or(0, |delay| delay.get())),
                Out::None,
                Out::None,
            ],
        ),
        Command::Renew { key, token, lease_ms, user: by } => (
            4,
            [
                Out::Bytes(key.as_bytes()),
                Out::Number(token.get()),
                Out::Number(lease_ms.get()),
                Out::Bytes(user(by)),
                Out::None,
            ],
        ),
        _ => return false,
    };
    let body: usize = fields.iter().enumerate().map(|(at, field)| field.len(at)).sum();
    // The command: its kind's field, holding the body.
    let message = varint_len(kind << 3) + varint_len(body as u64) + body;
    out.reserve(1 + varint_len(message as u64) + message);
    write_varint(out, BATCH_COMMAND_TAG);
    write_varint(out, message as u64);
    write_varint(out, (kind << 3) | LEN);
    write_varint(out, body as u64);
    for (at, field) in fields.iter().enumerate() {
        field.write(at, out);
    }
    true
}

/// A field to write; proto3 leaves out a zero or an empty one.
#[derive(Clone, Copy)]
enum Out<'a> {
    None,
    Number(u64),
    Bytes(&'a [u8]),
}

impl Out<'_> {
    /// Its encoded length as field `at + 1`.
    fn len(self, at: usize) -> usize {
        let tag = ((at as u64) + 1) << 3;
        match self {
            Out::Number(value) if value != 0 => varint_len(tag) + varint_len(value),
            Out::Bytes(bytes) if !bytes.is_empty() => {
                varint_len(tag) + varint_len(bytes.len() as u64) + bytes.len()
            }
            _ => 0,
        }
    }

    fn write(self, at: usize, out: &mut Vec<u8>) {
        let tag = ((at as u64) + 1) << 3;
        match self {
            Out::Number(value) if value != 0 => {
                write_varint(out, tag | VARINT);
                write_varint(out, value);
            }
            Out::Bytes(bytes) if !bytes.is_empty() => {
                write_varint(out, tag | LEN);
                write_varint(out, bytes.len() as u64);
                out.extend_from_slice(bytes);
            }
            _ => {}
        }
    }
}

fn varint_len(value: u64) -> usize {
    // 1 byte per 7 bits, at least one.
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A user's bytes, empty for none (how the wire says "no user").
fn user(user: &Option<Owner>) -> &[u8] {
    user.as_ref().map_or(&[][..], Owner::as_bytes)
}
