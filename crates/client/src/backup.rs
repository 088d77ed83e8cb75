//! [`Client::backup`]: fetches a consistent copy of the lock table from the
//! leader, chunk by chunk, and checks it whole.
//!
//! The first request goes through the retry loop like any call (it follows
//! `NOT_LEADER` to the leader); the leader takes the table after a
//! ReadIndex and answers its first chunk with a backup id. The following
//! chunks are asked of that same node, which holds the encoded copy, by
//! backup id and offset; a lost answer is asked again there. The bytes are
//! the lock table's snapshot format, whose header this module checks (the
//! client does not link the state machine, which restores and checks every
//! record): magic, version, body length, and the body's CRC-32.

use std::io::Write;
use std::time::{Duration, Instant};

use fencelock_types::client_pb::{BackupRequest, BackupResponse, Request_oneof_kind, Response_oneof_kind};
use serde::Serialize;

use crate::client::{unexpected, Inner};
use crate::sansio::Outcome;
use crate::{Client, ClientError};

/// What a backup holds, as the leader said and the bytes confirm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BackupInfo {
    /// The leader's applied index the table was copied at.
    pub index: u64,
    /// The table's token counter: the last fencing token issued (0: none).
    pub last_token: u64,
    /// Locks in the table.
    pub locks: u64,
    /// The backup's length in bytes.
    pub bytes: u64,
}

/// The least time the first request gets: the leader encodes the whole
/// table before it answers (a second or two for a million locks).
const FIRST_ANSWER_MIN: Duration = Duration::from_secs(60);

/// The lock table's snapshot header (`crates/fsm/src/snapshot.rs`): magic
/// "FLKT", version (u16 LE), reserved (u16, 0), body length (u64 LE),
/// CRC-32 of the body (u32 LE), then the body.
const HEADER_LEN: usize = 20;
const MAGIC: &[u8; 4] = b"FLKT";
const VERSION: u16 = 1;

impl Client {
    /// Writes a consistent copy of the lock table, taken on the leader, to
    /// `out`: every lock acknowledged before the call started is in it, with
    /// the token counter. The bytes are what `fencelockd --restore` takes.
    /// They are checked before this returns (length, header, checksum); on
    /// an error, what was written to `out` is not a backup. A failed write
    /// to `out` ends the call with [`ClientError::Internal`] naming it.
    pub fn backup(&self, out: &mut impl Write) -> Result<BackupInfo, ClientError> {
        self.inner.backup(out)
    }
}

impl Inner {
    fn backup(&self, out: &mut impl Write) -> Result<BackupInfo, ClientError> {
        let timeout = self.request_timeout.max(FIRST_ANSWER_MIN);
        let first = BackupRequest { backup_id: 0, offset: 0, ..Default::default() };
        let (kind, _, node) =
            self.call_to(|| (Request_oneof_kind::backup(first.clone()), timeout), self.retry_for + timeout)?;
        let first = into_backup(kind)?;
        if first.backup_id == 0 {
            return Err(ClientError::Internal("a backup was answered without a backup id".to_owned()));
        }
        let mut check = Check::new(first.backup_id, first.total_bytes);
        let info = BackupInfo {
            index: first.index,
            last_token: first.last_token,
            locks: first.locks,
            bytes: first.total_bytes,
        };
        let mut next = check.take(&first)?;
        write(out, &first.chunk)?;
        while next < check.total {
            let chunk = self.chunk(&node, first.backup_id, next)?;
            next = check.take(&chunk)?;
            write(out, &chunk.chunk)?;
        }
        check.finish()?;
        out.flush().map_err(|err| ClientError::Internal(format!("cannot write the backup: {err}")))?;
        Ok(info)
    }

