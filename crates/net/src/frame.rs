//! Frames: a 4-byte big-endian length, then that many bytes of one protobuf
//! message. Readers refuse a length over their limit before allocating.
//!
//! A message too large for one frame (a snapshot, between peers) travels
//! as parts: frames whose length has [`PART_FLAG`] set carry its first
//! bytes, and the first frame after them without the flag carries the rest
//! ([`encode_parts`], [`decode_piece`]). Each frame stays under the
//! reader's frame limit; the whole message has a limit of its own.

use std::io::{self, Read, Write};

use protobuf::Message;

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection between frames.
    #[error("connection closed")]
    Closed,
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("frame of {len} bytes is over the {max}-byte limit")]
    TooLarge { len: usize, max: usize },
    #[error("frame does not decode: {0}")]
    Decode(#[from] protobuf::ProtobufError),
}

/// Appends `message` as one frame to `buffer`, so that many frames go out
/// in one write.
pub fn encode_frame(message: &impl Message, buffer: &mut Vec<u8>) {
    let start = buffer.len();
    buffer.extend_from_slice(&[0; 4]);
    message.write_to_vec(buffer).expect("encoding a protobuf message into a Vec cannot fail");
    let len = (buffer.len() - start - 4) as u32;
    buffer[start..start + 4].copy_from_slice(&len.to_be_bytes());
}

/// Set in a frame's length: the frame is one part of a message, whose
/// following frames, up to and including the first without the flag, hold
/// the rest. Lengths never reach it otherwise (frame limits are far below).
pub const PART_FLAG: u32 = 1 << 31;

/// Appends `message` to `buffer` as one frame, or, if its encoding is over
/// `part_max` bytes, as parts of at most `part_max` bytes each.
pub fn encode_parts(message: &impl Message, buffer: &mut Vec<u8>, part_max: usize) {
    let body = message.write_to_bytes().expect("encoding a protobuf message into a Vec cannot fail");
    let part_max = part_max.clamp(1, (PART_FLAG - 1) as usize);
    let mut parts = body.chunks(part_max).peekable();
    if parts.peek().is_none() {
        buffer.extend_from_slice(&0u32.to_be_bytes());
        return;
    }
    while let Some(part) = parts.next() {
        let len = part.len() as u32;
        let header = if parts.peek().is_some() { len | PART_FLAG } else { len };
        buffer.extend_from_slice(&header.to_be_bytes());
        buffer.extend_from_slice(part);
    }
}

/// One frame of a message that may come in parts (see [`decode_piece`]).
#[derive(Debug)]
pub struct Piece<'a> {
    /// A part that more follow ([`PART_FLAG`]).
    pub more: bool,
    pub body: &'a [u8],
    /// The bytes it took, header included.
    pub used: usize,
}

/// The frame at the start of `input`, once it is whole. `None` while
/// bytes are missing; a length over `max` is refused before its body
/// arrives.
pub fn decode_piece(input: &[u8], max: usize) -> Result<Option<Piece<'_>>, FrameError> {
    let Some(header) = input.get(..4) else { return Ok(None) };
    let raw = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let more = raw & PART_FLAG != 0;
    let len = (raw & !PART_FLAG) as usize;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    let Some(body) = input.get(4..4 + len) else { return Ok(None) };
    Ok(Some(Piece { more, body, used: 4 + len }))
}

/// Writes `message` as one frame.
pub fn write_frame(writer: &mut impl Write, message: &impl Message) -> io::Result<()> {
    let mut buffer = Vec::new();
    encode_frame(message, &mut buffer);
    writer.write_all(&buffer)
}

/// Decodes the frame at the start of `input` once it is whole: the message
/// and how many bytes it took, or `None` while bytes are missing. A length
/// over `max` is refused before its body arrives. For readers that keep
/// their own buffer (event loops, a read that may time out mid-frame).
pub fn decode_frame<M: Message>(input: &[u8], max: usize) -> Result<Option<(M, usize)>, FrameError> {
    let Some(header) = input.get(..4) else { return Ok(None) };
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    let Some(body) = input.get(4..4 + len) else { return Ok(None) };
    Ok(Some((M::parse_from_bytes(body)?, 4 + len)))
}

/// Reads one frame of at most `max` bytes and decodes it.
pub fn read_frame<M: Message>(reader: &mut impl Read, max: usize) -> Result<M, FrameError> {
    let mut header = [0u8; 4];
    match reader.read_exact(&mut header) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(err) => return Err(err.into()),
    }
    let len = u32::from_be_bytes(header) as usize;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    // Grow the buffer as bytes arrive, so that a frame that only claims to
    // be large costs nothing until its bytes come.
    let mut body = Vec::with_capacity(len.min(64 * 1024));
    reader.take(len as u64).read_to_end(&mut body)?;
    if body.len() < len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed inside a frame").into());
    }
    Ok(M::parse_from_bytes(&body)?)
}

