//! What comes back on a connection: whole `Response` frames, read out of the
//! bytes received so far, each a response to deliver, a refusal of the
//! whole connection, or a broken stream.

use fencelock_net::frame::decode_frame;
use fencelock_types::client_pb::{ErrorCode, Response};

/// The largest response frame accepted. A list of many long keys is the
/// largest answer a server gives; anything bigger is a broken stream.
pub const FRAME_BYTES_MAX: usize = 16 << 20;

/// One thing read off a connection.
#[derive(Debug)]
pub enum Inbound {
    /// A response, for the caller waiting on its id.
    Response(Box<Response>),
    /// The server refused the whole connection (id 0: too many
    /// connections, a frame too large). Every caller on it gets `response`,
    /// so that each can act on its code; `reason` says it in words. The
    /// connection is done.
    Refused { reason: String, response: Box<Response> },
    /// The stream cannot be read on: the reason says why. The connection is
    /// done.
    Broken(String),
}

/// The next whole frame at the start of `input`, and how many bytes it
/// took; `None` until a whole frame has come.
pub fn next(input: &[u8]) -> Option<(Inbound, usize)> {
    let (response, used) = match decode_frame::<Response>(input, FRAME_BYTES_MAX) {
        Ok(Some(frame)) => frame,
        Ok(None) => return None,
        Err(err) => {
            let reason = if looks_like_tls(input) {
                "the server speaks TLS: connect with certificates (--certs-dir and --user, or \
                 ClientConfig::tls)"
                    .to_owned()
            } else {
                err.to_string()
            };
            return Some((Inbound::Broken(reason), input.len()));
        }
    };
    if response.id != 0 {
        return Some((Inbound::Response(Box::new(response)), used));
    }
    let refusal = response.error.as_ref().filter(|error| error.code != ErrorCode::OK).cloned();
    let inbound = match refusal {
        Some(error) => Inbound::Refused {
            reason: format!("connection refused by the server: {}", error.message),
            response: Box::new(response),
        },
        None => Inbound::Broken("the server sent a response with id 0 and no error".to_owned()),
    };
    Some((inbound, used))
}

/// Whether `bytes` start like a TLS record (an alert or a handshake, TLS
/// 1.x), which a plain client reads as an absurd frame length.
fn looks_like_tls(bytes: &[u8]) -> bool {
    matches!(bytes, [0x15 | 0x16, 0x03, 0x00..=0x04, ..])
}

#[cfg(test)]
mod tests {
    use fencelock_net::frame::encode_frame;
    use fencelock_types::client_pb::Error;

    use super::*;

    #[test]
    fn frames_are_read_whole_and_in_order() {
        let mut bytes = Vec::new();
        encode_frame(&Response { id: 4, ..Default::default() }, &mut bytes);
        encode_frame(&Response { id: 5, ..Default::default() }, &mut bytes);
        let mut at = 0;
        let mut ids = Vec::new();
        while let Some((Inbound::Response(response), used)) = next(&bytes[at..]) {
            ids.push(response.id);
            at += used;
        }
        assert_eq!((ids, at), (vec![4, 5], bytes.len()));
        // Part of a frame: wait for the rest.
        let first = next(&bytes).map_or(0, |(_, used)| used);
        assert!(next(&bytes[first..bytes.len() - 1]).is_none());
        assert!(next(&bytes[..3]).is_none());
    }

    #[test]
    fn refusals_tls_and_nonsense_end_the_connection_with_a_reason() {
        let mut bytes = Vec::new();
        let error =
            Error { code: ErrorCode::RESOURCE_EXHAUSTED, message: "too many".into(), ..Default::default() };
        encode_frame(&Response { id: 0, error: Some(error).into(), ..Default::default() }, &mut bytes);
        assert!(
            matches!(next(&bytes), Some((Inbound::Refused { reason, .. }, _)) if reason.ends_with("too many"))
        );
        let alert = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28];
        assert!(matches!(next(&alert), Some((Inbound::Broken(reason), _)) if reason.contains("speaks TLS")));
        let absurd = [0x7f, 0xff, 0xff, 0xff, 0];
        assert!(matches!(next(&absurd), Some((Inbound::Broken(_), _))));
        let mut empty_id_zero = Vec::new();
        encode_frame(&Response::default(), &mut empty_id_zero);
        assert!(matches!(next(&empty_id_zero), Some((Inbound::Broken(_), _))));
    }
}
