//! One connection's bytes on a non-blocking socket: plain TCP, or TLS
//! through a rustls session that the event loop drives (the pattern of
//! rustls's `tlsserver-mio` example). Callers see plaintext either way.
//!
//! Reading feeds what the socket has to the session and drains the
//! plaintext it yields; handshake records that need an answer are answered
//! at once. Writing hands plaintext to the session (up to its buffer
//! limit) and writes out the records it makes; records the socket could
//! not take wait in the session for the next flush, which the loop makes
//! on every writable event.

use std::io::{self, Read, Write};
use std::sync::Arc;

use mio::net::TcpStream;

/// What one read found.
#[derive(Debug, PartialEq, Eq)]
pub enum Got {
    /// This many bytes came off the socket (perhaps no plaintext yet).
    Bytes(usize),
    /// The socket has nothing now.
    Nothing,
    /// The other side closed the connection.
    Closed,
}

/// A connection's socket and, with TLS, its session.
#[derive(Debug)]
pub struct Wire {
    stream: TcpStream,
    tls: Option<Box<rustls::Connection>>,
    /// The other side sent its TLS close notice: the next read says so.
    closed: bool,
}

impl Wire {
    pub fn plain(stream: TcpStream) -> Wire {
        Wire { stream, tls: None, closed: false }
    }

    /// The server side of a TLS connection just accepted.
    pub fn tls_server(stream: TcpStream, config: &Arc<rustls::ServerConfig>) -> io::Result<Wire> {
        let session = rustls::ServerConnection::new(Arc::clone(config)).map_err(io::Error::other)?;
        Ok(Wire { stream, tls: Some(Box::new(session.into())), closed: false })
    }

    /// The client side of a TLS connection being opened to `name`.
    pub fn tls_client(
        stream: TcpStream,
        config: &Arc<rustls::ClientConfig>,
        name: rustls::pki_types::ServerName<'static>,
    ) -> io::Result<Wire> {
        let session = rustls::ClientConnection::new(Arc::clone(config), name).map_err(io::Error::other)?;
        Ok(Wire { stream, tls: Some(Box::new(session.into())), closed: false })
    }

    pub fn stream(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// Whether this is a TLS connection whose handshake is not done.
    pub fn is_handshaking(&self) -> bool {
        self.tls.as_ref().is_some_and(|session| session.is_handshaking())
    }

    /// Who the other side's certificate names, once its handshake is done
    /// (`None` on plain TCP or before then).
    pub fn peer_identity(&self) -> Option<fencelock_tls::Identity> {
        fencelock_tls::peer_identity(self.tls.as_ref()?)
    }

    /// When the other side's certificate stops being valid, once its
    /// handshake is done, as a moment of the monotonic clock (`None` on
    /// plain TCP or before then). Connections are closed then.
    pub fn peer_expiry(&self) -> Option<std::time::Instant> {
        let certificate = self.tls.as_ref()?.peer_certificates()?.first()?;
        let not_after = fencelock_tls::not_after_of(certificate)?;
        let left = not_after.duration_since(std::time::SystemTime::now()).unwrap_or_default();
        std::time::Instant::now().checked_add(left)
    }

    /// Reads once from the socket into `scratch`, appending the plaintext
    /// to `input`. An `Err` is the end of the connection: a socket failure,
    /// or a TLS failure (its alert is sent first, if the socket takes it).
    pub fn read(&mut self, scratch: &mut [u8], input: &mut Vec<u8>) -> io::Result<Got> {
        if self.closed {
            return Ok(Got::Closed);
        }
        let n = match self.stream.read(scratch) {
            Ok(0) => return Ok(Got::Closed),
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(Got::Nothing),
            Err(err) => return Err(err),
        };
        let Some(session) = self.tls.as_mut() else {
            input.extend_from_slice(&scratch[..n]);
            return Ok(Got::Bytes(n));
        };
        let mut fed = 0;
        let had = input.len();
        while fed < n {
            let taken = session.read_tls(&mut &scratch[fed..n])?;
            if taken == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "TLS: the session takes no more input",
                ));
            }
            fed += taken;
            if let Err(err) = session.process_new_packets() {
                // Tell the other side why, if the socket takes it.
                let _ = session.write_tls(&mut self.stream);
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {err}")));
            }
            self.closed |= drain_plaintext(session, input)?;
        }
        // Handshake answers, alerts and tickets go out now.
        self.flush()?;
        // What came before a close notice is handed on first, as plain
        // TCP's last bytes come before its end of stream.
        Ok(if self.closed && input.len() == had { Got::Closed } else { Got::Bytes(n) })
    }

    /// Takes what it can of `bytes`: on plain TCP what the socket takes, on
    /// TLS what the session takes (then written out as far as the socket
    /// goes). `WouldBlock` when it took nothing.
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if self.tls.is_none() {
            return self.stream.write(bytes);
        }
        self.flush()?;
        let taken = match self.tls.as_mut() {
            Some(session) => session.writer().write(bytes)?,
            None => 0,
        };
        self.flush()?;
        if taken == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(taken)
    }

    /// Writes out the session's records until done or the socket is full.
    pub fn flush(&mut self) -> io::Result<()> {
        let Some(session) = self.tls.as_mut() else { return Ok(()) };
        while session.wants_write() {
            match session.write_tls(&mut self.stream) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Ends the connection: a TLS close notice if the socket takes it, then
    /// the socket.
    pub fn shutdown(&mut self) {
        if let Some(session) = self.tls.as_mut() {
            session.send_close_notify();
            let _ = session.write_tls(&mut self.stream);
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// Moves the session's plaintext into `input`; true when the other side
/// sent its close notice.
fn drain_plaintext(session: &mut rustls::Connection, input: &mut Vec<u8>) -> io::Result<bool> {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match session.reader().read(&mut chunk) {
            Ok(0) => return Ok(true),
            Ok(n) => input.extend_from_slice(&chunk[..n]),
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(err) => return Err(err),
        }
    }
}

/// A TLS configuration that can be replaced while connections run (a
/// certificate reload): each new connection takes the one current when it
/// opens, and connections already open keep theirs.
#[derive(Debug)]
pub struct Reloadable<T>(Arc<std::sync::RwLock<Arc<T>>>);

impl<T> Clone for Reloadable<T> {
    fn clone(&self) -> Reloadable<T> {
        Reloadable(Arc::clone(&self.0))
    }
}

impl<T> Reloadable<T> {
    pub fn new(config: Arc<T>) -> Reloadable<T> {
        Reloadable(Arc::new(std::sync::RwLock::new(config)))
    }

    /// The configuration new connections take now.
    pub fn current(&self) -> Arc<T> {
        // Every write is a plain replacement: a poisoned lock holds a whole
        // configuration.
        Arc::clone(&self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Replaces it for the connections opened from now on.
    pub fn replace(&self, config: Arc<T>) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = config;
    }
}

impl<T> From<Arc<T>> for Reloadable<T> {
    fn from(config: Arc<T>) -> Reloadable<T> {
        Reloadable::new(config)
    }
}
