//! One pipelined connection to one node, on tokio.
//!
//! Many requests are in flight at once, each under a fresh id. Writes go
//! through an async mutex; one reader task per connection reads frames
//! ([`inbound::next`] of the core decides what they are) and hands each
//! response to the caller waiting on its id. When the connection fails
//! (I/O error, end of stream, a frame that does not decode, a refusal of
//! the whole connection) every waiting caller is told at once and the
//! connection is closed for good: the client opens a new one on next use.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use fencelock_client::sansio::inbound::{self, Inbound};
use fencelock_net::frame::encode_frame;
use fencelock_types::client_pb::{Request, Response};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Why a call on one connection got no response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CallError {
    /// The connection failed or was closed; the reason says how.
    Closed(String),
    /// No response within the attempt's timeout. The connection stays up.
    TimedOut,
}

/// What a waiting caller receives: its response, or why the connection died.
type Delivery = Result<Box<Response>, String>;

#[derive(Debug, Default)]
struct Pending {
    waiting: HashMap<u64, oneshot::Sender<Delivery>>,
    /// Set once the connection failed; no caller is registered after that.
    closed: Option<String>,
}

type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// A connection to one node, shared by every caller using that node.
pub(crate) struct Connection {
    writer: tokio::sync::Mutex<Writer>,
    pending: Arc<Mutex<Pending>>,
    next_id: AtomicU64,
    reader: JoinHandle<()>,
    /// The node id the server's certificate names (TLS only).
    node: Option<u64>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("closed", &self.closed_reason()).finish_non_exhaustive()
    }
}

fn lock(pending: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    // Each update is complete under the lock (a map and a flag).
    pending.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Connection {
    /// Connects to `addr` (`host:port`, resolved now) within `timeout`, with
    /// a TLS handshake when `tls` is given.
    pub(crate) async fn open(
        addr: &str,
        timeout: Duration,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> Result<Arc<Connection>, String> {
        let opened = tokio::time::timeout(timeout, async {
            let stream = TcpStream::connect(addr).await.map_err(|err| format!("cannot connect: {err}"))?;
            // Requests are small and latency-bound.
            stream.set_nodelay(true).map_err(|err| format!("cannot set TCP_NODELAY: {err}"))?;
            match tls {
                None => {
                    let (read, write) = tokio::io::split(stream);
                    Ok::<_, String>((Box::new(read) as Reader, Box::new(write) as Writer, None))
                }
                Some(config) => {
                    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
                    let host = host.trim_start_matches('[').trim_end_matches(']');
                    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                        .map_err(|err| format!("`{host}` cannot name a TLS server: {err}"))?;
                    let stream = tokio_rustls::TlsConnector::from(Arc::clone(config))
                        .connect(name, stream)
                        .await
                        .map_err(|err| format!("TLS handshake failed: {err}"))?;
                    let node = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|chain| chain.first())
                        .and_then(|der| fencelock_client::sansio::retry::node_named(der));
                    let (read, write) = tokio::io::split(stream);
                    Ok((Box::new(read) as Reader, Box::new(write) as Writer, node))
                }
            }
        })
        .await;
        let (read, write, node) = match opened {
            Ok(halves) => halves?,
            Err(_) => return Err("connect timed out".to_owned()),
        };
        let pending = Arc::new(Mutex::new(Pending::default()));
        let reader = tokio::spawn(read_loop(read, Arc::clone(&pending)));
        Ok(Arc::new(Connection {
            writer: tokio::sync::Mutex::new(write),
            pending,
            next_id: AtomicU64::new(1),
            reader,
            node,
        }))
    }

    /// The node id the server's certificate names (TLS), `None` on plain
    /// connections.
    pub(crate) fn node(&self) -> Option<u64> {
        self.node
    }

    fn closed_reason(&self) -> Option<String> {
        lock(&self.pending).closed.clone()
    }

    /// Sends `request` under a fresh id and waits up to `timeout` for its
    /// response.
    pub(crate) async fn call(&self, mut request: Request, timeout: Duration) -> Result<Response, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        request.id = id;
        let (sender, receiver) = oneshot::channel();
        {
            let mut pending = lock(&self.pending);
            if let Some(reason) = &pending.closed {
                return Err(CallError::Closed(reason.clone()));
            }
            pending.waiting.insert(id, sender);
        }
        let mut frame = Vec::new();
        encode_frame(&request, &mut frame);
        let deadline = tokio::time::Instant::now() + timeout;
        // A write cut short would leave part of a frame on the stream, and
        // every later frame unreadable: one that does not finish in time
        // closes the connection instead.
        let written = tokio::time::timeout_at(deadline, async {
            let mut writer = self.writer.lock().await;
            writer.write_all(&frame).await
        })
        .await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                let reason = format!("write failed: {err}");
                fail(&self.pending, &reason);
                return Err(CallError::Closed(reason));
            }
            Err(_) => {
                let reason = "a write did not finish in time (the node does not read)".to_owned();
                fail(&self.pending, &reason);
                return Err(CallError::Closed(reason));
            }
        }
        match tokio::time::timeout_at(deadline, receiver).await {
            Ok(Ok(Ok(response))) => Ok(*response),
            Ok(Ok(Err(reason))) => Err(CallError::Closed(reason)),
            Ok(Err(_)) => Err(CallError::Closed("the connection's reader ended".to_owned())),
            Err(_) => {
                // The answer may still come; it is then dropped.
                lock(&self.pending).waiting.remove(&id);
                Err(CallError::TimedOut)
            }
        }
    }
}