#[cfg(test)]
mod tests {
    use fencelock_types::client_pb::{PeerHello, Request};

    use super::*;

    #[test]
    fn frames_round_trip_back_to_back() {
        let mut buffer = Vec::new();
        for id in 1..=3 {
            encode_frame(
                &PeerHello { node_id: id, client_addr: format!("h{id}"), ..Default::default() },
                &mut buffer,
            );
        }
        let mut reader = buffer.as_slice();
        for id in 1..=3 {
            let hello: PeerHello = read_frame(&mut reader, 1024).unwrap();
            assert_eq!(hello.node_id, id);
        }
        assert!(matches!(read_frame::<PeerHello>(&mut reader, 1024), Err(FrameError::Closed)));
    }

    #[test]
    fn a_message_in_parts_reads_back_whole_and_each_part_stays_under_the_limit() {
        let hello = PeerHello { node_id: 9, client_addr: "x".repeat(10_000), ..Default::default() };
        for part_max in [1, 7, 999, 10_000, 1 << 20] {
            let mut buffer = Vec::new();
            encode_parts(&hello, &mut buffer, part_max);
            let mut body = Vec::new();
            let mut at = 0;
            let mut frames = 0;
            loop {
                let piece = decode_piece(&buffer[at..], part_max).unwrap().unwrap();
                assert!(piece.body.len() <= part_max);
                body.extend_from_slice(piece.body);
                at += piece.used;
                frames += 1;
                if !piece.more {
                    break;
                }
            }
            assert_eq!(at, buffer.len(), "part_max {part_max}");
            assert_eq!(PeerHello::parse_from_bytes(&body).unwrap(), hello);
            assert_eq!(frames, hello.compute_size().div_ceil(part_max as u32) as usize);
        }
        // A message that fits is one plain frame, as encode_frame writes it.
        let mut parts = Vec::new();
        encode_parts(&hello, &mut parts, 1 << 20);
        let mut plain = Vec::new();
        encode_frame(&hello, &mut plain);
        assert_eq!(parts, plain);
        // An empty message too.
        let mut empty = Vec::new();
        encode_parts(&PeerHello::default(), &mut empty, 8);
        assert_eq!(empty, [0, 0, 0, 0]);
    }

    #[test]
    fn an_oversized_length_is_refused_before_allocating() {
        let bytes = [0xff, 0xff, 0xff, 0xff, 1, 2, 3];
        assert!(matches!(
            read_frame::<Request>(&mut bytes.as_slice(), 1 << 20),
            Err(FrameError::TooLarge { len: 0xffff_ffff, .. })
        ));
    }

    #[test]
    fn buffered_frames_decode_once_whole_and_oversized_ones_are_refused() {
        let mut buffer = Vec::new();
        encode_frame(&PeerHello { node_id: 7, ..Default::default() }, &mut buffer);
        let whole = buffer.len();
        encode_frame(&PeerHello { node_id: 8, ..Default::default() }, &mut buffer);
        for cut in 0..whole {
            assert!(decode_frame::<PeerHello>(&buffer[..cut], 1024).unwrap().is_none(), "cut at {cut}");
        }
        let (first, used) = decode_frame::<PeerHello>(&buffer, 1024).unwrap().unwrap();
        assert_eq!((first.node_id, used), (7, whole));
        let (second, _) = decode_frame::<PeerHello>(&buffer[used..], 1024).unwrap().unwrap();
        assert_eq!(second.node_id, 8);
        assert!(matches!(
            decode_frame::<PeerHello>(&[0, 0, 4, 1], 1024),
            Err(FrameError::TooLarge { len: 1025, max: 1024 })
        ));
        assert!(matches!(decode_frame::<Request>(&[0, 0, 0, 1, 0xff], 1024), Err(FrameError::Decode(_))));
    }

    #[test]
    fn garbage_and_truncation_are_errors() {
        let garbage = [0, 0, 0, 3, 0xff, 0xff, 0xff];
        assert!(matches!(read_frame::<Request>(&mut garbage.as_slice(), 1024), Err(FrameError::Decode(_))));
        let truncated = [0, 0, 0, 9, 1, 2];
        assert!(matches!(read_frame::<Request>(&mut truncated.as_slice(), 1024), Err(FrameError::Io(_))));
    }
}
