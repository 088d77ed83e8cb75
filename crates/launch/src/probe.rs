//! Asking nodes how they are: one `status` request over the raw client
//! protocol (a frame out, a frame back, on a connection of its own), and
//! waiting, by polling with a deadline, until there is a leader.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock_net::{read_frame, write_frame};
use fencelock_types::client_pb::{
    ErrorCode, Request, Request_oneof_kind, Response, Response_oneof_kind, StatusRequest, StatusResponse,
};

use crate::LaunchError;

/// How long one `status` may take: connecting, asking and reading the
/// answer. A paused or starting node must not hold a wait for long.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// How often a wait asks again.
const POLL: Duration = Duration::from_millis(50);

/// The largest status response read; a real one is a few hundred bytes.
const RESPONSE_BYTES_MAX: usize = 1 << 20;

/// Node `addr`'s status, asked on a new connection within `timeout`.
pub fn status(addr: SocketAddr, timeout: Duration) -> Result<StatusResponse, LaunchError> {
    status_over(addr, timeout, None)
}

/// Like [`status`], over TLS when `tls` is given (a user's configuration,
/// the node's certificate naming `addr`'s IP).
pub fn status_over(
    addr: SocketAddr,
    timeout: Duration,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<StatusResponse, LaunchError> {
    let failed = |reason: String| LaunchError::Status { addr, reason };
    let stream = TcpStream::connect_timeout(&addr, timeout).map_err(|err| failed(err.to_string()))?;
    stream.set_read_timeout(Some(timeout)).map_err(|err| failed(err.to_string()))?;
    stream.set_write_timeout(Some(timeout)).map_err(|err| failed(err.to_string()))?;
    let request = Request {
        id: 1,
        kind: Some(Request_oneof_kind::status(StatusRequest::default())),
        ..Default::default()
    };
    let response: Response = match tls {
        None => {
            let mut stream = stream;
            write_frame(&mut stream, &request).map_err(|err| failed(err.to_string()))?;
            read_frame(&mut stream, RESPONSE_BYTES_MAX).map_err(|err| failed(err.to_string()))?
        }
        Some(config) => {
            let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
            let session = rustls::ClientConnection::new(Arc::clone(config), name)
                .map_err(|err| failed(err.to_string()))?;
            let mut stream = rustls::StreamOwned::new(session, stream);
            write_frame(&mut stream, &request).map_err(|err| failed(err.to_string()))?;
            read_frame(&mut stream, RESPONSE_BYTES_MAX).map_err(|err| failed(err.to_string()))?
        }
    };
    if let Some(error) = response.error.as_ref().filter(|error| error.code != ErrorCode::OK) {
        return Err(failed(format!("{:?}: {}", error.code, error.message)));
    }
    match response.kind {
        Some(Response_oneof_kind::status(status)) => Ok(status),
        other => Err(failed(format!("answered {other:?}"))),
    }
}

/// The leader that every node of `addrs` names, once all answer and agree.
pub fn agreed_leader(addrs: &[SocketAddr]) -> Option<u64> {
    agreed_leader_over(addrs, None)
}

/// Like [`agreed_leader`], over TLS when `tls` is given.
pub fn agreed_leader_over(addrs: &[SocketAddr], tls: Option<&Arc<rustls::ClientConfig>>) -> Option<u64> {
    let mut leaders =
        addrs.iter().map(|addr| status_over(*addr, STATUS_TIMEOUT, tls).map(|status| status.leader_id));
    let first = leaders.next()?.ok()?;
    let agreed = leaders.all(|leader| leader.is_ok_and(|leader| leader == first));
    (first != 0 && agreed).then_some(first)
}

/// Waits up to `within` until every node of `addrs` answers `status` and
/// all name the same leader.
pub fn wait_for_leader(addrs: &[SocketAddr], within: Duration) -> Result<u64, LaunchError> {
    poll_until(within, LaunchError::NoLeader { within }, || Ok(agreed_leader(addrs)))
}

/// Calls `check` until it gives a value or an error, or until `within` has
/// passed, which gives `timed_out`.
pub(crate) fn poll_until<T>(
    within: Duration,
    timed_out: LaunchError,
    mut check: impl FnMut() -> Result<Option<T>, LaunchError>,
) -> Result<T, LaunchError> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check()? {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(timed_out);
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn a_closed_port_is_an_error_and_no_leader_times_out() {
        let addr = TcpListener::bind("127.0.0.1:0").and_then(|listener| listener.local_addr()).unwrap();
        assert!(matches!(status(addr, STATUS_TIMEOUT), Err(LaunchError::Status { .. })));
        assert_eq!(agreed_leader(&[]), None);
        let err = wait_for_leader(&[addr], Duration::from_millis(120)).unwrap_err();
        assert!(matches!(err, LaunchError::NoLeader { .. }), "{err}");
    }

    #[test]
    fn a_status_answer_is_read_and_an_error_answer_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            for answer in [ErrorCode::OK, ErrorCode::UNAVAILABLE] {
                let (mut stream, _) = listener.accept().unwrap();
                let request: Request = read_frame(&mut stream, RESPONSE_BYTES_MAX).unwrap();
                assert!(matches!(request.kind, Some(Request_oneof_kind::status(_))));
                let mut response = Response { id: request.id, ..Default::default() };
                if answer == ErrorCode::OK {
                    let status = StatusResponse { node_id: 2, leader_id: 3, ..Default::default() };
                    response.kind = Some(Response_oneof_kind::status(status));
                } else {
                    response.mut_error().code = answer;
                }
                write_frame(&mut stream, &response).unwrap();
            }
        });
        assert_eq!(status(addr, STATUS_TIMEOUT).unwrap().leader_id, 3);
        let err = status(addr, STATUS_TIMEOUT).unwrap_err().to_string();
        assert!(err.contains("UNAVAILABLE"), "{err}");
        server.join().unwrap();
    }
}