impl fencelock_client::sansio::pool::Pooled for Connection {
    /// True once the connection failed; it is then replaced on next use.
    fn is_closed(&self) -> bool {
        self.closed_reason().is_some()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

type Reader = Box<dyn AsyncRead + Send + Unpin>;

/// Reads frames until the connection fails, delivering each response.
async fn read_loop(mut read: Reader, pending: Arc<Mutex<Pending>>) {
    let mut input = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match read.read(&mut chunk).await {
            Ok(0) => return fail(&pending, "connection closed by the server"),
            Ok(n) => n,
            Err(err) => return fail(&pending, &format!("read failed: {err}")),
        };
        input.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        while let Some((inbound, used)) = inbound::next(&input[at..]) {
            at += used;
            match inbound {
                Inbound::Response(response) => {
                    let waiter = lock(&pending).waiting.remove(&response.id);
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(Ok(response));
                    }
                }
                Inbound::Refused { reason, response } => {
                    let waiters = close(&pending, &reason);
                    for waiter in waiters {
                        let _ = waiter.send(Ok(response.clone()));
                    }
                    return;
                }
                Inbound::Broken(reason) => return fail(&pending, &reason),
            }
        }
        input.drain(..at);
    }
}

/// Closes the connection's books and returns who was waiting.
fn close(pending: &Mutex<Pending>, reason: &str) -> Vec<oneshot::Sender<Delivery>> {
    let mut pending = lock(pending);
    if pending.closed.is_none() {
        pending.closed = Some(reason.to_owned());
    }
    pending.waiting.drain().map(|(_, waiter)| waiter).collect()
}

/// Fails every caller waiting on the connection with `reason`.
fn fail(pending: &Mutex<Pending>, reason: &str) {
    for waiter in close(pending, reason) {
        let _ = waiter.send(Err(reason.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use fencelock_client::{ClientConfig, ClientError};

    use crate::AsyncClient;

    /// A node that accepts and never reads: a large request fills the
    /// socket buffers, and the write that cannot finish closes the
    /// connection within the call's time instead of hanging it.
    #[tokio::test]
    async fn a_node_that_never_reads_costs_a_call_its_timeout_not_a_hang() {
        // Connections complete in the listener's backlog and are never read.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
        let addr = listener.local_addr().expect("an address");
        let mut config = ClientConfig::new([addr.to_string()]);
        config.request_timeout = Duration::from_millis(300);
        config.retry_for = Duration::from_millis(900);
        let client = AsyncClient::connect(config).expect("a client");
        let started = Instant::now();
        let huge = vec![b'k'; 32 << 20];
        let answer = client.get(&huge, true).await;
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        match answer {
            Err(ClientError::Unavailable(reason)) => {
                assert!(reason.contains("did not finish in time"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        drop(listener);
    }
}