    /// The chunk at `offset` of backup `id`, from `node`, which holds it:
    /// asked again there while the node does not answer, within the
    /// client's retry time.
    fn chunk(&self, node: &str, id: u64, offset: u64) -> Result<BackupResponse, ClientError> {
        let deadline = Instant::now() + self.retry_for;
        let mut backoff = Duration::from_millis(20);
        loop {
            let request = BackupRequest { backup_id: id, offset, ..Default::default() };
            let reason = match self.attempt(node, Request_oneof_kind::backup(request), self.request_timeout) {
                Outcome::Done(kind) => return into_backup(kind),
                Outcome::Fail(err) => return Err(err),
                Outcome::Retry(reason) | Outcome::Redirect { reason, .. } => reason,
            };
            if Instant::now() >= deadline {
                return Err(ClientError::Unavailable(format!(
                    "backup {id} stopped at byte {offset}: {reason}"
                )));
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }
}

fn into_backup(kind: Response_oneof_kind) -> Result<BackupResponse, ClientError> {
    match kind {
        Response_oneof_kind::backup(response) => Ok(response),
        other => Err(unexpected("backup", &other)),
    }
}

fn write(out: &mut impl Write, bytes: &[u8]) -> Result<(), ClientError> {
    out.write_all(bytes).map_err(|err| ClientError::Internal(format!("cannot write the backup: {err}")))
}

/// Checks the chunks as they come: each where the last ended, of the same
/// backup, within its length; the header once it is in; the checksum of the
/// body at the end.
#[derive(Debug)]
struct Check {
    id: u64,
    total: u64,
    /// Bytes taken so far.
    taken: u64,
    header: Vec<u8>,
    /// The CRC the header declares, once read.
    declared_crc: Option<u32>,
    body: crc32fast::Hasher,
}

impl Check {
    fn new(id: u64, total: u64) -> Check {
        Check { id, total, taken: 0, header: Vec::new(), declared_crc: None, body: crc32fast::Hasher::new() }
    }

    /// Takes one chunk; returns the offset of the next.
    fn take(&mut self, chunk: &BackupResponse) -> Result<u64, ClientError> {
        let damaged =
            |what: String| Err(ClientError::Internal(format!("backup {} is damaged: {what}", self.id)));
        if chunk.backup_id != self.id || chunk.total_bytes != self.total {
            return damaged(format!(
                "a chunk of backup {} ({} bytes) came for backup {} ({} bytes)",
                chunk.backup_id, chunk.total_bytes, self.id, self.total
            ));
        }
        let len = chunk.chunk.len() as u64;
        if chunk.offset != self.taken || len == 0 || self.taken + len > self.total {
            return damaged(format!(
                "a chunk of {len} bytes at offset {} came where byte {} of {} was due",
                chunk.offset, self.taken, self.total
            ));
        }
        let mut bytes = chunk.chunk.as_slice();
        if self.header.len() < HEADER_LEN {
            let wanted = (HEADER_LEN - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..wanted]);
            bytes = &bytes[wanted..];
            if self.header.len() == HEADER_LEN {
                self.declared_crc = Some(read_header(&self.header, self.total).map_err(|what| {
                    ClientError::Internal(format!("backup {} is not a lock-table backup: {what}", self.id))
                })?);
            }
        }
        self.body.update(bytes);
        self.taken += len;
        Ok(self.taken)
    }

    fn finish(self) -> Result<(), ClientError> {
        let Some(declared) = self.declared_crc else {
            return Err(ClientError::Internal(format!(
                "backup {} is {} bytes, shorter than a header",
                self.id, self.total
            )));
        };
        if self.body.finalize() != declared {
            return Err(ClientError::Internal(format!("backup {} is damaged: checksum mismatch", self.id)));
        }
        Ok(())
    }
}

/// Checks the header of a backup of `total` bytes; returns the body's CRC.
fn read_header(header: &[u8], total: u64) -> Result<u32, String> {
    let u16_at = |at: usize| u16::from_le_bytes([header[at], header[at + 1]]);
    if &header[..4] != MAGIC {
        return Err("bad magic".to_owned());
    }
    if u16_at(4) != VERSION {
        return Err(format!("format version {} is not {VERSION}", u16_at(4)));
    }
    if u16_at(6) != 0 {
        return Err("reserved header bits are set".to_owned());
    }
    let mut len = [0; 8];
    len.copy_from_slice(&header[8..16]);
    let body_len = u64::from_le_bytes(len);
    if body_len != total - HEADER_LEN as u64 {
        return Err(format!(
            "the header says a body of {body_len} bytes, the backup has {}",
            total - HEADER_LEN as u64
        ));
    }
    Ok(u32::from_le_bytes([header[16], header[17], header[18], header[19]]))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A backup in the snapshot format, around `body`.
    fn backup(body: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::from(*MAGIC);
        bytes.extend(VERSION.to_le_bytes());
        bytes.extend([0, 0]);
        bytes.extend((body.len() as u64).to_le_bytes());
        bytes.extend(crc32fast::hash(body).to_le_bytes());
        bytes.extend(body);
        bytes
    }

    fn chunks(id: u64, bytes: &[u8], size: usize) -> Vec<BackupResponse> {
        let mut offset = 0;
        bytes
            .chunks(size)
            .map(|chunk| {
                let response = BackupResponse {
                    backup_id: id,
                    total_bytes: bytes.len() as u64,
                    offset,
                    chunk: chunk.to_vec(),
                    ..Default::default()
                };
                offset += chunk.len() as u64;
                response
            })
            .collect()
    }

    fn check_all(bytes: &[u8], size: usize) -> Result<(), ClientError> {
        let mut check = Check::new(4, bytes.len() as u64);
        for chunk in chunks(4, bytes, size) {
            check.take(&chunk)?;
        }
        check.finish()
    }

    #[test]
    fn a_whole_backup_passes_in_chunks_of_any_size() {
        let bytes = backup(b"some protobuf body, any bytes will do");
        for size in [1, 7, 19, 20, 21, bytes.len()] {
            check_all(&bytes, size).unwrap();
        }
        check_all(&backup(b""), 3).unwrap();
    }

    #[test]
    fn damage_anywhere_is_found() {
        let bytes = backup(b"the body of a backup");
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x01;
            assert!(check_all(&damaged, 5).is_err(), "a flipped bit at byte {at} passed");
        }
        // Too short for a header.
        assert!(check_all(&bytes[..10], 4).is_err());
    }

    #[test]
    fn chunks_out_of_place_are_refused() {
        let bytes = backup(b"0123456789");
        let all = chunks(4, &bytes, 8);
        // A gap, a repeat, another backup's chunk, an empty chunk.
        let mut check = Check::new(4, bytes.len() as u64);
        assert!(check.take(&all[1]).is_err());
        let mut check = Check::new(4, bytes.len() as u64);
        check.take(&all[0]).unwrap();
        assert!(check.take(&all[0]).is_err());
        let mut check = Check::new(5, bytes.len() as u64);
        assert!(check.take(&all[0]).is_err());
        let mut check = Check::new(4, bytes.len() as u64);
        let empty = BackupResponse { chunk: Vec::new(), ..all[0].clone() };
        assert!(check.take(&empty).is_err());
        // A chunk past the announced end.
        let mut check = Check::new(4, 8);
        let long = BackupResponse { total_bytes: 8, chunk: vec![0; 9], ..all[0].clone() };
        assert!(check.take(&long).is_err());
    }
}
