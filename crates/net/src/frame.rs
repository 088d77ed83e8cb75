//! Frames: a 4-byte big-endian length, then that many bytes of one protobuf
//! message. Readers refuse a length over their limit before allocating.

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
